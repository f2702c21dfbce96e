"""The cycle model: hand-computed cases, each mode's purpose, and its invariants.

The closed form (perf_model.layer_cycles) is checked against the explicit
block schedule (dse.tiling), which is itself executed with numpy and must
compute exactly every sample's GEMM.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fluidnpu.dse.perf_model import Bus, EngineTiming, layer_cycles, mode_dims
from fluidnpu.dse.tiling import layer_schedule, run_schedule, schedule_cycles

FAST = 1e9      # bytes/cycle: one port so wide that every DMA command is a single beat
PORT64 = 8.0    # one 64-bit AXI port: 4 words a beat
# Fixed costs for the hand-computed cases (the defaults are calibrated against the RTL).
HAND = EngineTiming(fill_base=5, layer_overhead=32, step_overhead=1, dma_latency=5, block_overhead=1, pass_overhead=1)


def test_block_pipeline_case_by_hand():
    # TR=8 TP=4 TC=4; R=10 P=8 C=4, b=1, one 64-bit port, all runs beat-aligned.
    # Two weight steps, 10 rows -> 2 balanced blocks of t=5. Per block: weights 8 rows of
    # 4 words = 8 beats, bias 8 words = 2, inputs 5 rows x 2 steps = 10 beats, + 2 step
    # overheads + 1 block overhead: fetch 23 > compute 10 and balance (23 + 2*5)/2 -> 23.
    # Body: tile set-up 1 + pass set-up 1 + 1 group + 2 * 23 = 49.
    # Prologue: 4 weight rows + bias + 5 input beats + latency 5 + block overhead 1 = 17.
    # Drain: fill 5 + log2 4 = 7, + 5 output rows = 12, less the last step's fetch beyond its
    # 5 rows of compute (23/2 - 5 = 6.5): 5.5.
    # Planning: BP 1 + BR 1 + 1 pass + groups per pass (4-bit divider: 6) + rows per group (6)
    # + n and s (10 rows > 8: two 24-bit divisions, 52) = 67. Descriptor: 3 x 16 words = 12 beats.
    assert layer_cycles(8, 4, 4, 10, 8, 4, 1, 1, 1, 0, PORT64, HAND) == 183     # 49+17+5.5+67+12+32


def test_memory_bound_fc_by_hand():
    # FC P=1000 C=10 on TP=TC=10 at one word a cycle: the block reads 10000 weights + 20
    # bias words + 1000 inputs + 100 step overheads + 1 = 11121, body 11124 with the tile
    # and pass set-up; prologue 100+20+10 + latency 5 + 1 = 136; drain fill 5 + 5 (two DSP
    # chains of 5 lanes: 4 cycles, and the root) + 10 output words - (111.21 - 1) = -90.21;
    # planning 1+1+1 + 9 + 9+1 = 22 (7-bit divider, one block); descriptor 48; overhead 32.
    assert layer_cycles(64, 10, 10, 1, 1000, 10, 1, 1, 1, 0, 2.0, HAND) == 11272
    # R-batching 4 samples reuses the weights: only the inputs (and outputs) grow.
    assert layer_cycles(64, 10, 10, 1, 1000, 10, 1, 4, 4, 0, 2.0, HAND) == 14308


def test_p_batching_packs_small_c_into_idle_pes_but_the_fetcher_issues_one_command_a_cycle():
    # C=2 on 8 PE columns: R-batching leaves 6 PEs idle, P-batching runs 4 samples side by
    # side. Eight 64-bit ports could move 4 input rows a cycle, but the control unit issues
    # one DMA command a cycle (Bus.stream): packing gains nothing in the steady state, only the
    # last step's compute (200 rows instead of 800) after its data -- as on one port.
    for bus in ({"bytes_per_cycle": 64.0, "port_bytes": 8.0}, {"bytes_per_cycle": FAST}):
        r_batch = layer_cycles(1024, 4, 8, 200, 16, 2, 1, 4, 4, 0, bus["bytes_per_cycle"],
                               port_bytes=bus.get("port_bytes"))
        p_batch = layer_cycles(1024, 4, 8, 200, 16, 2, 1, 4, 1, 0, bus["bytes_per_cycle"],
                               port_bytes=bus.get("port_bytes"))
        assert r_batch - 620 <= p_batch <= r_batch
    eight = Bus.of_ports(8, PORT64)
    assert eight.stream(beats=8, commands=8) == 8       # eight one-beat commands: the command rate binds
    assert eight.stream(beats=64, commands=2) == 8      # two 32-beat commands: the ports bind
    one = Bus.of_ports(1, PORT64)                          # one port: a command is >= 1 beat, beats bind
    assert one.cycles(17, 3, 1) == one.beats(17, 3, 1) == (17 + 3 * 3) / 4


def test_stacking_k2_helps_small_c_at_batch_one():
    k1 = layer_cycles(64, 4, 8, 32, 64, 4, 1, 1, 1, 0, FAST)
    k2 = layer_cycles(64, 4, 8, 32, 64, 4, 1, 1, 1, 1, FAST)
    assert k2 < 0.7 * k1


def test_splitting_k_half_helps_short_reductions():
    # P=4 < TP=8 wastes half of every tree; k=1/2 gives 2TC narrower PEs.
    k1 = layer_cycles(1024, 8, 8, 320, 4, 16, 1, 1, 1, 0, FAST)
    kh = layer_cycles(1024, 8, 8, 320, 4, 16, 1, 1, 1, 2, FAST)
    assert kh < 0.8 * k1


def test_short_runs_cost_whole_beats():
    # An input row of P=3 words per step on a 4-word beat: a beat each, not 3/4 of one.
    aligned = layer_cycles(64, 4, 4, 64, 64, 4, 1, 1, 1, 0, PORT64)
    ragged = layer_cycles(64, 3, 4, 64, 63, 4, 1, 1, 1, 0, PORT64)
    assert ragged > aligned


def test_mode_dims_and_missing_modes():
    assert [tuple(map(int, mode_dims(10, 7, 5, k))) for k in (0, 1, 2)] == [(10, 7, 5), (5, 14, 2), (5, 3, 10)]
    assert np.isinf(layer_cycles(10, 1, 4, 4, 4, 4, 1, 1, 1, 2, FAST))  # k=1/2 needs TP >= 2
    assert np.isinf(layer_cycles(10, 4, 1, 4, 4, 4, 1, 1, 1, 1, FAST))  # k=2 needs TC >= 2
    with pytest.raises(ValueError):
        layer_cycles(10, 4, 4, 4, 4, 4, 1, 2, 3, 0, FAST)


def test_grouped_conv_runs_groups_in_sequence():
    one = layer_cycles(32, 4, 4, 9, 9, 4, 1, 1, 1, 0, FAST, EngineTiming(layer_overhead=0))
    eight = layer_cycles(32, 4, 4, 9, 9, 4, 8, 1, 1, 0, FAST, EngineTiming(layer_overhead=0))
    assert abs(eight - 8 * one) < 8      # each count is rounded up once


def test_vectorised_call_matches_scalar_calls():
    TR = np.array([[16], [40]])
    TP = np.array([[3], [5]])
    TC = np.array([[7], [2]])
    R, P, C = np.array([[9, 30]]), np.array([[20, 7]]), np.array([[5, 11]])
    grid = layer_cycles(TR, TP, TC, R, P, C, 1, 5, 2, 1, 3.0)
    for i in range(2):
        for j in range(2):
            assert grid[i, j] == layer_cycles(TR[i, 0], TP[i, 0], TC[i, 0], R[0, j], P[0, j], C[0, j], 1, 5, 2, 1, 3.0)


cases = st.tuples(
    st.integers(1, 40), st.integers(1, 9), st.integers(1, 12),       # TR TP TC
    st.integers(1, 30), st.integers(1, 40), st.integers(1, 30),      # R P C
    st.integers(1, 8), st.integers(1, 8), st.sampled_from([0, 1, 2]),  # b BR k
    st.sampled_from([0.5, 3.0, 7.3, 50.0]),
).filter(lambda c: c[7] <= c[6])


@settings(max_examples=300, deadline=None)
@given(cases)
def test_closed_form_equals_explicit_schedule(case):
    TR, TP, TC, R, P, C, b, BR, k, bpc = case
    closed = layer_cycles(TR, TP, TC, R, P, C, 1, b, BR, k, bpc)
    try:
        sched = layer_schedule(TR, TP, TC, R, P, C, b, BR, k)
    except ValueError:
        assert np.isinf(closed)
        return
    assert schedule_cycles(sched, P, 1, bpc) == closed


@settings(max_examples=150, deadline=None)
@given(cases, st.integers(0, 2**31 - 1))
def test_every_mode_computes_each_samples_gemm_exactly(case, seed):
    TR, TP, TC, R, P, C, b, BR, k, _ = case
    try:
        sched = layer_schedule(TR, TP, TC, R, P, C, b, BR, k)
    except ValueError:
        return
    rng = np.random.default_rng(seed)
    X = rng.integers(-2**15, 2**15, (b, R, P))
    W = rng.integers(-2**15, 2**15, (P, C))
    assert np.array_equal(run_schedule(sched, X, W, R), np.einsum("srp,pc->src", X, W))
    # every output element is produced exactly once
    produced = sum((sl.row1 - sl.row0) * (blk.c1 - blk.c0) for blk in sched.blocks for sl in blk.slices)
    assert produced == b * R * C


@settings(max_examples=200, deadline=None)
@given(cases.map(lambda c: c[1:]), st.integers(1, 3))
def test_cycles_never_beat_peak(case, G):
    TP, TC, R, P, C, b, BR, k, bpc = case
    TR = np.arange(1, 200)
    cyc = layer_cycles(TR, TP, TC, R, P, C, G, b, BR, k, bpc)
    finite = np.isfinite(cyc)
    assert (cyc[finite] >= G * b * R * P * C / (TP * TC)).all()


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 50), st.floats(0, 5), st.floats(0, 5), st.integers(1, 60), st.integers(1, 60))
def test_block_cost_is_subadditive(alpha, beta, a, t1, t2):
    """The DSE's argument: merging two blocks never costs more (max of affine with alpha >= 0)."""
    from fluidnpu.dse.perf_model import Bus, layer_costs
    costs = layer_costs(np.int64(4), np.int64(int(alpha) + 1), np.int64(3), 1, Bus.of(8.0), EngineTiming())
    tile = costs.tile(3)
    merged = costs.block(t1 + t2, tile, 1)
    assert merged <= costs.block(t1, tile, 1) + costs.block(t2, tile, 1) + 1e-9


def test_padding_reads_are_zero_fills():
    from fluidnpu.dse.perf_model import im2col_inside
    # 3x3, pad 1, 4x4 -> 4x4: per axis 12 (pixel, tap) pairs, 2 in the padding
    assert im2col_inside((4, 4), (4, 4), (3, 3), (1, 1), (1, 1)) == pytest.approx((10 / 12) ** 2)
    assert im2col_inside((8, 8), (8, 8), (1, 1)) == 1.0
    # a zero-fill command is one response, not the 2-3 beats of an 8-word run (k=2, TPk=8)
    padded = layer_cycles(64, 4, 8, 16, 72, 4, 1, 1, 1, 1, PORT64, taps=9, inside=0.7)
    plain = layer_cycles(64, 4, 8, 16, 72, 4, 1, 1, 1, 1, PORT64, taps=9)
    assert padded < plain


def test_zero_fills_take_port_time_only_where_a_port_answers_them():
    """A zero-fill read costs a beat where a ReadEngine answers it (one port; the one-walker what-if), none
    on several ports with two walkers, where the DMA answers the input walker's zero reads itself
    (hw/dma.py): the same padded layer's rows then move exactly their live runs' beats."""
    from fluidnpu.dse.perf_model import im2col_row_reads, layer_costs
    from fluidnpu.hw.descriptor import LayerDescriptor
    three, one_walker = Bus.of_ports(3, 8), Bus.of(24, 8, ports=3, walkers=1)
    assert (Bus.of(PORT64).zero_beats, three.zero_beats, one_walker.zero_beats) == (1.0, 0.0, 1.0)
    pad = LayerDescriptor(layer=0, in_h=4, in_w=4, cin=4, out_h=4, out_w=4, cout=4, kh=3, kw=3, ph=1, pw=1)
    zeros = 9 - 9 * (10 / 12) ** 2          # zero-fill runs a row (one run a tap, 4-channel taps)
    assert im2col_row_reads(pad, 4, one_walker).in_beats - im2col_row_reads(pad, 4, three).in_beats \
        == pytest.approx(zeros)
    tpk, P, C = np.int64(4), np.int64(36), np.int64(4)
    free, charged = (layer_costs(tpk, P, C, 9, bus, EngineTiming(), inside=0.7) for bus in (three, one_walker))
    assert float(charged.in_beats - free.in_beats) == pytest.approx(0.3 * float(free.in_runs))


def test_fc_rows_start_beat_aligned():
    # One row per sample: every row is a 64-byte aligned sample, so a 6-word run starts at a
    # multiple of 6 words (2 beats on a 4-word beat), not at a random word (2.25 on average).
    from fluidnpu.dse.perf_model import Bus, layer_costs
    fc = layer_costs(np.int64(6), np.int64(455), np.int64(4), 1, Bus.of(PORT64), EngineTiming(), R=1)
    conv = layer_costs(np.int64(6), np.int64(455), np.int64(4), 1, Bus.of(PORT64), EngineTiming(), R=9)
    assert float(fc.in_row) == (455 + 76 * (4 - 2)) / 4        # 151.75; the RTL moves 152 beats
    assert float(fc.in_row) < float(conv.in_row)


def test_exact_input_reads_from_the_geometry():
    from fluidnpu.dse.perf_model import Bus, im2col_row_reads
    from fluidnpu.hw.descriptor import LayerDescriptor
    bus = Bus.of(PORT64)
    # FC, 455 words in 6-word steps from an aligned sample: runs start at 0 or 2 words of a
    # 4-word beat, 2 beats each, 76 steps (the last of 5 words, at offset 2: 2 beats)
    fc = LayerDescriptor(layer=0, in_h=1, in_w=1, cin=455, out_h=1, out_w=1, cout=4)
    assert im2col_row_reads(fc, 6, bus).in_row == 152
    # 1x1 conv, no padding, 4-channel pixels on a 4-word beat: one beat a row per step
    conv = LayerDescriptor(layer=0, in_h=4, in_w=4, cin=8, out_h=4, out_w=4, cout=4)
    assert im2col_row_reads(conv, 4, bus).in_row == 2
    # 3x3, pad 1: a run in the padding is one zero-fill response
    pad = LayerDescriptor(layer=0, in_h=4, in_w=4, cin=4, out_h=4, out_w=4, cout=4, kh=3, kw=3, ph=1, pw=1)
    assert im2col_row_reads(pad, 4, bus).in_row == 9
    exact = layer_cycles(16, 4, 4, 16, 36, 4, 1, 1, 1, 0, PORT64, taps=9, geometry=pad)
    assert exact == layer_cycles(16, 4, 4, 16, 36, 4, 1, 1, 1, 0, PORT64, taps=9)


def test_every_packed_group_reads_its_own_weights():
    """A pass of g groups reads each weight row g times, group q's read q*C words early and
    (q + 1)*C words long, and each group's bias chunks (hw/sequencer.py, docs/hw-architecture.md)."""
    from fluidnpu.dse.perf_model import Bus, layer_costs
    bus = Bus.of(8.0)                                        # 4 words a beat, a beat a cycle
    costs = layer_costs(np.int64(4), np.int64(8), np.int64(3), 1, bus, EngineTiming(), chunk=8)
    one, two = costs.tile(3, 1), costs.tile(3, 2)
    grain = 1                                                # gcd(C = 3, w = 3, 4)
    rows = float(bus.cycles(8 * 3, 8, grain))                # 8 rows of 3 words
    both = float(bus.cycles(8 * (3 + 6), 16, grain))         # and of 6 words, 3 early
    # group 1's bias: columns [3, 6) from the chunk at column 0, read 3 int32 early: 12 words from
    # word -6, i.e. offset 2 in a beat: (2 + 12) / 4 -> 4 beats
    assert float(two.weights - one.weights) == pytest.approx(both - rows + 4)
    assert float(costs.tile(3, 3).weights) > float(two.weights)


def test_port_skew_prices_a_short_step_on_several_ports():
    """An FC step (k = 1/2 on <64,4,16>: TPk = 2 weight rows of 14 words, 2 packed groups of one
    input run) on four 64-bit ports, as the RTL runs it (docs/rtl-agreement.md): the weight walker
    issues the 4 copies in cycles 0-3 (the next step starts a cycle later, at 5), the last copy takes 4
    beats on its port and is in at 7: 3 cycles after the cycle that follows the step's last command
    (`dma_latency` then times the hand-over and the restart); on one port the beats already run one
    by one."""
    from fluidnpu.dse.perf_model import layer_costs

    four = layer_costs(np.int64(2), np.int64(72), np.int64(14), 1, Bus.of_ports(4, PORT64), EngineTiming(), R=1)
    tile = four.tile(np.int64(14))
    assert float(tile.row_beats) == 4 and float(four.in_runs) == 36 == float(four.in_beats)
    assert float(four.port_skew(1, tile, 2)) == 3.0
    one = layer_costs(np.int64(2), np.int64(72), np.int64(14), 1, Bus.of_ports(1, PORT64), EngineTiming(), R=1)
    assert float(one.port_skew(1, one.tile(np.int64(14)), 2)) == 0.0
    # a long step (128 rows) is not delayed beyond its command stream: the DMA gives each walker its own
    # next response, so the weights, in early, wait for none of the input runs dealt after them, and the
    # last input run is in as the input stream ends
    assert float(four.port_skew(128, tile, 1)) == 0.0


def test_a_step_is_handed_over_from_its_last_command_not_the_weight_walkers_spare_cycle():
    """An FC step of one 1-beat weight row and one 1-beat input run (TPk = 1), traced on four 64-bit
    ports (docs/rtl-agreement.md): both commands go out in cycle 0, the weight walker spends
    cycle 1 before the next step, and the FETCH_AHEAD = 3 steps the fetcher runs ahead take 9 cycles
    (the step's last command + its beat, 1, plus `dma_latency` 8): 3 a step, not the (2 + 8) / 3 that
    timing the hand-over from the next step's start would give (with two steps ahead: 4.5).
    On one port both commands queue for the one command a cycle, so the step ends with its input
    command: (2 + 8) / 3."""
    from fluidnpu.dse.perf_model import layer_costs
    from fluidnpu.hw.regmap import FETCH_AHEAD

    per_step = {}
    for n in (1, 4):
        costs = layer_costs(np.int64(1), np.int64(280), np.int64(2), 1, Bus.of_ports(n, PORT64), EngineTiming(), R=1)
        tile = costs.tile(np.int64(2))
        assert float(tile.row_beats) == 1 and float(costs.in_runs) == 280 == float(costs.in_beats)
        # a block's overhead and its first step's bias, spread over 280 steps, aside
        assert float(costs.fetch(1, tile, 1)) / costs.n_p == pytest.approx(2, abs=0.01)
        per_step[n] = float(costs.block(1, tile, 1)) / costs.n_p
    assert FETCH_AHEAD == 3
    assert per_step == {1: pytest.approx(10 / 3, abs=0.01), 4: pytest.approx(3.0, abs=0.01)}


def test_the_descriptor_reads_are_in_when_their_last_port_is_done():
    """A layer's three 16-word descriptor reads (4 beats each on a 64-bit port), traced
    (docs/rtl-agreement.md): on one port the responses come 4 beats apart, the last 12
    cycles after the first beat; on four ports each read has a port of its own, but the last read's
    4 beats still follow its command, issued 2 cycles after the first: 6, not the 3 that spreading
    the 12 beats over the ports gives. On two ports (not traced) port 0 carries reads 1 and 3: 8."""
    got = {n: Bus.of_ports(n, PORT64).reads_in(16, 3) for n in (1, 2, 4)}
    assert got == {1: 12.0, 2: 8.0, 4: 6.0}
    assert {n: 3 * float(Bus.of_ports(n, PORT64).cycles(16, 1, 16)) for n in (1, 2, 4)} == {1: 12.0, 2: 6.0, 4: 3.0}


def test_busiest_port_of_a_repeating_deal():
    """A packed FC step (two groups: weight copies of 3 and 6 beats for each of TPk = 2 rows, and four
    one-beat input runs) dealt over N 64-bit ports. On one command stream (`walkers` = 1, a
    one-walker fetcher) every step is dealt the same way: on 2 ports both 6-beat copies land on port 1, 6 + 6 +
    1 + 1 = 14 beats there against the even share of 11; on 4 ports ports 1 and 3 get 6 + 1; on 3
    ports the deal rotates (8 commands, 8 mod 3 = 2), so no port is always the busiest; one port has
    nothing to balance. With the two walkers (the RTL) the DMA restarts its deal at each layer and a
    pair of reads split by a busy port shifts the rest, which spreads the copies (the RTL's busiest
    port: 7.1 beats a step, docs/rtl-agreement.md): no busiest-port term."""
    from dataclasses import replace

    from fluidnpu.dse.perf_model import DEFAULT_TIMING, Bus, im2col_inside, layer_setup, mode_costs, row_blocks
    from fluidnpu.sim_tb.agreement import AGREEMENT_CONFIGS, agreement_cases

    p = AGREEMENT_CONFIGS[6]
    case = agreement_cases(p, 12, seed=7000)[5]
    g = case.layers[0].geometry
    br, k = case.modes[0]
    inside = im2col_inside((g.in_h, g.in_w), (g.out_h, g.out_w), (g.kh, g.kw), (g.sh, g.sw), (g.ph, g.pw))
    busy: dict[tuple[int, int], float | None] = {}
    for walkers in (1, 2):
        for n in (1, 2, 3, 4):
            bus = replace(Bus.of_ports(n, 8), walkers=walkers)
            mode = mode_costs(p.TP, p.TC, g.npix, g.P, g.cout, k, bus, DEFAULT_TIMING, g.kh * g.kw, inside, g)
            setup = layer_setup(mode, g.npix, 1, case.b, br, p.banks)
            t = row_blocks(setup, p.TR).full[1]
            assert int(setup.g) == 2 and int(t) == 2
            out = mode.costs.busiest_port(t, setup.full_g, setup.g)
            busy[walkers, n] = None if out is None else float(out)
    assert busy == {(1, 1): None, (1, 2): 14.0, (1, 3): 0.0, (1, 4): 7.0,
                    (2, 1): None, (2, 2): None, (2, 3): None, (2, 4): None}


def test_command_rate_is_a_bus_parameter():
    """`Bus.command_cycles`: one DMA command a cycle by default (a stream of short commands is
    command-bound on several ports); 0 leaves the beats alone (benchmarks/peak_gap.py's what-if), and
    the DSE's per-mode bus keeps it."""
    from fluidnpu.dse.perf_model import DEFAULT_TIMING
    from fluidnpu.dse.search import LayerShapes, modes_of
    from fluidnpu.workload import Layer

    bus = Bus.of_ports(4, 16)
    assert bus.stream(beats=10, commands=40) == 40
    free = Bus.of(bus.bytes_per_cycle, bus.port_bytes, ports=4, command_cycles=0.0)
    assert free.stream(beats=10, commands=40) == pytest.approx(10 * free.beat_cycles)
    shapes = LayerShapes.of([Layer(name="fc", kind="fc", R=1, P=256, C=64)])
    mode = next(iter(modes_of(np.array([[8]]), np.array([[8]]), shapes, (0,), free, DEFAULT_TIMING).values()))
    assert mode.costs.bus.command_cycles == 0.0


def test_walkers_and_gather_price_the_fetch_as_documented():
    """`Bus.walkers` / `Bus.gather` (docs/dse.md): with ports that never bind, the RTL's two walkers pay
    the longer of the weight commands (plus one a step: the step's last input run waits for the weight
    walker) and the input commands (plus each step's first row, read one run a tap); the one-walker
    what-if (one command stream) pays both; with commands free both pay the same beats; gather cuts an
    input row's commands to one a step where its runs cross kernel taps (TPk = 27 against cin = 64) and
    leaves a layer without crossings alone. The RTL's bus (2 walkers, no gather) is the default."""
    from dataclasses import replace

    from fluidnpu.dse.perf_model import DEFAULT_TIMING, layer_costs

    assert (Bus.of_ports(4, 16).walkers, Bus.of_ports(4, 16).gather) == (2, False)
    wide = Bus.of(1e9, 16, ports=4)                                 # commands bind, beats never do
    free = replace(Bus.of_ports(4, 16), command_cycles=0.0)        # beats bind, commands never do
    P, C, taps = np.array(576), np.array(64), 9                    # a 3x3 convolution, cin 64 (kw 3)
    TPk = np.array(27)
    t, groups = np.array(196), np.array(1)

    def fetch(bus: Bus) -> float:
        costs = layer_costs(TPk, P, C, taps, bus, DEFAULT_TIMING, kw=3)
        return float(costs.fetch(t, costs.tile(np.array(64), groups), groups))

    costs = layer_costs(TPk, P, C, taps, wide, DEFAULT_TIMING, kw=3)
    fixed = float(costs.n_p * DEFAULT_TIMING.step_overhead + DEFAULT_TIMING.block_overhead)
    weights = float(costs.tile(np.array(64), groups).weight_cmds)
    inputs = float(t * costs.in_runs + costs.first_runs)
    assert costs.in_runs > costs.n_p and costs.first_runs > 0       # some rows cross a tap
    assert fetch(wide) == pytest.approx(max(weights + float(costs.n_p), inputs) + fixed)
    assert fetch(replace(wide, walkers=1)) == pytest.approx(weights + inputs + fixed)
    assert fetch(replace(wide, gather=True)) == pytest.approx(
        max(weights + float(costs.n_p), float(t * costs.n_p)) + fixed)
    assert fetch(replace(free, walkers=1)) == pytest.approx(fetch(free))
    one_tap = layer_costs(TPk, np.array(540), C, 1, wide, DEFAULT_TIMING)   # no crossings: gather changes nothing
    tile = one_tap.tile(np.array(64), groups)
    assert float(replace(one_tap, bus=replace(wide, gather=True)).fetch(t, tile, groups)) == pytest.approx(
        float(one_tap.fetch(t, tile, groups)))


GEOMETRIES = [  # (descriptor fields, TPk, whether crossings merge): first-layer, padded, unpadded, one-row
    (dict(in_h=16, in_w=16, cin=3, out_h=8, out_w=8, cout=8, kh=7, kw=7, sh=2, sw=2, ph=3, pw=3), 14, True),
    (dict(in_h=5, in_w=5, cin=6, out_h=5, out_w=5, cout=4, kh=3, kw=3, ph=1, pw=1), 4, True),
    (dict(in_h=4, in_w=4, cin=64, out_h=2, out_w=2, cout=4, kh=3, kw=3), 27, True),
    (dict(in_h=3, in_w=9, cin=5, out_h=3, out_w=9, cout=4, kh=1, kw=7, ph=0, pw=3), 8, True),
    (dict(in_h=9, in_w=3, cin=5, out_h=9, out_w=3, cout=4, kh=7, kw=1, ph=3, pw=0), 8, False),   # one column
]


@pytest.mark.parametrize("fields,TPk,merges", GEOMETRIES)
def test_closed_form_input_commands_are_the_exact_walks(fields, TPk, merges):
    """The DSE's closed form for a row's read commands over all steps (one a step, plus the kernel rows'
    ends inside steps, plus every other tap crossing for the rows whose window reaches into the padding:
    `layer_costs` with `kw` and `edge`) is the mean of the exact walk of hw/seq_fetcher.py's cuts
    (`im2col_row_reads`); it has fewer commands than one run a tap wherever a kernel row has taps to
    merge, and a step's first row, read one run a tap, never costs less than the others."""
    from fluidnpu.dse.perf_model import im2col_edge, im2col_inside, im2col_row_reads, layer_costs
    from fluidnpu.hw.descriptor import LayerDescriptor

    g = LayerDescriptor(layer=0, **fields)
    bus = Bus.of(PORT64)
    shape = ((g.in_h, g.in_w), (g.out_h, g.out_w), (g.kh, g.kw), (g.sh, g.sw), (g.ph, g.pw))

    def costs(kw: int, edge: float):
        return layer_costs(np.int64(TPk), np.int64(g.P), np.int64(g.cout), g.kh * g.kw, bus, EngineTiming(),
                           R=g.npix, inside=im2col_inside(*shape), kw=kw, edge=edge)
    reads = im2col_row_reads(g, TPk, bus)
    merged, taps = costs(g.kw, im2col_edge(*shape)), costs(1, 0.0)      # kw = 1: every crossing a run
    assert float(merged.in_runs) == pytest.approx(reads.in_runs)
    assert (float(merged.in_runs) < float(taps.in_runs)) == merges
    assert reads.first_beats >= 0 and reads.first_runs >= 0
    assert float(merged.first_extra) >= 0 and float(taps.first_extra) == 0


def test_two_walkers_on_one_port_queue_for_it():
    """On one AXI port the DMA takes one command a cycle, so both walkers' commands queue for it, and
    back to back a step whose weight walker finishes last leaves the port a cycle empty (traced in the
    RTL: an FC layer on one 128-bit port, 8 one-beat weight rows and 1 input run a step, takes 10
    cycles a step; docs/interpretations.md, "Two walkers on one port"). Issuing (`fetch`) pays the
    commands of both, the pace (`rate`) the empty cycle too (by its convex envelope: none once the
    input runs outnumber the weight rows); on two ports neither: the longer stream, plus a cycle a
    step on the weight walker's."""
    from fluidnpu.dse.perf_model import DEFAULT_TIMING, layer_costs

    P, C, TPk, t, g = np.array(560), np.array(1), np.array(8), np.array(1), np.array(1)

    def fetch(bus: Bus, rows: np.ndarray, rate: bool) -> float:
        costs = layer_costs(TPk, P, C, 1, bus, DEFAULT_TIMING, R=1)
        fixed = costs.n_p * DEFAULT_TIMING.step_overhead + DEFAULT_TIMING.block_overhead
        tile = costs.tile(np.array(1), g)
        return float((costs.fetch(rows, tile, g, rate=rate) - fixed - tile.weight_cmds) / costs.n_p)

    one, two = Bus.of_ports(1, 16), Bus.of_ports(2, 16)
    # per step beyond the weight rows: the input run, and on one port while pacing the empty cycle by its
    # convex envelope in the input commands (1 - 1/8 of a cycle at 1 input run against 8 weight rows)
    assert fetch(one, t, rate=False) == pytest.approx(1.0, abs=0.1)
    assert fetch(one, t, rate=True) == pytest.approx(1.0 + 7 / 8, abs=0.1)
    assert fetch(two, t, rate=True) == pytest.approx(1.0, abs=0.1) == fetch(two, t, rate=False)
    # 12 input runs a step outnumber the 8 weight rows: the input walker finishes last, no empty cycle
    assert fetch(one, np.array(12), rate=True) == pytest.approx(fetch(one, np.array(12), rate=False))


def test_the_memory_floor_is_the_compulsory_traffic_or_the_macs():
    """`memory_floor_cycles`: a 1x1 convolution of few output channels is bound by moving its input
    and output once (at 22.7 B a cycle, a ZC706); a stride-2 1x1 one reads only the pixels its windows
    touch; a 3x3 convolution of 512 channels on 7x7 pixels is bound by its MACs on 900 multipliers."""
    from fluidnpu.dse.perf_model import memory_floor_cycles
    from fluidnpu.workload import Layer

    def conv(cin, cout, hw, k, s):
        out = hw // s
        return Layer(name="c", kind="conv", R=out * out, P=k * k * cin, C=cout, in_ch=cin, out_ch=cout,
                     in_hw=(hw, hw), out_hw=(out, out), kernel=(k, k), stride=(s, s))

    narrow = conv(256, 64, 56, 1, 1)
    moved = 2 * (4 * 3136 * (256 + 64) + 256 * 64) + 4 * 64
    assert memory_floor_cycles(narrow, 4, 900, 22.7) == pytest.approx(moved / 22.7)
    assert moved / 22.7 > 4 * narrow.macs / 900
    down = conv(256, 512, 56, 1, 2)
    assert memory_floor_cycles(down, 1, 1e9, 8.0) == pytest.approx(
        (2 * (784 * 256 + 784 * 512 + 256 * 512) + 4 * 512) / 8.0)
    deep = conv(512, 512, 7, 3, 1)
    assert memory_floor_cycles(deep, 4, 900, 22.7) == pytest.approx(4 * deep.macs / 900)


def test_steps_where_a_kernel_row_ends_are_priced_apart():
    """A 3x3 convolution of cin 64 with TPk = 14 (the ResNet-50/ZC706 pick's layer1 conv2): the two steps
    holding a kernel row's end (words 192 and 384, not multiples of 14) read two runs a row, the other
    40 one. On three 64-bit ports a one-run row (14 words, four beats) waits on the ports, a two-run row
    on its two commands, so each kind of step walks at its own pace: the block costs what its two kinds
    cost apart, more than the averaged step (the RTL's trace: 512 cycles for such a step of 256 rows,
    321-336 for the others; docs/interpretations.md, "Steps of two kinds"). The exact reads of the
    descriptor's geometry find the same two steps; a 1x1 layer has none."""
    from dataclasses import replace

    from fluidnpu.dse.perf_model import DEFAULT_TIMING, im2col_row_reads, layer_costs
    from fluidnpu.hw.descriptor import LayerDescriptor

    bus = Bus.of_ports(3, 8)
    TPk, P, C, t, groups = np.array(14), np.array(576), np.array(4), np.array(256), np.array(1)
    costs = layer_costs(TPk, P, C, 9, bus, DEFAULT_TIMING, R=256, kw=3)
    assert (float(costs.split_steps), float(costs.split_runs)) == (2, 4)
    tile = costs.tile(C, groups)
    together = float(replace(costs, split_steps=0.0).fetch(t, tile, groups))
    apart = float(costs.fetch(t, tile, groups))
    fixed = float(costs.n_p * DEFAULT_TIMING.step_overhead + DEFAULT_TIMING.block_overhead)
    assert apart > together
    assert apart - fixed >= 2 * 2 * 256 + (float(costs.in_beats) - float(costs.split_beats)) * 256 / 3
    geo = LayerDescriptor(layer=0, in_h=16, in_w=16, cin=64, out_h=16, out_w=16, cout=4, kh=3, kw=3, ph=1, pw=1)
    reads = im2col_row_reads(geo, 14, bus)
    assert reads.split_steps == 2 and reads.split_runs >= 4
    assert float(layer_costs(TPk, np.array(256), C, 1, bus, DEFAULT_TIMING, R=256).split_steps) == 0


def test_a_short_groups_zero_fills_follow_its_real_reads_on_several_ports():
    """Two packed groups, the second a short group's padding for `pad` of its rows, on two 64-bit ports:
    the padding's zero fills take no port, but they are each step's last input reads (the groups read in
    order), so the input stream's merge answers them one a cycle after the real reads the ports deliver:
    the block costs its weights' beats and its real rows' beats over the two ports, the restart, one cycle
    a zero fill and its fixed cycles (the RTL's ⟨16, 4, 4⟩ b = 3 layer: 19 cycles for a step of 8 real
    and 8 zero reads, 20 for 16 real ones; docs/interpretations.md, "A short group's padding")."""
    from fluidnpu.dse.perf_model import DEFAULT_TIMING, layer_costs

    tm = DEFAULT_TIMING
    costs = layer_costs(np.array(12), np.array(96), np.array(4), 1, Bus.of_ports(2, PORT64), tm, R=64)
    tile, t, g = costs.tile(np.array(4), np.array(2)), np.array(16), np.array(2)
    assert (costs.n_p, float(costs.in_runs), float(costs.in_beats)) == (8, 8.0, 24.0)   # 3-beat runs
    fixed = costs.n_p * tm.step_overhead + tm.block_overhead
    for pad in (0.0, 0.5, 1.0):
        real = (2 - pad) * 16 * 24 / 2                    # the real rows' beats, over two ports
        zeros = pad * 16 * 8                              # one cycle a padding run
        hand = float(tile.weight_beats) + real + costs.n_p * tm.port_restart + zeros + fixed
        assert float(costs.block(t, tile, g, pad=pad)) == pytest.approx(hand)


def test_rows_of_two_kinds_are_paced_apart():
    """In a padded 3x3 layer some rows of a step read differently from the others: a zero fill in the
    padding (one command, no beat) or, where a tap boundary cuts the step, two runs at the padding's
    edge. On three 64-bit ports a 14-word row waits on the ports and such a row on its commands, and
    each takes its own pace, not the step's sums at the longer of theirs (the RTL's trace of the
    pick-shaped layer: steps of 316 commands and 962-1,024 beats took 358-389 cycles, not 321-341;
    docs/interpretations.md, "Rows of two kinds"). The excess is what the exact reads find on several
    ports, none on one port (a row's beats are never fewer than its commands), none without padding
    (every row alike) and none where every row waits on its commands (TPk = 7, 2.5 beats); the DSE's
    estimate from the layer's counts is within a quarter of the exact one at ResNet-50's layer1 conv2."""
    from dataclasses import replace

    from fluidnpu.dse.perf_model import DEFAULT_TIMING, im2col_edge, im2col_inside, im2col_row_reads, layer_costs
    from fluidnpu.hw.descriptor import LayerDescriptor

    three, one = Bus.of_ports(3, 8), Bus.of_ports(1, 8)
    geo = dict(in_h=16, in_w=16, cin=64, out_h=16, out_w=16, cout=4, kh=3, kw=3)
    padded = LayerDescriptor(layer=0, ph=1, pw=1, **geo)
    assert im2col_row_reads(padded, 14, three).row_excess > 1.0          # cycles a row, over its 42 steps
    assert im2col_row_reads(padded, 14, one).row_excess == 0.0
    assert im2col_row_reads(padded, 7, three).row_excess == pytest.approx(0.0, abs=1e-9)
    unpadded = LayerDescriptor(layer=0, ph=0, pw=0, **{**geo, "out_h": 14, "out_w": 14})
    assert im2col_row_reads(unpadded, 14, three).row_excess == pytest.approx(0.0, abs=1e-9)
    # it reaches the block's fetch: t rows pay t times the excess
    costs = layer_costs(np.array(14), np.array(576), np.array(4), 9, three, DEFAULT_TIMING, R=256, kw=3)
    exact = replace(costs, row_excess=im2col_row_reads(padded, 14, three).row_excess)
    tile, t, g = costs.tile(np.array(4), np.array(1)), np.array(256), np.array(1)
    assert float(exact.fetch(t, tile, g) - replace(costs, row_excess=0.0).fetch(t, tile, g)) == pytest.approx(
        256 * exact.row_excess)
    # the DSE's estimate against the exact walk of ResNet-50's layer1 conv2 (56 x 56, cin 64)
    big = LayerDescriptor(layer=0, in_h=56, in_w=56, cin=64, out_h=56, out_w=56, cout=64, kh=3, kw=3, ph=1, pw=1)
    shape = ((56, 56), (56, 56), (3, 3), (1, 1), (1, 1))
    est = layer_costs(np.array(14), np.array(576), np.array(64), 9, three, DEFAULT_TIMING, R=3136, kw=3,
                      inside=im2col_inside(*shape), edge=im2col_edge(*shape)).row_excess
    assert float(est) == pytest.approx(im2col_row_reads(big, 14, three).row_excess, rel=0.25)
    assert float(layer_costs(np.array(7), np.array(576), np.array(64), 9, three, DEFAULT_TIMING, R=3136, kw=3,
                             inside=im2col_inside(*shape), edge=im2col_edge(*shape)).row_excess) == 0.0


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.integers(1, 8), st.integers(1, 60), st.data())
def test_padded_blocks_follow_the_short_groups_rows(R, BR, limit, data):
    """`padded_blocks` against the blocks walked row by row: a short group of n < BR samples has rows up
    to n*R of the pass's BR*R; each block's padding share is its rows beyond that."""
    from fluidnpu.dse.perf_model import _split, padded_blocks
    from fluidnpu.dse.tiling import _balanced

    n_short = data.draw(st.integers(0, BR - 1))
    rows = BR * R
    pad = (BR - n_short) / BR
    expected: dict[tuple[int, float], int] = {}
    for r0, r1 in _balanced(rows, limit):
        share = (r1 - max(r0, min(r1, n_short * R))) / (r1 - r0)
        key = (r1 - r0, round(share, 9))
        expected[key] = expected.get(key, 0) + 1
    got: dict[tuple[int, float], int] = {}
    for count, t, p in padded_blocks(_split(np.int64(rows), np.int64(limit)), rows, pad):
        if int(count):
            key = (int(t), round(float(p), 9))
            got[key] = got.get(key, 0) + int(count)
    assert got.keys() == expected.keys() and all(np.isclose(got[k], expected[k]) for k in got)
