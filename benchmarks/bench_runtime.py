"""Benchmark: the runtime's speed on the digits network.

* ModelDevice samples/s through NetworkRuntime (quantise the inputs, place
  and run each exit segment's subnet through NpuDriver's register protocol,
  read back, decide exits) for batch sizes 1 and Bmax, whole segments at a
  time, tau = 0.8;
* the same on the host golden model (driver=None), i.e. the register and
  memory-image overhead of going through a device;
* the float and fixed-point forward passes over the whole test split;
* the host's fold of a folded stem's input (fluidnpu/lowering.py), ResNet-50's 224 x 224 x 3 int16
  image into 112 x 224 x 21: what the host adds per sample before the NPU's first layer.

    python benchmarks/bench_runtime.py [--samples 450] [--repeat 3] [--bmax 4] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import time

import numpy as np

from fluidnpu import digits_ee as D
from fluidnpu.host_driver.driver import NpuDriver
from fluidnpu.host_driver.model_device import ModelDevice
from fluidnpu.host_driver.runtime import NetworkRuntime
from fluidnpu.lowering import fold_input
from fluidnpu.quantize import quantize
from fluidnpu.zoo import zoo_model


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=450)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bmax", type=int, default=4, help="Bmax of the design (default: the runtime's default design)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    net = D.load_float_network()
    xtr, _, xte, _ = D.load_dataset()
    q = quantize(net, xtr)
    x = np.resize(xte, (args.samples,) + xte.shape[1:])
    bundle = D.default_design(args.bmax)
    res: dict = {"design": dict(zip(("TR", "TP", "TC"), bundle.design)), "bmax": bundle.bmax,
                 "samples": args.samples, "python": platform.python_version(), "machine": platform.machine()}
    for bmax in (1, bundle.bmax):
        drv = NpuDriver(ModelDevice(bundle), bundle)
        rt = NetworkRuntime(q, drv, bmax=bmax)
        rt.infer(x[:bmax])      # places the subnets
        t = best_of(functools.partial(rt.infer, x), args.repeat)
        res[f"model_device_b{bmax}_samples_per_s"] = args.samples / t
        res[f"model_device_b{bmax}_subnet_runs_per_s"] = None
        runs0 = rt.subnet_runs
        t0 = time.perf_counter()
        rt.infer(x)
        res[f"model_device_b{bmax}_subnet_runs_per_s"] = (rt.subnet_runs - runs0) / (time.perf_counter() - t0)
        ref = NetworkRuntime(q, None, bmax=bmax)
        res[f"golden_b{bmax}_samples_per_s"] = args.samples / best_of(functools.partial(ref.infer, x), args.repeat)
    res["float_forward_samples_per_s"] = args.samples / best_of(lambda: net.forward(x), args.repeat)
    res["fixed_forward_samples_per_s"] = args.samples / best_of(
        lambda: q.run_reference(q.quantize_input(x)[0]), args.repeat)
    stem = zoo_model("resnet50").stem
    image = np.random.default_rng(0).integers(-32768, 32768, (1, *stem.in_hw, stem.in_ch)).astype(np.int16)
    res["resnet50_stem_fold_ms"] = 1e3 * best_of(lambda: fold_input(stem, image), max(args.repeat, 5))
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"digits-ee on ModelDevice <{bundle.design[0]}, {bundle.design[1]}, {bundle.design[2]}>, "
              f"{args.samples} samples, best of {args.repeat}")
        for k, v in res.items():
            if k.endswith("_per_s"):
                print(f"  {k:40s} {v:10.0f}")
        print(f"  {'resnet50_stem_fold_ms':40s} {res['resnet50_stem_fold_ms']:10.2f}")
    return res


if __name__ == "__main__":
    main()
