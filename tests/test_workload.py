"""Workload core: GEMM lowering, execution order with exit heads, validation."""

from __future__ import annotations

import pytest

from fluidnpu.errors import FluidError
from fluidnpu.workload import Exit, Layer, Workload, equidistant_positions, exit_head


def test_conv_lowering_by_hand():
    c = Layer.conv("c", 64, 128, (56, 56), 3, stride=2, padding=1)
    assert (c.R, c.P, c.C, c.out_hw) == (28 * 28, 576, 128, (28, 28))
    dw = Layer.conv("dw", 32, 32, 10, 3, padding=(0, 1, 2, 1), groups=32)   # asymmetric pads, depthwise
    assert (dw.R, dw.P, dw.C, dw.groups, dw.out_hw) == (10 * 10, 9, 1, 32, (10, 10))
    assert dw.macs == 32 * 100 * 9
    assert Layer.fc("f", 2048, 1000).R == 1
    with pytest.raises(FluidError, match="groups"):
        Layer.conv("bad", 30, 64, 8, 3, groups=4)
    with pytest.raises(FluidError, match="does not fit"):
        Layer.conv("bad", 3, 8, 2, 5)


def test_schedule_interleaves_exit_heads(tiny_workload):
    sched = tiny_workload.schedule()
    assert [(s.layer.name, s.segment, s.in_head) for s in sched] == [
        ("c1", 0, False), ("e1.fc", 0, True), ("c2", 1, False), ("fc", 1, False)]
    assert [s.index for s in sched] == list(range(4))
    assert [[s.layer.name for s in seg] for seg in tiny_workload.segments()] == [["c1", "e1.fc"], ["c2", "fc"]]
    assert tiny_workload.total_macs == sum(layer.macs for layer in tiny_workload.layers())


def test_round_trip(tiny_workload):
    assert Workload.from_dict(tiny_workload.to_dict()) == tiny_workload


def test_equidistant_positions_split_macs():
    layers = [Layer.fc(f"l{i}", 10, 10) for i in range(12)]   # equal MACs each
    assert equidistant_positions(layers, 3, range(12)) == [2, 5, 8]
    # targets at cumulative 3, 6, 9 layers (indices 2, 5, 8): nearest odd allowed index, ties to the first
    assert equidistant_positions(layers, 3, [1, 3, 5, 7, 9]) == [1, 5, 7]
    with pytest.raises(FluidError, match="only 1"):
        equidistant_positions(layers, 2, [4])


def test_exit_head_is_three_gemms_on_the_tapped_feature_map():
    head = exit_head("e", 256, (56, 56), 1000)
    assert [h.kind for h in head] == ["conv", "conv", "fc"]
    assert head[0].in_ch == 256 and head[0].in_hw == (28, 28)
    assert head[-1].C == 1000


@pytest.mark.parametrize("exits,word", [
    ((Exit("a", 1, (), 1.0),), "last exit must sit"),
    ((Exit("a", 1, (), 0.5), Exit("b", 1, (), 0.5)), "strictly increasing"),
    ((Exit("a", 0, (), 0.2), Exit("f", 2, (), 0.2)), "sum to 1"),
    ((Exit("a", 0, (), 0.5), Exit("f", 2, (Layer.fc("h", 1, 1),), 0.5)), "final exit has no head"),
    ((), "no exits"),
])
def test_invalid_workloads(exits, word):
    layers = (Layer.fc("a", 4, 4), Layer.fc("b", 4, 4), Layer.fc("c", 4, 4))
    with pytest.raises(FluidError, match=word):
        Workload("w", layers, exits)
