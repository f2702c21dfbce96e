"""Resource model: DSP, BRAM36, URAM, LUT and FF of an NPU <TR, TP, TC>.

DSPs: one 16-bit MAC per DSP slice, TP * TC in all (the adder tree rides the
DSP cascade). On-chip memories follow the buffer organisation in
docs/interpretations.md and are mapped onto RAM primitives at their real
granularity: a BRAM36 (or half of one, a BRAM18) in any of its aspect ratios,
or a 4K x 72 UltraRAM. LUT and FF terms for control, the Fluid Batching
Control Block and the Stackable-PE multiplexers are linear models whose
constants are calibrated against Yosys synthesis of the RTL.

All functions broadcast over numpy arrays so the DSE can size every design at once.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from itertools import product
from typing import Any

import numpy as np

from fluidnpu.boards.catalog import Board
from fluidnpu.dse.perf_model import ArrayLike, windows
from fluidnpu.hw.regmap import (
    BUFFER_LANES,
    BUFFERS,
    bank_select_bits,
    buffer_banks,
    buffer_window,
    chain_count,
    fbcb_entry_bits,
    input_banks,
    longest_chain,
    nmax,
    skew_words,
)
from fluidnpu.hw.synth import LUTRAM_LUTS

# (depth, width, cost in BRAM36 units) for every BRAM aspect ratio; BRAM18 halves cost 0.5.
BRAM_SHAPES: tuple[tuple[int, int, float], ...] = (
    (32768, 1, 1.0), (16384, 2, 1.0), (8192, 4, 1.0), (4096, 9, 1.0), (2048, 18, 1.0), (1024, 36, 1.0), (512, 72, 1.0),
    (16384, 1, 0.5), (8192, 2, 0.5), (4096, 4, 0.5), (2048, 9, 0.5), (1024, 18, 0.5), (512, 36, 0.5),
)
URAM_DEPTH, URAM_WIDTH = 4096, 72

WORD_BITS = 16
ACC_BITS = 32


@dataclass(frozen=True)
class LogicCosts:
    """LUT/FF model constants, one per structure of the RTL that grows with the design.

    The NPU is two parts (docs/resources.md): the *control* (hw/sequencer.py, hw/registers.py and
    the top's glue, plus the AXI DMA hw/dma.py), whose datapaths carry DMA vectors of NMAX =
    max(2TP, 2TC, 16) words and the core's write ports (2TP input lanes, 2TC weight words),
    and the *engine* (hw/engine_core.py): per PE (TC) an accumulate adder pair, requantisers,
    bias registers and the group match of its weight/bias writes; per MAC (TP*TC) the adder-tree
    adder, pipeline and weight registers with their write enables; and the operand multiplexers
    that pick each PE's row from NB input banks (16*TP*TC*NB inputs). There is no replication
    network: each sample group's copy of the weights is a DMA read of its own, which the
    performance model prices (docs/hw-architecture.md, "Giving every group its weights").

    Each part is fitted on its own units synthesized alone by Yosys 0.70 `synth_xilinx -family xc7`
    with the hierarchy kept (so a unit alone counts what it counts inside the NPU):
    * the DMA (`*_axi_port*`, `lut_per_merge_word`): AxiDma alone at NMAX 32 and 128 with 1, 2 and 4
      ports (benchmarks/synth_axi_ports.py); every one of the P ports is a ReadEngine + WriteEngine;
    * the rest of the control (`lut_base` .. `*_per_bank`): the Sequencer and the register block
      alone, from small designs up to the ResNet-50 / ZC706 pick (benchmarks/synth_calibration.py,
      scope "control");
    * the engine: EngineCore alone, from TP*TC = 4 up to that pick's 896 MACs (scope "engine").
    docs/resources.md has the tables, residuals and leave-one-out errors.
    `*_per_stack_pair` are not fitted with the rest (the sweep's engines all have Stackable PEs):
    they are what an engine built with `stackable=False` (the plain-PE baselines and picks) saves per
    PE pair beyond half its bank-multiplexer inputs, measured on plain engines against their
    stackable twins (docs/resources.md).
    """

    # control: sequencer, AXI4-Lite registers (with the FBCB), top glue
    lut_base: float = 3755.0
    ff_base: float = 3132.0
    lut_per_dma_word: float = 59.3       # per 16-bit word of NMAX: response and write slices, the writer's row shifter
    ff_per_dma_word: float = 44.0
    lut_per_port_word: float = 74.5      # per word of the core's write ports (2TP + 2TC) the sequencer assembles
    ff_per_port_word: float = 31.7
    lut_per_bank: float = 389.0          # per input bank (NB): group placement and rotation state, the writer's
                                         # second set of output cursors a group (a row block's later tiles)
    ff_per_bank: float = 324.0
    # the DMA, per AXI port (hw/dma.py AxiDma: a ReadEngine + WriteEngine each)
    lut_per_axi_port: float = 700.0      # burst planning, address queues, outstanding counters, one-beat shifters
    ff_per_axi_port: float = 411.0
    lut_per_axi_port_word: float = 39.9  # per NMAX word: response slots and register, W queue (LUT RAM) and beat select
    ff_per_axi_port_word: float = 48.2
    lut_per_merge_word: float = 37.9     # per NMAX word and N:1 select LUT level (`merge_luts`), N > 1: each
                                         # stream's response select over the ports, its ready, the deal
    lut_per_zero_word: float = 20.3      # per NMAX word where the select fills its LUT6s (`zero_luts`): the
                                         # input stream's zero-read answer, a gate after its select
    ff_per_split_word: float = 17.9      # per port and NMAX word, N > 1: the second stream's response register
                                         # (`ReadEngine(two_streams=True)`) and the command slice's skid register
    # engine
    lut_core_base: float = 58.9
    ff_core_base: float = 655.0
    lut_per_pe: float = 748.0            # accumulate adders, requantise/saturate/ReLU, bias selection
    ff_per_pe: float = 350.0             # bias registers, accumulate and post-processing registers
    lut_per_mac: float = 26.1            # weight-register write enables and buffer select
    ff_per_mac: float = 34.9             # double-buffered weight registers, operand registers
    lut_per_tree_adder: float = 32.0     # a fabric adder of a PE's tree over its DSP chains (chains - 1)
    ff_per_tree_adder: float = 32.0      # its pipeline register and the shorter chains' alignment
    lut_per_mux_input_bit: float = 0.567 # bank -> operand multiplexers (one LUT6 is a 4:1 mux)
    lut_per_bank_word: float = 27.9       # per 16-bit word of each bank's row: its lo/hi memory select
    ff_per_skew_bit: float = 1.0         # one register per bit and cycle of the chains' operand skew
    lut_per_stack_pair: float = 548.0    # measured, not fitted (see above)
    ff_per_stack_pair: float = 202.0


DEFAULT_LOGIC = LogicCosts()


@dataclass(frozen=True)
class WidePortCosts:
    """What the 64-bit-port DMA terms (LogicCosts) leave out: the DMA's read/write engines grow with
    the data width, and more so the more NMAX words a command holds. Fitted by
    benchmarks/synth_axi_ports.py: AxiDma alone, four 128-bit ports against four 64-bit ones at NMAX 32
    and 128 (the ZCU104 picks' DMA).

    The family itself adds nothing: the same EngineCore maps to the same FFs and to LUTs within 2 % on
    xc7 and xcup once the DSP48E2s are packed as a vendor flow packs them (hw/synth.py; six plain and
    Stackable twins, docs/figures/resources/xcup_engines.json), so one fit prices both."""

    lut_per_port_bit: float = 9.04       # per AXI port, per data bit beyond 64
    lut_per_port_bit_word: float = 0.0446  # the same, per NMAX word
    ff_per_port_bit: float = 1.95


DEFAULT_WIDE_PORTS = WidePortCosts()
FABRICS = {"zynq7000": "xc7", "zynqmp": "xcup"}


def fabric_of(board: Board) -> str:
    """Yosys's family for a board: xcup for Zynq UltraScale+ (zynqmp), else xc7."""
    return FABRICS.get(board.family, "xc7")


def wide_port_logic(port_bits: int, axi_ports: int, nmax: np.ndarray,
                    costs: WidePortCosts = DEFAULT_WIDE_PORTS) -> tuple[np.ndarray, float]:
    """(LUT, FF) the AXI ports add beyond the 64-bit-port fit, for DMA commands of NMAX words."""
    wide = axi_ports * max(0, port_bits - 64)
    return (wide * (costs.lut_per_port_bit + costs.lut_per_port_bit_word * np.asarray(nmax)),
            wide * costs.ff_per_port_bit)


def bram36_for(depth: np.ndarray, width: np.ndarray) -> np.ndarray:
    """BRAM36 units for one memory of depth x width bits, best aspect ratio."""
    depth = np.asarray(depth)
    width = np.asarray(width)
    best = np.full(np.broadcast(depth, width).shape, np.inf)
    for d, w, cost in BRAM_SHAPES:
        best = np.minimum(best, -(-depth // d) * -(-width // w) * cost)
    return np.where(depth > 0, best, 0.0)


# Yosys maps a memory deeper than one BRAM36 to the shape of least cost, a BRAM36 counting as 7.5 levels of
# the read multiplexer its depth cascade needs (any weight in (7, 8) fits all 17 one-bank syntheses of
# docs/figures/resources/buffer_bank_depths.json; the fewest BRAM36 alone misses 4 of them, the pick's included)
BUFFER_MUX_LEVELS_PER_BRAM36 = 7.5
BUFFER_BANK_BITS = 16 * BUFFER_LANES


def buffer_bank_bram36(rows: ArrayLike) -> np.ndarray:
    """BRAM36 of one block-input-buffer bank of `rows` rows (both halves) of BUFFER_BANK_BITS bits, as Yosys
    `synth_xilinx` maps it: of the RAMB36 shapes (512 x 72 ... 32K x 1, side by side for the width,
    cascaded for the depth) the one of least count + (cascade depth - 1) / BUFFER_MUX_LEVELS_PER_BRAM36.
    So a deep bank may take a BRAM36 more than the fewest that hold it (18,822 rows: 38 in 1K x 36 pairs
    where 37 of 512 x 72 would do, with a 37:1 read multiplexer)."""
    rows = np.asarray(rows)
    best_cost = np.full(rows.shape, np.inf)
    best = np.zeros(rows.shape)
    for depth, width, unit in BRAM_SHAPES:
        if unit != 1.0:
            continue
        deep = -(-rows // depth)
        count = deep * -(-BUFFER_BANK_BITS // width)
        cost = count + (deep - 1) / BUFFER_MUX_LEVELS_PER_BRAM36
        better = cost < best_cost
        best_cost, best = np.where(better, cost, best_cost), np.where(better, count, best)
    return np.where(rows > 0, best, 0.0)


@functools.lru_cache(maxsize=1)
def _bank_rows_table(most: int = 4096) -> np.ndarray:
    """[n]: the most rows a buffer bank of at most n BRAM36 holds (`buffer_bank_bram36` grows with the
    rows, so a binary search per n is exact), for n up to `most`."""
    n = np.arange(most + 1)
    lo, hi = np.zeros(n.shape, dtype=np.int64), 512 * n + 1      # lo fits, hi does not
    while (hi - lo > 1).any():
        mid = (lo + hi) // 2
        ok = buffer_bank_bram36(mid) <= n
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return lo


def input_buffer_bram36(TP: int, words: float) -> float:
    """BRAM36 of a block input buffer (hw/input_buffer.py) whose halves hold `words` words each, as the
    RTL builds it and Yosys maps it: `buffer_banks(TP)` banks of BUFFER_LANES 16-bit words a row, each
    bank both halves deep (`buffer_bank_bram36`), its rows whole windows of banks x lanes words. Yosys
    maps the ResNet-50/ZC706 pick's buffer (TP 14, halves of 301,152 words) to 304
    (docs/figures/resources/input_buffer_points.json)."""
    rows = -(-int(np.ceil(words)) // buffer_window(TP))
    return buffer_banks(TP) * float(buffer_bank_bram36(np.asarray(2 * rows)))


# The block input buffer beside the engine (hw/buffered_input.py), fitted on Yosys `synth_xilinx`
# (docs/figures/resources/input_buffer_points.json): InputBuffer at TP 7 / 14 / 28 and 4,096 / 32,768 /
# 146,944 words a half, its FillWalker, and the control units <256, 14, 4> and <256, 14, 64> with and
# without the buffer, whose difference less those two is the join (region table, pairing FIFO, run
# slices, the answers' skid buffer and the fill's NMAX-word hand-over: it grows with NMAX).
BUFFER_LUT_BASE = 998.0            # the rotator's and shift's control, the fill port
BUFFER_LUT_PER_BANK = 210.5        # a bank's write and read multiplexing, its rotator input
BUFFER_LUT_PER_DEEP_BRAM36 = 30.6  # each BRAM36 of a bank past 4: Yosys cascades them in depth behind a read mux
BUFFER_FF_PER_LANE = 32            # the 2 TP answer words, registered
BUFFER_FF_BASE = 64
BUFFER_WALKER = (610, 283)         # FillWalker (LUT, FF)
BUFFER_JOIN = (1_113.1, 862.2)     # the join in the control unit (LUT, FF) ...
BUFFER_JOIN_PER_WORD = (34.71, 15.67)   # ... and per NMAX word (`dma_words`)


def buffer_banks_of(TP: np.ndarray) -> np.ndarray:
    """`regmap.buffer_banks` of every TP in an array (a window is banks x BUFFER_LANES words)."""
    return windows(TP) // BUFFER_LANES


def input_buffer_per_bank(TP: int, words: int) -> float:
    """BRAM36 a bank of a block input buffer of `words` words a half (0: none): what its LUTs and
    its read path's depth grow with."""
    return input_buffer_bram36(TP, words) / int(buffer_banks_of(np.array(TP))) if words else 0.0


def input_buffer_words(TP: np.ndarray, per_bank: np.ndarray) -> np.ndarray:
    """Words a half of the largest block input buffer of at most `per_bank` BRAM36 a bank (the inverse of
    `input_buffer_bram36`): half a bank's rows (`_bank_rows_table`), a row a window."""
    table = _bank_rows_table()
    return table[np.minimum(np.asarray(per_bank, dtype=np.int64), table.size - 1)] // 2 * windows(TP)


def buffer_join_logic(TP: np.ndarray, TC: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(LUT, FF) of the block input buffer's join to the control unit of an engine <TP, TC>."""
    words = dma_words(TP, TC)
    return BUFFER_JOIN[0] + BUFFER_JOIN_PER_WORD[0] * words, BUFFER_JOIN[1] + BUFFER_JOIN_PER_WORD[1] * words


def input_buffer_logic(TP: np.ndarray, TC: np.ndarray, per_bank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(LUT, FF) of the block input buffer, its fill walker and its join to the control unit of an engine
    <TP, TC>, at `per_bank` BRAM36 a bank."""
    banks = buffer_banks_of(TP)
    join_lut, join_ff = buffer_join_logic(TP, TC)
    lut = (join_lut + BUFFER_WALKER[0] + BUFFER_LUT_BASE + BUFFER_LUT_PER_BANK * banks
           + BUFFER_LUT_PER_DEEP_BRAM36 * banks * np.maximum(np.asarray(per_bank) - 4, 0))
    ff = join_ff + BUFFER_WALKER[1] + BUFFER_FF_BASE + BUFFER_FF_PER_LANE * np.asarray(TP)
    return np.ceil(lut), np.ceil(ff)


def buffer_room(TR: np.ndarray, TP: np.ndarray, TC: np.ndarray, board: Board, bmax: int, n_layers: int,
                stackable: bool, *, banks: int | None = None, ports: int | None = None) -> np.ndarray:
    """BRAM36 a bank the largest block input buffer a design leaves room for may take (0: none fits):
    the BRAM its memories leave under the ceiling, as deep as its LUTs (the deep banks' read muxes)
    and FFs allow."""
    bram, _, mem_ok = memory_use(TR, TP, TC, board, bmax, banks=banks)
    fabric = fabric_of(board)
    lut, ff = logic_use(TP, TC, bmax, n_layers, stackable, axi_ports=ports or board.npu_axi_ports, banks=banks,
                        port_bits=board.hp_width_bits, buffer=True, fabric=fabric)
    nb = buffer_banks_of(TP)
    left = board.limit("bram36") - fbcb_bram36(n_layers, bmax, True, fabric) - np.where(mem_ok, bram, np.inf)
    by_bram = np.floor(left / nb)
    lut4, bff = input_buffer_logic(TP, TC, 4)
    lut_left = board.limit("lut") - lut - lut4
    by_lut = np.where(lut_left >= 0, 4 + np.floor(np.maximum(lut_left, 0) / (BUFFER_LUT_PER_DEEP_BRAM36 * nb)), 0)
    ok = (ff + bff <= board.limit("ff"))
    return np.where(ok, np.maximum(np.minimum(by_bram, by_lut), 0), 0).astype(np.int64)


def uram_for(depth: np.ndarray, width: np.ndarray) -> np.ndarray:
    depth = np.asarray(depth)
    return np.where(depth > 0, -(-depth // URAM_DEPTH) * -(-np.asarray(width) // URAM_WIDTH), 0)


def memories(TR: np.ndarray, TP: np.ndarray, TC: np.ndarray, bmax: int, *,
             banks: int | None = None) -> list[tuple[str, int, np.ndarray, np.ndarray]]:
    """The engine's buffer memories as (name, count, depth, width_bits), exactly as
    hw/engine_core.py builds them (docs/hw-architecture.md, "EngineCore"):

    input: NB banks, each two memories (lanes [0,TP) and [TP,2TP)) of both `ib` halves,
    2 * ceil(ceil(TR/NB) / 2) rows of TP lanes; accumulators: two memories of ceil(TR/2)
    rows of TC 32-bit words; output staging: two memories holding both `sb` halves,
    2 * ceil(TR/2) rows of TC 16-bit words. The control's small memories (FBCB, DMA and
    sequencer FIFOs) are LUT RAM and priced with the logic.
    """
    TR, TP, TC = np.asarray(TR), np.asarray(TP), np.asarray(TC)
    nb = banks or input_banks(bmax)
    half = -(-TR // 2)
    shapes = ((2 * nb, 2 * -(-TR // nb // 2), WORD_BITS * TP),      # input
              (2, half, ACC_BITS * TC),                                    # accumulator
              (2, 2 * half, WORD_BITS * TC))                               # output
    return [(name, *shape) for name, shape in zip(BUFFERS, shapes)]


def _placements(TR: np.ndarray, TP: np.ndarray, TC: np.ndarray, board: Board, bmax: int, *,
                banks: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[bool, ...]]]:
    """(bram36, uram, choice, choices): per design, the index into `choices` (one in-URAM flag per
    memory of `memories`) of the placement memory_use keeps, -1 where none fits."""
    mems = memories(TR, TP, TC, bmax, banks=banks)
    bram_limit, uram_limit = board.limit("bram36"), board.limit("uram")
    as_bram = [count * bram36_for(depth, width) for _, count, depth, width in mems]
    as_uram = [count * uram_for(depth, width) for _, count, depth, width in mems]
    shape = np.broadcast(np.asarray(TR), np.asarray(TP), np.asarray(TC)).shape
    best_b = np.full(shape, np.inf)
    best_u = np.full(shape, np.inf)
    best_score = np.full(shape, np.inf)
    best_choice = np.full(shape, -1)
    choices = [c for c in product((False, True), repeat=len(mems)) if board.uram or not any(c)]
    for i, choice in enumerate(choices):
        b = sum((np.zeros(shape) if in_uram else br) for in_uram, br in zip(choice, as_bram))
        u = sum((uu if in_uram else np.zeros(shape)) for in_uram, uu in zip(choice, as_uram))
        fits = (b <= bram_limit) & (u <= uram_limit)
        score = np.maximum(b / max(board.bram36, 1), u / max(board.uram, 1) if board.uram else 0.0)
        better = fits & (score < best_score)
        best_b = np.where(better, b, best_b)
        best_u = np.where(better, u, best_u)
        best_score = np.where(better, score, best_score)
        best_choice = np.where(better, i, best_choice)
    return best_b, best_u, best_choice, choices


def memory_use(TR: np.ndarray, TP: np.ndarray, TC: np.ndarray, board: Board, bmax: int, *,
               banks: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bram36, uram, feasible) choosing, per design, the BRAM/URAM placement of
    each memory that fits under the board's ceilings and leaves the lowest peak utilisation."""
    best_b, best_u, choice, _ = _placements(TR, TP, TC, board, bmax, banks=banks)
    return best_b, best_u, choice >= 0


def memory_placement(TR: int, TP: int, TC: int, board: Board, bmax: int, *,
                     banks: int | None = None) -> tuple[float, float, dict[str, str]]:
    """(bram36, uram, where each buffer goes {memory: "bram" | "uram"}) of one design, as memory_use
    prices it ({} and inf when no placement fits). The bundle carries the placement and the RTL marks
    each memory with it (`ram_style`), so Vivado and Yosys build the placement the DSE counted rather
    than choosing their own."""
    bram, uram, choice, choices = _placements(np.array(TR), np.array(TP), np.array(TC), board, bmax, banks=banks)
    if int(choice) < 0:
        return float(bram), float(uram), {}
    return float(bram), float(uram), {name: "uram" if in_uram else "bram"
                                      for name, in_uram in zip(BUFFERS, choices[int(choice)])}


def dma_words(TP: np.ndarray, TC: np.ndarray) -> np.ndarray:
    """NMAX (`fluidnpu.hw.regmap.nmax`) of whole design spaces: the DMA and sequencer
    datapaths are this wide."""
    return np.asarray(nmax(np.asarray(TP), np.asarray(TC)))


# Yosys's `memory_libmap` LUT RAM definitions (techlibs/xilinx/lutrams_*.txt): per fabric the simple
# dual-port RAM's cost, its widthscale and its (address bits, width, primitive) shapes, each primitive
# taking the LUTs hw/synth.py counts for it (LUTRAM_LUTS); a RAMB18 costs 129
LUTRAM_LIBRARY = {"xc7": (8, 7, ((5, 6, "RAM32M"), (6, 3, "RAM64M"))),
                  "xcup": (16, 16, ((5, 14, "RAM32M16"), (6, 7, "RAM64M8")))}
RAMB18_COST = 129


def lutram_choice(depth: int, width: int, fabric: str = "xc7") -> tuple[float, int]:
    """(cost, LUTs) of a depth x width memory in LUT RAM, in the shape Yosys's memory_libmap picks: the
    cheapest by its score of a configuration, (cost - widthscale) per primitive + widthscale per
    unit-width slice of every chunk, half a LUT per read-mux bit and per write-demux chunk, and 2 for its one
    emulation point (docs/resources.md, "The FBCB's RAMB18")."""
    cost, scale, shapes = LUTRAM_LIBRARY[fabric]
    best = (float("inf"), 0)
    for abits, unit, primitive in shapes:
        chunks = -(-depth // 2 ** abits)
        prims = chunks * -(-width // unit)
        score = (cost - scale) * prims + scale * chunks * width / unit + 0.5 * (chunks - 1) * width + 0.5 * chunks + 2
        best = min(best, (score, LUTRAM_LUTS[primitive] * prims))
    return best


def fbcb_ramb18s(n_layers: int, bmax: int, buffer: bool = False) -> int:
    """RAMB18s the FBCB takes in block RAM: 2K x 9 each (one up to 2,048 entries of up to 9 bits)."""
    return -(-(n_layers * bmax) // 2048) * -(-fbcb_entry_bits(bmax, buffer) // 9)


def fbcb_in_bram(n_layers: int, bmax: int, buffer: bool = False, fabric: str = "xc7") -> bool:
    """Whether Yosys maps the FBCB (L*Bmax entries of fbcb_entry_bits) to RAMB18s rather than LUT RAM:
    where its LUT RAM costs more than the RAMB18s (27 measured shapes on xc7 and xcup, all as this says,
    each a single RAMB18; docs/figures/resources/fbcb_shapes.json)."""
    cost, _ = lutram_choice(n_layers * bmax, fbcb_entry_bits(bmax, buffer), fabric)
    return cost > RAMB18_COST * fbcb_ramb18s(n_layers, bmax, buffer)


def fbcb_bram36(n_layers: int, bmax: int, buffer: bool = False, fabric: str = "xc7") -> float:
    """BRAM36 of the FBCB: half a BRAM36 a RAMB18 where Yosys puts it in block RAM (`fbcb_in_bram`), else 0."""
    return 0.5 * fbcb_ramb18s(n_layers, bmax, buffer) if fbcb_in_bram(n_layers, bmax, buffer, fabric) else 0.0


def fbcb_lutram(n_layers: int, bmax: int, buffer: bool = False, fabric: str = "xc7") -> int:
    """LUTs of the FBCB memory (L*Bmax entries of fbcb_entry_bits) where it stays in distributed RAM, in
    the shape Yosys picks (`lutram_choice`; 0 where it is a RAMB18, `fbcb_in_bram`). The paper keeps the
    FBCB in registers; `Resources.fbcb_ff` gives that count for comparison."""
    if fbcb_in_bram(n_layers, bmax, buffer, fabric):
        return 0
    return lutram_choice(n_layers * bmax, fbcb_entry_bits(bmax, buffer), fabric)[1]


def merge_luts(axi_ports: int) -> int:
    """LUT6s a bit of one N:1 select takes (0 on one port): a LUT6 is a 4:1 multiplexer (4 data and 2
    select inputs), and the slice's MUXF7/F8 join up to four of them for free (the DMA's per-stream
    merge: one select per stream, so 2 to 4 ports cost the same)."""
    return 0 if axi_ports <= 1 else -(-axi_ports // 4)


def zero_luts(axi_ports: int) -> int:
    """LUT6s a bit of the input stream's zero-read answer takes after its N:1 select (hw/dma.py answers a
    zero read of the input walker itself on several ports): none where the select's LUT6 has an input
    left (2 ports: 2 data + 1 select; 3: 3 + 2), one where the select fills it (4 data + 2 select)."""
    return int(axi_ports > 1 and axi_ports % 4 == 0)


def dma_logic(nmax: np.ndarray, axi_ports: int = 1, costs: LogicCosts = DEFAULT_LOGIC, port_bits: int = 64,
              wide: WidePortCosts = DEFAULT_WIDE_PORTS) -> tuple[np.ndarray, np.ndarray]:
    """(LUT, FF) of the AXI DMA (hw/dma.py AxiDma): a ReadEngine + WriteEngine per port, NMAX words
    wide, `port_bits` wide on the bus, and, with more than one port, the deal of the two read streams and
    their per-stream response merge: each stream selects its next response among the N ports' (one
    N:1 select of NMAX words a stream, `merge_luts`), the input stream's zeros after it (`zero_luts`);
    each port then keeps a response register per stream and a skid register before its command slice
    (`ff_per_split_word`)."""
    nmax = np.asarray(nmax)
    xl, xf = wide_port_logic(port_bits, axi_ports, nmax, wide)
    lut = axi_ports * (costs.lut_per_axi_port + costs.lut_per_axi_port_word * nmax) \
        + (merge_luts(axi_ports) * costs.lut_per_merge_word
           + zero_luts(axi_ports) * costs.lut_per_zero_word) * nmax + xl
    split = costs.ff_per_split_word if axi_ports > 1 else 0.0
    ff = axi_ports * (costs.ff_per_axi_port + (costs.ff_per_axi_port_word + split) * nmax) + xf
    return lut, ff


def control_logic(TP: np.ndarray, TC: np.ndarray, bmax: int, n_layers: int,
                  costs: LogicCosts = DEFAULT_LOGIC, axi_ports: int = 1, *,
                  banks: int | None = None, port_bits: int = 64, buffer: bool = False,
                  fabric: str = "xc7") -> tuple[np.ndarray, np.ndarray]:
    """(LUT, FF) of the control part: sequencer, registers (with the FBCB), top glue and the DMA
    with `axi_ports` AXI masters P (the DSE's choice, at most the board's HP ports) of `port_bits`;
    `buffer`: the FBCB entries carry the BUFFERED bit (the buffer itself: `input_buffer_logic`);
    `fabric`: Yosys's family, which decides whether the FBCB is LUT RAM or a RAMB18 (`fbcb_in_bram`)."""
    TP, TC = np.asarray(TP), np.asarray(TC)
    nmax, ports, nb = dma_words(TP, TC), 2 * TP + 2 * TC, banks or input_banks(bmax)
    dl, df = dma_logic(nmax, axi_ports, costs, port_bits)
    lut = (costs.lut_base + costs.lut_per_dma_word * nmax + costs.lut_per_port_word * ports
           + costs.lut_per_bank * nb + fbcb_lutram(n_layers, bmax, buffer, fabric) + dl)
    ff = (costs.ff_base + costs.ff_per_dma_word * nmax + costs.ff_per_port_word * ports
          + costs.ff_per_bank * nb + fbcb_entry_bits(bmax, buffer) + df)
    return lut, ff


def skew_bits(TP: np.ndarray, TC: np.ndarray, banks: int, stackable: bool) -> np.ndarray:
    """Register bits of the DSP chains' operand skew (hw/engine_core.py, stage 1 + r): each bank's
    row words delayed by their lanes' chain positions (`regmap.skew_words`), once for the lower
    lanes and, with Stackable PEs, once for the k = 2 upper lanes; each PE's bank select delayed
    up to the longest chain (its k = 1/2 upper half's too, with Stackable PEs)."""
    copies = 2 if stackable else 1
    return copies * (WORD_BITS * banks * skew_words(TP)
                     + TC * bank_select_bits(int(banks)) * (longest_chain(TP) - 1))


def engine_logic(TP: np.ndarray, TC: np.ndarray, bmax: int, stackable: bool,
                 costs: LogicCosts = DEFAULT_LOGIC, *, banks: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(LUT, FF) of the engine (hw/engine_core.py) outside its buffer memories. `banks`: NB, the
    input banks (None: the most Bmax uses); the operand multiplexers grow with it, so static R /
    FC-only designs (2 banks) and fluid designs the DSE builds with fewer banks cost less. A PE's
    lanes are summed in DSP cascades (`regmap.chains`) whose adders cost no LUTs; only the tree
    over each PE's chain outputs is fabric."""
    TP, TC = np.asarray(TP), np.asarray(TC)
    nb = banks or input_banks(bmax)
    adders = TC * (chain_count(TP) - 1)
    lut = (costs.lut_core_base + costs.lut_per_pe * TC + costs.lut_per_mac * TP * TC
           + costs.lut_per_tree_adder * adders + costs.lut_per_mux_input_bit * WORD_BITS * TP * TC * nb
           + costs.lut_per_bank_word * nb * TP)
    ff = (costs.ff_core_base + costs.ff_per_pe * TC + costs.ff_per_mac * TP * TC
          + costs.ff_per_tree_adder * adders + costs.ff_per_skew_bit * skew_bits(TP, TC, nb, stackable))
    if not stackable:
        # the fitted terms include the Stackable-PE logic (every sweep engine has it); a plain-PE
        # engine (k = 1 only) lacks the k=2 upper lanes' and the k=1/2 upper halves' bank selects
        # (half the multiplexer inputs) and, per PE pair, the pair adder, the k=1/2 half-tree
        # taps, upper-half bias registers and lane multiplexers
        lut = lut - (costs.lut_per_mux_input_bit * WORD_BITS * TP * TC * nb * 0.5
                     + (TC // 2) * costs.lut_per_stack_pair)
        ff = ff - (TC // 2) * costs.ff_per_stack_pair
    return lut, ff


def logic_use(TP: np.ndarray, TC: np.ndarray, bmax: int, n_layers: int, stackable: bool,
              costs: LogicCosts = DEFAULT_LOGIC, axi_ports: int = 1, *,
              banks: int | None = None, port_bits: int = 64, buffer: bool = False,
              fabric: str = "xc7") -> tuple[np.ndarray, np.ndarray]:
    """(LUT, FF) estimate of the whole NPU: control + engine, LUTs rounded up. LUTs of the
    engine's buffers do not count: the DSE places them in BRAM/URAM (memory_use). `port_bits`
    (the AXI ports' data width) adds what the 64-bit-port fit leaves out; the FPGA family adds
    nothing (WidePortCosts)."""
    cl, cf = control_logic(TP, TC, bmax, n_layers, costs, axi_ports, banks=banks, port_bits=port_bits, buffer=buffer,
                           fabric=fabric)
    el, ef = engine_logic(TP, TC, bmax, stackable, costs, banks=banks)
    return np.ceil(cl + el), np.ceil(cf + ef)


@dataclass(frozen=True)
class Resources:
    dsp: int
    bram36: float   # BRAM18 halves count 0.5; inf when the memories fit no placement
    uram: float
    lut: int
    ff: int
    fbcb_ff: int    # FBCB bits: the paper's register count (the RTL keeps the FBCB in LUT RAM or a RAMB18)
    placement: dict[str, str] = field(default_factory=dict)   # memory_placement: what the RTL builds

    def utilisation(self, board: Board) -> dict[str, float]:
        return {
            "dsp": self.dsp / board.dsp,
            "bram36": self.bram36 / board.bram36 if board.bram36 else 0.0,
            "uram": self.uram / board.uram if board.uram else 0.0,
            "lut": self.lut / board.lut,
            "ff": self.ff / board.ff,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def design_resources(TR: int, TP: int, TC: int, board: Board, bmax: int, n_layers: int, stackable: bool, *,
                     banks: int | None = None, ports: int | None = None, input_buffer: int = 0) -> Resources:
    """Resources of one design (scalar convenience around the vector model); `ports`: its AXI
    masters (None: the board's, `Board.npu_axi_ports`); `input_buffer`: words a half of its block
    input buffer (0: none)."""
    bram, uram, placement = memory_placement(TR, TP, TC, board, bmax, banks=banks)
    buffer = input_buffer > 0
    fabric = fabric_of(board)
    bram += fbcb_bram36(n_layers, bmax, buffer, fabric)
    lut, ff = logic_use(np.array(TP), np.array(TC), bmax, n_layers, stackable,
                        axi_ports=ports or board.npu_axi_ports, banks=banks,
                        port_bits=board.hp_width_bits, buffer=buffer, fabric=fabric)
    if buffer:
        ram = input_buffer_bram36(TP, input_buffer)
        bl, bf = input_buffer_logic(np.array(TP), np.array(TC), input_buffer_per_bank(TP, input_buffer))
        bram, lut, ff = bram + ram, lut + bl, ff + bf
    return Resources(dsp=int(TP * TC), bram36=bram, uram=uram, lut=int(lut), ff=int(ff),
                     fbcb_ff=n_layers * bmax * fbcb_entry_bits(bmax, buffer), placement=placement)


def feasible_designs(TR: np.ndarray, TP: np.ndarray, TC: np.ndarray, board: Board, bmax: int,
                     n_layers: int, stackable: bool, *, banks: int | None = None,
                     ports: int | None = None, buffer: bool = False) -> np.ndarray:
    """Boolean mask: the design fits the board under its ceilings (Board.limit) in every resource
    (`ports` AXI masters; None: the board's); `buffer`: with room for a block input buffer of at least
    a BRAM36 a bank (`buffer_room` >= 1)."""
    return (logic_fits(TP, TC, board, bmax, n_layers, stackable, banks=banks, ports=ports, buffer=buffer)
            & memory_fits(TR, TP, TC, board, bmax, banks=banks,
                           reserve=bram_reserve(TP, buffer, n_layers, bmax, board)))


def logic_fits(TP: np.ndarray, TC: np.ndarray, board: Board, bmax: int, n_layers: int, stackable: bool, *,
               banks: int | None = None, ports: int | None = None, buffer: bool = False) -> np.ndarray:
    """The part of `feasible_designs` that does not depend on TR: DSPs, LUTs and FFs (with `buffer`, also
    those of a block input buffer of 4 BRAM36 a bank, the least `buffer_room` prices)."""
    axi_ports, fabric = ports or board.npu_axi_ports, fabric_of(board)
    lut, ff = logic_use(TP, TC, bmax, n_layers, stackable, axi_ports=axi_ports, banks=banks,
                        port_bits=board.hp_width_bits, fabric=fabric)
    ok = ((np.asarray(TP) * np.asarray(TC) <= board.limit("dsp")) & (lut <= board.limit("lut"))
          & (ff <= board.limit("ff")))
    if buffer:
        lut, ff = logic_use(TP, TC, bmax, n_layers, stackable, axi_ports=axi_ports, banks=banks,
                            port_bits=board.hp_width_bits, buffer=True, fabric=fabric)
        lut4, bff = input_buffer_logic(np.asarray(TP), np.asarray(TC), 4)
        ok = ok & (lut + lut4 <= board.limit("lut")) & (ff + bff <= board.limit("ff"))
    return ok


def bram_reserve(TP: np.ndarray, buffer: bool, n_layers: int, bmax: int, board: Board) -> np.ndarray | float:
    """BRAM36 a design must leave beside its engine's memories: a BRAM36 a bank of the block input buffer
    where one is built, and the FBCB's RAMB18 where Yosys puts it in block RAM (`fbcb_bram36`)."""
    fbcb = fbcb_bram36(n_layers, bmax, buffer, fabric_of(board))
    return buffer_banks_of(np.asarray(TP)) + fbcb if buffer else fbcb


def memory_fits(TR: np.ndarray, TP: np.ndarray, TC: np.ndarray, board: Board, bmax: int, *,
                banks: int | None = None, reserve: np.ndarray | int = 0) -> np.ndarray:
    """The engine's memories fit the board (`memory_use`) with `reserve` BRAM36 left under the ceiling."""
    bram, _, ok = memory_use(TR, TP, TC, board, bmax, banks=banks)
    return ok & (bram <= board.limit("bram36") - np.asarray(reserve))


def over_limits(res: Resources, board: Board, buffers_bram36: float | None = None) -> list[str]:
    """What a design's resources exceed on a board under its ceilings, one phrase each
    ('LUTs: needs 197,009 of 174,880 (22,129 over, 113 %; ceiling 80 % of 218,600)'); empty when it fits.

    `buffers_bram36` is the buffers' need counted all in BRAM36, reported when no BRAM/URAM
    placement fits (the resources then hold infinity)."""
    out = []
    if not (np.isfinite(res.bram36) and np.isfinite(res.uram)):
        have = board.limit("bram36")
        need = f"need {buffers_bram36:,.0f} BRAM36 of {have:,} ({buffers_bram36 - have:,.0f} over)" \
            if buffers_bram36 is not None else f"no BRAM36 placement fits {have:,}"
        out.append(f"on-chip buffers: {need}" + (f" (nor in BRAM36 + {board.limit('uram'):,} URAM)"
                                                 if board.uram else ""))
    for name, label in (("dsp", "DSPs"), ("bram36", "BRAM36"), ("uram", "URAM"), ("lut", "LUTs"), ("ff", "FFs")):
        used, limit, total = getattr(res, name), board.limit(name), getattr(board, name)
        if np.isfinite(used) and used > limit:
            if not limit:
                out.append(f"{label}: needs {used:,.0f}, {board.name} has none")
                continue
            share = getattr(board.ceilings, name)
            ceiling = f"; ceiling {share:.0%} of {total:,}" if share < 1 else ""
            out.append(f"{label}: needs {used:,.0f} of {limit:,} ({used - limit:,.0f} over, "
                       f"{100 * used / limit:.0f} %{ceiling})")
    return out


def buffers_bram36(TR: int, TP: int, TC: int, bmax: int, *, banks: int | None = None) -> float:
    """The engine's buffers counted all in BRAM36 (what a refused design would need without URAM)."""
    return float(sum((count * bram36_for(depth, width)
                      for _, count, depth, width in memories(TR, TP, TC, bmax, banks=banks)),
                     np.zeros(())))      # an array start: the sum of arrays, as mypy reads it


def max_tr(TP: np.ndarray, TC: np.ndarray, board: Board, bmax: int, n_layers: int, stackable: bool,
           tr_cap: int, *, banks: int | None = None, ports: int | None = None, buffer: bool = False) -> np.ndarray:
    """Largest TR <= tr_cap that fits, per (TP, TC); 0 where none does."""
    fits = logic_fits(TP, TC, board, bmax, n_layers, stackable, banks=banks, ports=ports, buffer=buffer)
    reserve = bram_reserve(TP, buffer, n_layers, bmax, board)
    return np.where(fits, memory_tr_max(TP, TC, board, bmax, tr_cap, banks=banks, reserve=reserve), 0)


def memory_tr_max(TP: np.ndarray, TC: np.ndarray, board: Board, bmax: int, tr_cap: int, *,
                  banks: int | None = None, reserve: np.ndarray | int = 0) -> np.ndarray:
    """Largest TR <= tr_cap whose memories fit (`memory_fits`), per (TP, TC); 0 where none does. It
    depends on neither the PE kind nor the AXI ports, so the DSE's spaces share it (`design_spaces`).

    Memory use is monotone in TR, so a vectorised binary search is exact.
    """
    TP, TC = np.asarray(TP), np.asarray(TC)
    lo = np.zeros(TP.shape, dtype=np.int64)           # largest known-feasible (0 = none)
    hi = np.full(TP.shape, tr_cap + 1, dtype=np.int64)  # smallest known-infeasible
    while True:
        active = hi - lo > 1
        if not active.any():
            return lo
        mid = (lo + hi) // 2
        ok = memory_fits(mid, TP, TC, board, bmax, banks=banks, reserve=reserve)
        lo = np.where(active & ok, mid, lo)
        hi = np.where(active & ~ok, mid, hi)
