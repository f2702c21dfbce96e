"""The planner's two input files, schema-checked, and the device kinds they describe.

sessions.json: [{"model": "resnet50", "rate": 60, "slo_ms": 400}, ...] (a zoo name or an ONNX path).
fleet.json: {"devices": [{"name": "zcu104-a", "board": "zcu104", "design": "r50_zcu104.json", "count": 4},
                         {"name": "gpu", "kind": "gpu", "profile": "p.json", "model": "resnet50", "count": 1}]}

Relative paths (ONNX models, designs, GPU profiles) are read from the folder
of the file that names them. Every problem is one FluidError line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.output import read_json
from fluidnpu.scheduler_fw.fleet.nexus import DeviceKind, Profile, Session
from fluidnpu.schema import check, check_one_of

_NAME = {"type": "string", "minLength": 1}
SESSIONS_SCHEMA: dict[str, Any] = {
    "type": "array", "minItems": 1,
    "items": {"type": "object", "required": ["model", "rate", "slo_ms"], "additionalProperties": False,
              "properties": {"model": _NAME, "rate": {"type": "number", "minimum": 0},
                             "slo_ms": {"type": "number", "exclusiveMinimum": 0}}},
}
_DEVICE_COMMON = {"name": _NAME, "count": {"type": "integer", "minimum": 1},
                  "switch_ms": {"type": "number", "minimum": 0}}
DEVICE_SCHEMAS: dict[str, dict[str, Any]] = {
    "npu": {"type": "object", "required": ["name", "design", "count"], "additionalProperties": False,
            "form": '{"name": ..., "board": ..., "design": "<bundle .json>", "count": <n>}',
            "properties": {**_DEVICE_COMMON, "kind": {"const": "npu"}, "board": _NAME, "design": _NAME,
                           "mmio_write_ns": {"type": "number", "minimum": 0}, "weights_resident": {"type": "boolean"}}},
    "gpu": {"type": "object", "required": ["name", "kind", "profile", "count"], "additionalProperties": False,
            "form": '{"name": ..., "kind": "gpu", "profile": "<profile .json>", "model": ..., "count": <n>}',
            "properties": {**_DEVICE_COMMON, "kind": {"const": "gpu"}, "model": _NAME,
                           "bmax": {"type": "integer", "minimum": 1},
                           "profile": {"oneOf": [_NAME, {"type": "object", "minProperties": 1,
                                                         "additionalProperties": _NAME}],
                                       "form": '"<profile .json>" or {"<model>": "<profile .json>"}'}}},
}
FLEET_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["devices"],
    "form": '{"devices": [{"name": ..., "design": ..., "count": ...}, ...]}',
    "properties": {"devices": {"type": "array", "minItems": 1}},
}
"""The file's frame; each device is then checked against DEVICE_SCHEMAS[its kind] (check_one_of)."""


def _near(base: Path, name: str) -> str:
    """A path the file at `base` names: relative to that file's folder, as docs/fleet.md says, also where
    nothing is there yet (a design the caller builds there); relative to the working folder only where
    only that one exists (a file named from where the command runs)."""
    p = Path(name)
    near = base / p
    return str(p if p.is_absolute() or (not near.exists() and p.exists()) else near)


def load_sessions(path: str | Path) -> list[Session]:
    """The sessions file; a model that is a relative ONNX path is taken from the file's folder."""
    data = read_json(path, "sessions file")
    check(SESSIONS_SCHEMA, data, f"sessions file {path}")
    base = Path(path).parent
    return [Session(_near(base, d["model"]) if d["model"].lower().endswith(".onnx") else d["model"],
                    float(d["rate"]), float(d["slo_ms"]) / 1e3, i) for i, d in enumerate(data)]


def load_fleet_file(path: str | Path) -> list[dict[str, Any]]:
    """The fleet file's devices, checked, with their paths made relative to the fleet file's folder."""
    data = read_json(path, "fleet file")
    what = f"fleet file {path}"
    check(FLEET_SCHEMA, data, what)
    base = Path(path).parent
    devices = []
    for i, d in enumerate(data["devices"]):
        check_one_of(DEVICE_SCHEMAS, "kind", "npu", d, what, f"devices[{i}]")
        d = dict(d)
        if d.get("kind", "npu") == "npu":
            d["kind"] = "npu"
            d["design"] = _near(base, d["design"])
        else:
            prof = d["profile"]
            if isinstance(prof, str):
                if "model" not in d:
                    raise FluidError(f"{what}: device {d['name']!r} names one GPU profile; say which model it "
                                     f"profiles with \"model\" (or give \"profile\": {{model: path}})")
                prof = {d["model"]: prof}
            d["profile"] = {m: _near(base, p) for m, p in prof.items()}
        devices.append(d)
    names = [d["name"] for d in devices]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise FluidError(f"{what}: device names must be unique ({', '.join(dup)} repeats)")
    return devices


def device_kinds(devices: list[dict[str, Any]], models: list[str], early_exit: bool = True) -> list[DeviceKind]:
    """One DeviceKind per fleet entry, with ℓ(b) of every session model it can run.

    A session model must be a zoo name or an ONNX path, unless a GPU profile names it: then it may be a
    GPU-only model (one of the staged engine's workloads) that no NPU serves.
    """
    from fluidnpu.design import load_model
    from fluidnpu.host_driver.staged.slicing import StageProfile
    from fluidnpu.scheduler_fw.fleet.profiles import MMIO_WRITE_NS, gpu_profile, npu_profile
    from fluidnpu.scheduler_fw.latency import load_design

    on_gpu = {m for d in devices if d["kind"] == "gpu" for m in d["profile"]}
    workloads = {}
    for m in dict.fromkeys(models):
        try:
            workloads[m] = load_model(m)
        except FluidError:
            if m not in on_gpu:
                raise
            # a GPU-only model (e.g. the staged engine's bert/cnn/unet): no NPU workload for it
    models = list(dict.fromkeys(models))
    kinds = []
    for d in devices:
        sw = d.get("switch_ms")
        sw_s = None if sw is None else float(sw) / 1e3
        profiles: dict[str, Profile] = {}
        if d["kind"] == "npu":
            bundle = load_design(d["design"])
            if "board" in d and d["board"] != bundle.board.name:
                raise FluidError(f"fleet device {d['name']!r}: board {d['board']!r}, but design {d['design']} was "
                                 f"built for {bundle.board.name!r}")
            for m, wl in workloads.items():
                if len(wl.layers()) > len(bundle.workload.layers()):
                    continue  # its FBCB cannot hold this model (docs/fleet.md)
                profiles[m] = npu_profile(bundle, wl, early_exit, float(d.get("mmio_write_ns", MMIO_WRITE_NS)),
                                          bool(d.get("weights_resident", False)), sw_s)
            TR, TP, TC = bundle.design
            detail = f"{bundle.workload.name} <{TR},{TP},{TC}> on {bundle.board.name} at {bundle.clock_mhz:g} MHz"
        else:
            for m, p in d["profile"].items():
                if m not in models:
                    continue
                raw = read_json(p, f"GPU profile of device {d['name']!r}:")
                try:
                    sp = StageProfile.from_json(raw)
                except (KeyError, TypeError, ValueError) as exc:
                    raise FluidError(f"GPU profile {p}: not a staged-engine profile ({type(exc).__name__}: {exc})") \
                        from None
                profiles[m] = gpu_profile(sp, d.get("bmax"), sw_s or 0.0)
            detail = f"GPU, profiles of {', '.join(d['profile'])}"
        kinds.append(DeviceKind(d["name"], int(d["count"]), profiles, d["kind"], detail))
    return kinds
