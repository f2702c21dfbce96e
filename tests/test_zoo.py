"""Built-in zoo: layer shapes, MAC totals and exit placement of ResNet-50 and Inception-v3.

Reference figures are the published ones only (torchvision's model cards:
4.09 GFLOPS for ResNet-50, 5.71 for Inception-v3, both counting MACs) and
shapes worked out by hand from the architectures, so a wrong stride, padding
or branch in the zoo shows up here rather than as a subtly wrong DSE result.
"""

from __future__ import annotations

import pytest

from fluidnpu.errors import FluidError
from fluidnpu.workload import Layer, Workload
from fluidnpu.zoo import MODELS, zoo_model
from fluidnpu.zoo.inceptionv3 import inceptionv3
from fluidnpu.zoo.resnet50 import resnet50

RESNET_RATES = (0.051, 0.169, 0.090, 0.690)
INCEPTION_RATES = (0.145, 0.186, 0.222, 0.447)


@pytest.fixture(scope="module")
def rn() -> Workload:
    return resnet50()


@pytest.fixture(scope="module")
def inc() -> Workload:
    return inceptionv3()


def by_name(w: Workload, name: str) -> Layer:
    matches = [layer for layer in w.layers() if layer.name == name]
    assert len(matches) == 1, f"{name!r} found {len(matches)} times"
    return matches[0]


def names(w: Workload) -> list[str]:
    return [layer.name for layer in w.backbone]


# ---------------------------------------------------------------- ResNet-50


def test_resnet_layer_count_and_kinds(rn: Workload) -> None:
    assert len(rn.backbone) == 54
    assert [layer.kind for layer in rn.backbone] == ["conv"] * 53 + ["fc"]
    assert sum(name.endswith(".downsample") for name in names(rn)) == 4
    assert rn.input_shape == (3, 224, 224)
    assert rn.source == "zoo"


def test_resnet_macs_match_published(rn: Workload) -> None:
    assert rn.backbone_macs == pytest.approx(4.09e9, rel=0.005)
    # Exit heads are small: together they add well under 2% to the backbone.
    assert rn.backbone_macs < rn.total_macs < 1.02 * rn.backbone_macs


def test_resnet_stem_and_classifier_shapes(rn: Workload) -> None:
    conv1 = by_name(rn, "conv1")
    assert (conv1.R, conv1.P, conv1.C) == (112 * 112, 7 * 7 * 3, 64)
    assert conv1.stride == (2, 2) and conv1.pads == (3, 3, 3, 3)
    fc = by_name(rn, "fc")
    assert (fc.kind, fc.R, fc.P, fc.C) == ("fc", 1, 2048, 1000)
    # After the 3x3/2 max pool the first block sees 56x56x64.
    assert by_name(rn, "layer1.0.conv1").in_hw == (56, 56)
    assert by_name(rn, "layer1.0.conv1").in_ch == 64


def test_resnet_v15_stride_on_3x3(rn: Workload) -> None:
    # v1.5: the first 1x1 keeps the resolution, the 3x3 halves it.
    c1, c2 = by_name(rn, "layer2.0.conv1"), by_name(rn, "layer2.0.conv2")
    assert c1.stride == (1, 1) and c1.out_hw == (56, 56)
    assert c2.stride == (2, 2) and c2.out_hw == (28, 28)
    ds = by_name(rn, "layer2.0.downsample")
    assert (ds.R, ds.P, ds.C, ds.stride) == (28 * 28, 256, 512, (2, 2))
    # layer1's projection only widens channels.
    ds1 = by_name(rn, "layer1.0.downsample")
    assert (ds1.R, ds1.P, ds1.C, ds1.stride) == (56 * 56, 64, 256, (1, 1))


def test_resnet_layer3_3x3(rn: Workload) -> None:
    c = by_name(rn, "layer3.1.conv2")
    assert (c.R, c.P, c.C) == (14 * 14, 3 * 3 * 256, 256)
    assert c.pads == (1, 1, 1, 1)


def test_resnet_execution_order(rn: Workload) -> None:
    n = names(rn)
    assert n[:9] == ["conv1", "layer1.0.conv1", "layer1.0.conv2", "layer1.0.conv3", "layer1.0.downsample",
                     "layer1.1.conv1", "layer1.1.conv2", "layer1.1.conv3", "layer1.2.conv1"]
    assert n[11:16] == ["layer2.0.conv1", "layer2.0.conv2", "layer2.0.conv3", "layer2.0.downsample",
                        "layer2.1.conv1"]
    assert n[-2:] == ["layer4.2.conv3", "fc"]
    blocks = {name.rsplit(".", 1)[0] for name in n if name.startswith("layer")}
    assert len(blocks) == 3 + 4 + 6 + 3
    # Each conv feeds the next one in the main path: channels must chain.
    for a, b in zip(rn.backbone, rn.backbone[1:]):
        if b.name.endswith(".conv2") or b.name.endswith(".conv3"):
            assert b.in_ch == a.out_ch and b.in_hw == a.out_hw, (a.name, b.name)


# ---------------------------------------------------------------- Inception-v3


def test_inception_layer_count_and_kinds(inc: Workload) -> None:
    assert len(inc.backbone) == 95
    assert [layer.kind for layer in inc.backbone] == ["conv"] * 94 + ["fc"]
    assert inc.input_shape == (3, 299, 299)
    assert inc.source == "zoo"
    assert not any("Aux" in name for name in names(inc))


def test_inception_macs_match_published(inc: Workload) -> None:
    assert inc.backbone_macs == pytest.approx(5.71e9, rel=0.01)
    assert inc.backbone_macs < inc.total_macs < 1.02 * inc.backbone_macs


def test_inception_stem_shapes(inc: Workload) -> None:
    expected = {  # name: (in_hw, out_hw, in_ch, out_ch)
        "Conv2d_1a_3x3": ((299, 299), (149, 149), 3, 32),
        "Conv2d_2a_3x3": ((149, 149), (147, 147), 32, 32),
        "Conv2d_2b_3x3": ((147, 147), (147, 147), 32, 64),
        "Conv2d_3b_1x1": ((73, 73), (73, 73), 64, 80),
        "Conv2d_4a_3x3": ((73, 73), (71, 71), 80, 192),
    }
    assert names(inc)[:5] == list(expected)
    for name, (ihw, ohw, ic, oc) in expected.items():
        layer = by_name(inc, name)
        assert (layer.in_hw, layer.out_hw, layer.in_ch, layer.out_ch) == (ihw, ohw, ic, oc), name
    assert by_name(inc, "Mixed_5b.branch1x1").in_hw == (35, 35)


def test_inception_asymmetric_kernels(inc: Workload) -> None:
    c = by_name(inc, "Mixed_6b.branch7x7_2")
    assert c.kernel == (1, 7) and c.pads == (0, 3, 0, 3)
    assert (c.R, c.P, c.C) == (17 * 17, 7 * 128, 128)
    assert c.out_hw == (17, 17)
    d = by_name(inc, "Mixed_6b.branch7x7dbl_2")
    assert d.kernel == (7, 1) and d.pads == (3, 0, 3, 0) and d.out_hw == (17, 17)
    e = by_name(inc, "Mixed_7b.branch3x3_2b")
    assert e.kernel == (3, 1) and (e.R, e.P, e.C) == (8 * 8, 3 * 384, 384)
    f = by_name(inc, "Mixed_6e.branch7x7dbl_5")
    assert (f.P, f.C) == (7 * 192, 192)


def test_inception_grid_reductions(inc: Workload) -> None:
    assert by_name(inc, "Mixed_6a.branch3x3").out_hw == (17, 17)
    assert by_name(inc, "Mixed_6a.branch3x3dbl_3").out_hw == (17, 17)
    assert by_name(inc, "Mixed_7a.branch3x3_2").out_hw == (8, 8)
    assert by_name(inc, "Mixed_7a.branch7x7x3_4").out_hw == (8, 8)


def test_inception_concat_channels(inc: Workload) -> None:
    # A module's output width is what the next module's branches (or the fc) read.
    expected_in = {"Mixed_5b": 192, "Mixed_5c": 256, "Mixed_5d": 288, "Mixed_6a": 288, "Mixed_6b": 768,
                   "Mixed_6c": 768, "Mixed_6d": 768, "Mixed_6e": 768, "Mixed_7a": 768, "Mixed_7b": 1280,
                   "Mixed_7c": 2048}
    for module, ch in expected_in.items():
        readers = [layer for layer in inc.backbone
                   if layer.name.startswith(module + ".") and layer.name.endswith(("_1", "branch1x1", "branch_pool",
                                                                                    "branch3x3"))]
        assert readers and all(layer.in_ch == ch for layer in readers), module
    assert by_name(inc, "fc").P == 2048


def test_inception_branch_order(inc: Workload) -> None:
    mod = [n.split(".", 1)[1] for n in names(inc) if n.startswith("Mixed_5b.")]
    assert mod == ["branch1x1", "branch5x5_1", "branch5x5_2", "branch3x3dbl_1", "branch3x3dbl_2",
                   "branch3x3dbl_3", "branch_pool"]
    mod = [n.split(".", 1)[1] for n in names(inc) if n.startswith("Mixed_7c.")]
    assert mod == ["branch1x1", "branch3x3_1", "branch3x3_2a", "branch3x3_2b", "branch3x3dbl_1",
                   "branch3x3dbl_2", "branch3x3dbl_3a", "branch3x3dbl_3b", "branch_pool"]
    per_module = {}
    for n in names(inc):
        if n.startswith("Mixed_"):
            per_module[n.split(".")[0]] = per_module.get(n.split(".")[0], 0) + 1
    assert per_module == {"Mixed_5b": 7, "Mixed_5c": 7, "Mixed_5d": 7, "Mixed_6a": 4, "Mixed_6b": 10,
                          "Mixed_6c": 10, "Mixed_6d": 10, "Mixed_6e": 10, "Mixed_7a": 6, "Mixed_7b": 9,
                          "Mixed_7c": 9}


# ---------------------------------------------------------------- exits (both models)


def block_of(name: str) -> str:
    """The residual block / Inception module a layer belongs to ("" for stem and classifier)."""
    parts = name.split(".")
    if parts[0].startswith("layer"):
        return ".".join(parts[:2])
    if parts[0].startswith("Mixed_"):
        return parts[0]
    return ""


# (model, rates, largest relative deviation of a segment from total/4, tapped layers).
# Exits can only sit on block ends, so the split is as even as block granularity allows:
# ResNet-50 gets 28/25/21/25 %, Inception-v3 29/19/24/28 % (its big stem, 23% of the MACs,
# cannot carry an exit and Mixed_6a->6b is a 6.5% step).
EXIT_CASES = [
    ("resnet50", RESNET_RATES, 0.15, ["layer2.0.downsample", "layer3.0.downsample", "layer3.4.conv3"]),
    ("inceptionv3", INCEPTION_RATES, 0.25, ["Mixed_5b.branch_pool", "Mixed_6a.branch3x3dbl_3",
                                            "Mixed_6d.branch_pool"]),
]


@pytest.mark.parametrize("model,rates,seg_tol,tapped", EXIT_CASES)
def test_exit_structure(model: str, rates: tuple[float, ...], seg_tol: float, tapped: list[str]) -> None:
    w = MODELS[model]()
    assert [e.name for e in w.exits] == ["exit1", "exit2", "exit3", "final"]
    assert [e.rate for e in w.exits] == pytest.approx(rates, abs=1e-12)
    positions = [e.position for e in w.exits]
    assert all(a < b for a, b in zip(positions, positions[1:]))
    assert positions[-1] == len(w.backbone) - 1 and w.exits[-1].head == ()
    assert [w.backbone[p].name for p in positions[:-1]] == tapped
    for p in positions[:-1]:
        here, nxt = w.backbone[p].name, w.backbone[p + 1].name
        assert block_of(here) != "", f"exit on stem/classifier layer {here}"
        assert block_of(here) != block_of(nxt), f"exit at {here} is not the end of its block"


@pytest.mark.parametrize("model,rates,seg_tol,tapped", EXIT_CASES)
def test_exit_heads_read_block_output(model: str, rates: tuple[float, ...], seg_tol: float,
                                      tapped: list[str]) -> None:
    w = MODELS[model]()
    for e in w.exits[:-1]:
        assert [layer.name for layer in e.head] == [f"{e.name}.conv1", f"{e.name}.conv2", f"{e.name}.fc"]
        # The block output is exactly what the next backbone layer consumes.
        nxt = w.backbone[e.position + 1]
        assert e.head[0].in_ch == nxt.in_ch
        assert e.head[0].in_hw == (nxt.in_hw[0] // 2, nxt.in_hw[1] // 2)  # after the head's 2x2 pool
        assert e.head[-1].C == 1000


@pytest.mark.parametrize("model,rates,seg_tol,tapped", EXIT_CASES)
def test_exits_split_macs_evenly(model: str, rates: tuple[float, ...], seg_tol: float, tapped: list[str]) -> None:
    w = MODELS[model]()
    total = w.backbone_macs
    seg_macs = [sum(s.layer.macs for s in seg if not s.in_head) for seg in w.segments()]
    assert sum(seg_macs) == total
    for i, m in enumerate(seg_macs):
        assert abs(m - total / 4) <= seg_tol * total / 4, f"segment {i}: {m / total:.3f} of the MACs"
    # Cumulative MACs at exit k are near k/4 of the total (not just each segment near 1/4).
    done = 0
    for k, m in enumerate(seg_macs[:-1], start=1):
        done += m
        assert abs(done / total - k / 4) <= 0.05, f"exit{k} at {done / total:.3f}"


# ---------------------------------------------------------------- registry


def test_zoo_model_lookup() -> None:
    w = zoo_model("ResNet-50")
    assert w.name == "ResNet-50" and len(w.backbone) == 54
    assert zoo_model("resnet_50") == w  # deterministic, and '-'/'_' are ignored
    assert zoo_model("Inception-V3").name == "Inception-v3"
    with pytest.raises(FluidError, match="unknown model"):
        zoo_model("vgg")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_round_trip_dict(model: str) -> None:
    w = MODELS[model]()
    assert Workload.from_dict(w.to_dict()) == w
