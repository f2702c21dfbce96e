"""benchmarks/peak_gap.py's line-buffer budget: the input words a block of output pixels touches."""

from __future__ import annotations

import numpy as np

from fluidnpu.workload import Layer


def test_block_input_words_counts_the_input_rows_a_block_touches(benchmark_module):
    """A 3 x 3, pad 1 convolution of an 8 x 8 x 2 input: a block of two output rows touches three input
    rows at the top edge and four inside (the most: 4 x 8 x 2 = 64 words); a block of 80 pixels over two
    samples touches all 8 rows of the first and 3 of the second (176); stride 2 doubles the rows a
    block's output rows cover (an 8-pixel block of a 4 x 4 output: rows 1..5, 5 x 8 x 2 = 80)."""
    block_input_words = benchmark_module("peak_gap").block_input_words
    layer = Layer.conv("c", 2, 4, 8, 3, padding=1)
    assert block_input_words(layer, 1, 16) == 64
    assert block_input_words(layer, 2, 80) == 8 * 8 * 2 + 3 * 8 * 2
    assert block_input_words(layer, 2, 64) == 8 * 8 * 2                     # one sample a block
    strided = Layer.conv("s", 2, 4, 8, 3, stride=2, padding=1)
    assert strided.out_hw == (4, 4) and block_input_words(strided, 1, 8) == 5 * 8 * 2


def test_buffer_fill_waits_on_the_first_fill_double_buffered_and_on_every_fill_single(benchmark_module):
    """4,000 words at 2 B a word over 8 B a cycle fill in 1,000 cycles. Double-buffered behind blocks of
    5,000 cycles, only the first fill waits; behind blocks of 600 cycles each later fill waits its
    400 extra cycles; single-buffered every fill waits."""
    fill = benchmark_module("peak_gap").buffer_fill_cycles
    assert fill(4000, 6, 30000.0, True, 8.0) == 1000
    assert fill(4000, 6, 3600.0, True, 8.0) == 1000 + 5 * 400
    assert fill(4000, 6, 30000.0, False, 8.0) == 6 * 1000


def test_a_layers_blocks_and_buffer_words_follow_its_passes_and_tiles(benchmark_module):
    """A 3 x 3 convolution of an 8 x 8 x 2 input to 12 channels at b = 2 on <TR 16, TP 4, TC 4>, one group
    a pass (BR = 1): each sample's 64 output pixels make 4 blocks of 16 in each of 3 column tiles (24
    blocks), and a block of two output rows holds at most 4 input rows (4 x 8 x 2 = 64 words)."""
    from fluidnpu.dse.perf_model import DEFAULT_TIMING, Bus, row_blocks
    from fluidnpu.dse.search import Choice, LayerShapes, choice_setup, modes_of

    pg = benchmark_module("peak_gap")
    layer = Layer.conv("c", 2, 12, 8, 3, padding=1)
    shapes = LayerShapes.of([layer])
    TP, TC, TR = np.array([[4]]), np.array([[4]]), np.array([[16]])
    modes = modes_of(TP, TC, shapes, (0,), Bus.of(8.0), DEFAULT_TIMING)
    setup = choice_setup(modes, shapes, 2, Choice(BR=1, k_code=0, serial=False), 1)
    rb = row_blocks(setup, TR)
    assert pg.blocks_of(setup, rb, 0) == 3 * 2 * 4
    assert pg.buffer_words(layer, setup, rb, 0) == 64


def test_the_gap_of_the_zc706_design_sums_and_the_buffer_sits_between_bounds(benchmark_module):
    """`gap` end to end on ResNet-50 and a ZC706 design (given, not searched, without the block input
    buffer: 1 s): its parts sum to the
    DSE's cycles (asserted inside), its share is the DSE's GOp/s over the board peak, and a line
    buffer with its fill priced lands between the design as built and the buffer with a free fill,
    single-buffered below double-buffered, and so does the buffer as built (`as_built`)."""
    from fluidnpu.boards import load_board
    from fluidnpu.dse.search import DSEOptions, evaluate_design
    from fluidnpu.zoo import zoo_model

    pg = benchmark_module("peak_gap")
    opts = DSEOptions(bmax=8, ports=3, banks=2, stackable=True, buffer=False)
    g = pg.gap("resnet50", "zc706", batches=range(4, 5), design=(2091, 14, 64, opts))
    row = g["rows"][0]
    r = evaluate_design(zoo_model("resnet50"), load_board("zc706"), 2091, 14, 64, opts)
    assert abs(row["gops"] - r.gops[3]) < 1e-6 * r.gops[3]
    assert abs(sum(row["shares"].values()) - 1) < 1e-9
    lb = row["line_buffer"]
    fp = lb["fill_priced"]
    assert row["board_peak_share"] < fp["single_buffered_board_peak_share"] <= fp["board_peak_share"]
    assert fp["board_peak_share"] < lb["board_peak_share_without"]
    assert fp["layers"]["double"] > 0 and lb["free_ram36"] > lb["largest_fitting_ram36"]
    # the buffer as built, priced layer by layer by the model calibrated on the RTL's buffered layers:
    # above the design as built, below the free fill, its two halves in the RAM the design leaves
    built = lb["as_built"]
    assert row["board_peak_share"] < built["board_peak_share"] < lb["board_peak_share_without"]
    assert built["layers"] > 0 and 0 < built["ram36"] <= lb["free_ram36"]
