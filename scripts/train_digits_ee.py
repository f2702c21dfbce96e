"""Train digits-ee (fluidnpu/digits_ee.py) on scikit-learn's handwritten digits, numpy only.

    .venv/bin/python scripts/train_digits_ee.py [--epochs 40] [--out fluidnpu/data/digits_ee.npz]

Deterministic (seed 0), about 20 s on one core. All three exits are trained
jointly (sum of the cross-entropies, as in BranchyNet-style early-exit
training). Writes the float weights (P x C, P ordered (ky, kx, cin), the
NPU's layout) plus the exit rates at tau = 0.8 of the fixed-point network on
the test split, which the workload uses as its exit rates for the DSE and
the scheduler's simulations.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from fluidnpu import digits_ee as D
from fluidnpu.quantize import FloatLayer, FloatNetwork, early_exit_eval, geometry, layer_sources, quantize


def _index(g) -> tuple[np.ndarray, tuple[int, int, int]]:
    """im2col gather indices (R, P) into the zero-padded flattened input, P ordered (ky, kx, c)."""
    Hp = max(g.in_h + 2 * g.ph, (g.out_h - 1) * g.sh + g.kh)
    Wp = max(g.in_w + 2 * g.pw, (g.out_w - 1) * g.sw + g.kw)
    C = g.cin
    oy, ox = np.meshgrid(np.arange(g.out_h), np.arange(g.out_w), indexing="ij")
    ky, kx, c = np.meshgrid(np.arange(g.kh), np.arange(g.kw), np.arange(C), indexing="ij")
    rows = (oy.reshape(-1, 1) * g.sh + ky.reshape(1, -1))
    cols = (ox.reshape(-1, 1) * g.sw + kx.reshape(1, -1))
    idx = (rows * Wp + cols) * C + c.reshape(1, -1)
    return idx, (Hp, Wp, C)


class Net:
    def __init__(self, rng: np.random.Generator) -> None:
        wl = D.digits_ee(rates=(0.4, 0.3, 0.3))
        self.sched = wl.schedule()
        self.src = layer_sources(wl)
        self.exits = [seg[-1].index for seg in wl.segments()]
        self.geo = [geometry(s.layer, s.index) for s in self.sched]
        self.idx = [_index(g) for g in self.geo]
        self.params = []
        for s in self.sched:
            P, C = s.layer.P, s.layer.C
            self.params.append([rng.standard_normal((P, C)) * np.sqrt(2.0 / P), np.zeros(C)])
        self.relu = [D.RELU[s.layer.name] for s in self.sched]

    def forward(self, x: np.ndarray):
        n = len(x)
        cache, outs = [], []
        for i, g in enumerate(self.geo):
            inp = x if self.src[i] < 0 else outs[self.src[i]]
            inp = inp.reshape(n, g.in_h, g.in_w, g.cin)
            idx, (Hp, Wp, C) = self.idx[i]
            xp = np.zeros((n, Hp, Wp, C))
            xp[:, g.ph:g.ph + g.in_h, g.pw:g.pw + g.in_w] = inp
            cols = xp.reshape(n, -1)[:, idx]
            w, b = self.params[i]
            y = cols @ w + b
            if self.relu[i]:
                y = np.maximum(y, 0)
            cache.append(cols)
            outs.append(y.reshape(n, g.out_h, g.out_w, g.cout))
        return outs, cache

    def backward(self, x, outs, cache, dlogits):
        n = len(x)
        grads = [None] * len(self.geo)
        dout = [np.zeros_like(o) for o in outs]
        for e, li in enumerate(self.exits):
            dout[li] += dlogits[e].reshape(outs[li].shape)
        for i in reversed(range(len(self.geo))):
            g = self.geo[i]
            dy = dout[i].reshape(n, -1, g.cout)
            if self.relu[i]:
                dy = dy * (outs[i].reshape(n, -1, g.cout) > 0)
            w, _ = self.params[i]
            grads[i] = [np.einsum("nrp,nrc->pc", cache[i], dy), dy.sum(axis=(0, 1))]
            s = self.src[i]
            if s >= 0:
                idx, (Hp, Wp, C) = self.idx[i]
                dcols = dy @ w.T
                dxp = np.zeros((n, Hp * Wp * C))
                for r in range(idx.shape[0]):          # R is small: a loop over output pixels
                    np.add.at(dxp, (slice(None), idx[r]), dcols[:, r])
                dx = dxp.reshape(n, Hp, Wp, C)[:, g.ph:g.ph + g.in_h, g.pw:g.pw + g.in_w]
                dout[s] += dx.reshape(dout[s].shape)
        return grads


def softmax_ce(z: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    n = len(y)
    loss = -np.mean(np.log(p[np.arange(n), y] + 1e-12))
    p[np.arange(n), y] -= 1
    return float(loss), p / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--wd", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(D.WEIGHTS))
    args = ap.parse_args(argv)
    t0 = time.time()
    xtr, ytr, xte, yte = D.load_dataset()
    rng = np.random.default_rng(args.seed)
    net = Net(rng)
    m = [[np.zeros_like(p) for p in ps] for ps in net.params]
    v = [[np.zeros_like(p) for p in ps] for ps in net.params]
    step = 0
    for ep in range(args.epochs):
        perm = rng.permutation(len(ytr))
        tot = 0.0
        for k in range(0, len(perm), args.batch):
            bi = perm[k:k + args.batch]
            xb, yb = xtr[bi].astype(np.float64), ytr[bi]
            outs, cache = net.forward(xb)
            dlog = []
            for li in net.exits:
                loss, d = softmax_ce(outs[li].reshape(len(bi), -1), yb)
                tot += loss * len(bi)
                dlog.append(d)
            grads = net.backward(xb, outs, cache, dlog)
            step += 1
            for i, gr in enumerate(grads):
                for j in range(2):
                    gj = gr[j] + (args.wd * net.params[i][j] if j == 0 else 0)
                    m[i][j] = 0.9 * m[i][j] + 0.1 * gj
                    v[i][j] = 0.999 * v[i][j] + 0.001 * gj * gj
                    mh = m[i][j] / (1 - 0.9 ** step)
                    vh = v[i][j] / (1 - 0.999 ** step)
                    net.params[i][j] -= args.lr * mh / (np.sqrt(vh) + 1e-8)
        if ep % 10 == 9 or ep == args.epochs - 1:
            outs, _ = net.forward(xte.astype(np.float64))
            accs = [float(np.mean(outs[li].reshape(len(yte), -1).argmax(1) == yte)) for li in net.exits]
            print(f"epoch {ep + 1}: loss {tot / len(ytr):.3f}, test accuracy per exit "
                  + ", ".join(f"{100 * a:.1f}%" for a in accs), flush=True)

    fnet = FloatNetwork(net_wl := D.digits_ee(rates=(0.4, 0.3, 0.3)),
                        tuple(FloatLayer(s.layer, p[0], p[1], net.relu[s.index])
                              for s, p in zip(net_wl.schedule(), net.params)), D.INPUT_HWC)
    qnet = quantize(fnet, xtr)
    fx = early_exit_eval(qnet.exit_logits_reference(qnet.quantize_input(xte)[0]), yte, D.DEFAULT_TAU)
    fl = early_exit_eval(fnet.exit_logits(xte), yte, D.DEFAULT_TAU)
    rates = [e["exit_rate"] for e in fx["exits"]]
    print(f"tau {D.DEFAULT_TAU}: float accuracy {100 * fl['accuracy']:.2f}%, fixed {100 * fx['accuracy']:.2f}%, "
          f"fixed exit rates {', '.join(f'{100 * r:.1f}%' for r in rates)}")
    arrays = {}
    for s, p in zip(net_wl.schedule(), net.params):
        arrays[f"{s.layer.name}.w"] = p[0].astype(np.float32)
        arrays[f"{s.layer.name}.b"] = p[1].astype(np.float32)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, exit_rates=np.array(rates), tau=np.array(D.DEFAULT_TAU), seed=np.array(args.seed),
                        epochs=np.array(args.epochs), **arrays)
    print(f"wrote {out} ({out.stat().st_size} bytes) in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
