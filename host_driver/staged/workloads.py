"""Workloads built in code with random weights (nothing is downloaded).

* ``bert``  — a BERT-base-like encoder (embeddings, L encoder layers with
  masked self-attention, pooler + classifier) serving variable-length
  sequences drawn from GLUE-like length distributions (input diversity).
* ``cnn``   — a VGG/ResNet-like CNN: stem + residual blocks + head (load diversity).
* ``unet``  — a UNet/LinkNet-like encoder-decoder with skip connections
  carried in the state tuple (operator diversity: wide early layers, narrow late ones).
* ``eecnn`` — a small early-exit network with two exit heads (exit-aware split).

Each builder takes ``size="tiny"`` (CPU tests: a few thousand parameters),
``size="small"`` (CPU benchmarks: compute rather than Python overhead
dominates) or ``size="full"`` (the GPU benchmarks: BERT-base 768/12/12/3072, a
ResNet-34-like CNN at 224x224, a 4-level UNet at 256x256) plus overrides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.staged.model import ExitHead, ModelSpec, SeqStateOps
from fluidnpu.host_driver.staged.torchutil import require_torch

# ---------------------------------------------------------------------------
# Sequence-length distributions (tokens per query, [CLS] and [SEP] included).
#
# These are hand-written histograms shaped after published summaries, NOT
# computed from the dataset files (nothing is downloaded): DVABatch Fig. 4 /
# §3.1 ("most sentences have 5-20 words, but some have more than 100");
# the GLUE paper (Wang et al., ICLR 2019, Table 1) for what each task holds
# (SST-2: single movie-review sentences/phrases; RTE and MRPC: sentence
# pairs, RTE with long news premises). Each entry: bin edges (lo, hi] and the
# probability of a query falling in each bin; lengths are uniform within a bin.
# ``uniform-2-100`` / ``uniform-5-500`` are TurboTransformers' §6 serving
# workloads ("sequence length uniformly distributed between 2-100 / 5-500").
# ---------------------------------------------------------------------------
LENGTH_DISTRIBUTIONS: dict[str, dict[str, Any]] = {
    "sst2": {
        "source": "SST-2-shaped (GLUE; short single sentences, long tail to ~66 tokens); hand-written approximation",
        "edges": [2, 8, 16, 24, 32, 48, 66],
        "probs": [0.30, 0.32, 0.18, 0.11, 0.07, 0.02],
    },
    "rte": {
        "source": "RTE-shaped (GLUE; premise+hypothesis pairs, median ~55 tokens, tail past 250); hand-written "
                  "approximation",
        "edges": [10, 32, 48, 64, 96, 128, 192, 290],
        "probs": [0.14, 0.26, 0.22, 0.18, 0.09, 0.07, 0.04],
    },
    "mrpc": {
        "source": "MRPC-shaped (GLUE; sentence pairs, ~30-80 tokens, max ~105); hand-written approximation",
        "edges": [16, 32, 48, 64, 80, 105],
        "probs": [0.10, 0.32, 0.33, 0.18, 0.07],
    },
    "uniform-2-100": {"source": "TurboTransformers §6: uniform 2-100", "edges": [1, 100], "probs": [1.0]},
    "uniform-5-500": {"source": "TurboTransformers §6: uniform 5-500", "edges": [4, 500], "probs": [1.0]},
}


def sample_lengths(dist: str, rng: np.random.Generator, n: int, cap: int | None = None) -> np.ndarray:
    """n lengths from a named distribution; with `cap`, the distribution is rescaled to end at cap."""
    if dist not in LENGTH_DISTRIBUTIONS:
        raise FluidError(f"unknown length distribution {dist!r}: {', '.join(LENGTH_DISTRIBUTIONS)}")
    d = LENGTH_DISTRIBUTIONS[dist]
    edges = np.asarray(d["edges"], dtype=float)
    if cap is not None and edges[-1] > cap:
        edges = edges * (cap / edges[-1])
    p = np.asarray(d["probs"], dtype=float)
    b = rng.choice(len(p), size=n, p=p / p.sum())
    lo, hi = edges[b], edges[b + 1]
    lengths = np.floor(lo + 1 + rng.random(n) * (hi - lo)).astype(int)
    return np.clip(lengths, 1, int(edges[-1]))


# ---------------------------------------------------------------------------
# BERT-like encoder
# ---------------------------------------------------------------------------

def _bert_modules(vocab: int, hidden: int, layers: int, heads: int, ffn: int, max_len: int, classes: int):
    torch = require_torch()
    from torch import nn  # torch is imported: require_torch said how to install it if not
    F = torch.nn.functional

    class Embeddings(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, hidden)
            self.pos = nn.Embedding(max_len, hidden)
            self.ln = nn.LayerNorm(hidden)

        def forward(self, state):
            ids, mask = state
            pos = torch.arange(ids.shape[1], device=ids.device)
            return self.ln(self.tok(ids) + self.pos(pos)[None]), mask

    class EncoderLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.ln1 = nn.LayerNorm(hidden)
            self.ff1 = nn.Linear(hidden, ffn)
            self.ff2 = nn.Linear(ffn, hidden)
            self.ln2 = nn.LayerNorm(hidden)

        def forward(self, state):
            h, mask = state
            b, n, _ = h.shape
            q, k, v = self.qkv(h).view(b, n, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
            h = self.ln1(h + self.proj(a.transpose(1, 2).reshape(b, n, hidden)))
            h = self.ln2(h + self.ff2(F.gelu(self.ff1(h))))
            return h, mask

    class PoolerClassifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dense = nn.Linear(hidden, hidden)
            self.cls = nn.Linear(hidden, classes)

        def forward(self, state):
            h, _ = state
            return self.cls(torch.tanh(self.dense(h[:, 0])))

    return [Embeddings()] + [EncoderLayer() for _ in range(layers)] + [PoolerClassifier()]


def bert_workload(size: str = "tiny", lengths: str = "rte", seed: int = 0, **kw) -> ModelSpec:
    torch = require_torch()
    cfg: dict[str, Any] = {"full": dict(vocab=30522, hidden=768, layers=12, heads=12, ffn=3072, max_len=512, classes=2),
           "small": dict(vocab=8192, hidden=256, layers=4, heads=4, ffn=1024, max_len=256, classes=2),
           "tiny": dict(vocab=128, hidden=32, layers=4, heads=2, ffn=64, max_len=64, classes=2)}[size]
    cfg.update(kw)
    torch.manual_seed(seed)
    mods = _bert_modules(**cfg)
    max_len, vocab = cfg["max_len"], cfg["vocab"]
    typical = 64 if lengths not in LENGTH_DISTRIBUTIONS else int(np.mean(
        sample_lengths(lengths, np.random.default_rng(0), 2000, cap=max_len)))

    def collate(payloads, device):
        n = max(len(p) for p in payloads)
        ids = torch.zeros((len(payloads), n), dtype=torch.long)
        mask = torch.zeros((len(payloads), n), dtype=torch.bool)
        for i, p in enumerate(payloads):
            ids[i, :len(p)] = torch.as_tensor(np.asarray(p), dtype=torch.long)
            mask[i, :len(p)] = True
        return ids.to(device), mask.to(device)

    def example(bs):
        rng = np.random.default_rng(1)
        return [rng.integers(1, vocab, size=typical) for _ in range(bs)]

    def sample(rng, n):
        return [rng.integers(1, vocab, size=int(L)) for L in sample_lengths(lengths, rng, n, cap=max_len)]

    return ModelSpec(f"bert-{size}", mods, collate, example, ops=SeqStateOps(1), length=len, max_length=max_len,
                     sample=sample)


# ---------------------------------------------------------------------------
# CNN (VGG/ResNet-like)
# ---------------------------------------------------------------------------

def _image_collate(torch):
    def collate(payloads, device):
        return (torch.stack([torch.as_tensor(p) for p in payloads]).to(device),)
    return collate


def _random_inputs(torch, shape: tuple[int, ...]):
    """(example, sample) for fixed-shape inputs: profiling payloads (fixed seed) and a load's payloads."""
    def example(bs):
        g = torch.Generator().manual_seed(1)
        return [torch.randn(*shape, generator=g) for _ in range(bs)]

    def sample(rng, n):
        return [torch.from_numpy(rng.standard_normal(shape).astype(np.float32)) for _ in range(n)]

    return example, sample


def cnn_workload(size: str = "tiny", seed: int = 0, **kw) -> ModelSpec:
    torch = require_torch()
    from torch import nn  # torch is imported: require_torch said how to install it if not
    cfg: dict[str, Any] = {"full": dict(image=224, widths=(64, 128, 256, 512), blocks=(3, 4, 6, 3), classes=1000),
           "small": dict(image=32, widths=(16, 32, 64), blocks=(2, 2, 2), classes=10),
           "tiny": dict(image=16, widths=(4, 8), blocks=(1, 2), classes=5)}[size]
    cfg.update(kw)
    torch.manual_seed(seed)

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.sc = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + self.sc(x))

    w = cfg["widths"]
    mods = [nn.Sequential(nn.Conv2d(3, w[0], 3, 2 if size == "full" else 1, 1, bias=False), nn.BatchNorm2d(w[0]),
                          nn.ReLU())]
    cin = w[0]
    for i, (cout, nb) in enumerate(zip(w, cfg["blocks"])):
        for j in range(nb):
            mods.append(Block(cin, cout, 2 if (j == 0 and i > 0) else 1))
            cin = cout
    mods.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, cfg["classes"])))
    img = cfg["image"]
    example, sample = _random_inputs(torch, (3, img, img))

    return ModelSpec(f"cnn-{size}", mods, _image_collate(torch), example, sample=sample)


# ---------------------------------------------------------------------------
# UNet/LinkNet-like
# ---------------------------------------------------------------------------

def unet_workload(size: str = "tiny", seed: int = 0, **kw) -> ModelSpec:
    torch = require_torch()
    from torch import nn  # torch is imported: require_torch said how to install it if not
    cfg: dict[str, Any] = {"full": dict(image=256, widths=(32, 64, 128, 256, 512), classes=2),
           "small": dict(image=64, widths=(8, 16, 32, 64), classes=2),
           "tiny": dict(image=16, widths=(4, 8, 16), classes=2)}[size]
    cfg.update(kw)
    torch.manual_seed(seed)

    def conv(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    class Stem(nn.Module):
        def __init__(self, cout):
            super().__init__()
            self.c = nn.Sequential(conv(3, cout), conv(cout, cout))

        def forward(self, x):
            return (self.c(x),)

    class Down(nn.Module):          # (x, *skips) -> (down(x), *skips, x)
        def __init__(self, cin, cout):
            super().__init__()
            self.c = nn.Sequential(nn.MaxPool2d(2), conv(cin, cout), conv(cout, cout))

        def forward(self, state):
            x, *skips = state if isinstance(state, tuple) else (state,)
            return (self.c(x), *skips, x)

    class Up(nn.Module):            # (x, *skips, s) -> (up(x) ++ s, *skips)  (LinkNet would add instead of concat)
        def __init__(self, cin, cout):
            super().__init__()
            self.up = nn.ConvTranspose2d(cin, cout, 2, 2)
            self.c = nn.Sequential(conv(2 * cout, cout), conv(cout, cout))

        def forward(self, state):
            x, *skips = state if isinstance(state, tuple) else (state,)
            s = skips.pop()
            return (self.c(torch.cat([self.up(x), s], 1)), *skips)

    class Head(nn.Module):
        def __init__(self, cin, classes):
            super().__init__()
            self.c = nn.Conv2d(cin, classes, 1)

        def forward(self, state):
            return self.c(state[0] if isinstance(state, tuple) else state)

    w = cfg["widths"]
    mods: list[nn.Module] = [Stem(w[0])] + [Down(w[i], w[i + 1]) for i in range(len(w) - 1)]
    mods += [Up(w[i + 1], w[i]) for i in reversed(range(len(w) - 1))] + [Head(w[0], cfg["classes"])]
    img = cfg["image"]
    example, sample = _random_inputs(torch, (3, img, img))

    return ModelSpec(f"unet-{size}", mods, _image_collate(torch), example, sample=sample)


# ---------------------------------------------------------------------------
# Early-exit network
# ---------------------------------------------------------------------------

def eecnn_workload(size: str = "tiny", seed: int = 0, threshold: float = 0.6, **kw) -> ModelSpec:
    torch = require_torch()
    from torch import nn  # torch is imported: require_torch said how to install it if not
    dim = {"full": 512, "small": 64, "tiny": 16}[size]
    depth = 8 if size == "full" else 6
    classes = 4
    torch.manual_seed(seed)
    mods = [nn.Sequential(nn.Linear(dim, dim), nn.ReLU()) for _ in range(depth)]
    mods.append(nn.Linear(dim, classes))

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(dim)
            self.fc = nn.Linear(dim, classes)

        def forward(self, x):
            return 3.0 * self.fc(self.ln(x))

    exits = [ExitHead(depth // 3 - 1, Head(), threshold), ExitHead(2 * depth // 3 - 1, Head(), threshold)]

    example, sample = _random_inputs(torch, (dim,))

    return ModelSpec(f"eecnn-{size}", mods, _image_collate(torch), example, exits=exits, sample=sample)


WORKLOADS: dict[str, Callable[..., ModelSpec]] = {"bert": bert_workload, "cnn": cnn_workload, "unet": unet_workload,
                                                  "eecnn": eecnn_workload}


def build_workload(name: str, size: str = "tiny", **kw) -> ModelSpec:
    if name not in WORKLOADS:
        raise FluidError(f"unknown workload {name!r}: {', '.join(WORKLOADS)}")
    if size not in ("tiny", "small", "full"):
        raise FluidError(f"workload size must be tiny, small or full, got {size!r}")
    return WORKLOADS[name](size=size, **kw)
