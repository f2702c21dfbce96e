"""The NPU's register map: the one definition the RTL, the exports and the host driver share.

Pure Python on purpose (no amaranth, no numpy): the host driver imports it on
the board's ARM cores, where only numpy is installed, and `hw/registers.py`
builds the AXI4-Lite register block from the same tables, so the hardware and
the driver cannot drift apart. `hw/export.py` turns it into JSON, a C header
and `docs/register-map.md`.

The policies the tables alone do not say are in POLICIES (exported to the
docs with the tables): unmapped offsets, WSTRB, writes while busy, error
precedence.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any

from fluidnpu.boards.catalog import NPU_AXI_PORTS_MAX
from fluidnpu.errors import FluidError

ID_VALUE = 0x464E5055  # "FNPU"
VERSION_MAJOR = 1
VERSION_MINOR = 0
VERSION_VALUE = VERSION_MAJOR << 16 | VERSION_MINOR
REG_BYTES = 4
WINDOW_BYTES = 0x1000  # the address range Vivado assigns (only bits [11:2] are decoded)
# Vivado IP identity (vendor:library:name:version) the NPU is packaged under; the host driver binds to it
# (PYNQ DefaultIP.bindto) and looks it up in a .hwh.
VLNV = f"fluidnpu.org:fluidnpu:npu:{VERSION_MAJOR}.{VERSION_MINOR}"


class KCode(IntEnum):
    """The FBCB's 2-bit code of a layer's Stackable-PE mode k (docs/hw-architecture.md).

    The order is the order the DSE tries modes in: ties keep the earlier (plain PEs first).
    """

    K1 = 0     # k = 1: plain PEs
    K2 = 1     # k = 2: pairs of PEs stacked into one with a 2TP-wide reduction
    KHALF = 2  # k = 1/2: each PE split into two with TP/2-wide reductions

    @property
    def k(self) -> float:
        """The mode's k (the reduction width is k*TP)."""
        return K_CODES[self]


K_CODES: dict[int, float] = {int(KCode.K1): 1.0, int(KCode.K2): 2.0, int(KCode.KHALF): 0.5}  # code -> k
K_CODE_BITS = 2            # the k code's bits at the bottom of an FBCB entry
ROW_BITS = 24              # the control unit's row counters and wide divider: rows of a pass (Bmax * R) and R
NMAX_MIN = 16              # a DMA command moves at least 16 words: a bias chunk of 8 int32
FETCH_AHEAD = 3
"""Steps the fetcher may have started that the loader has not yet handed to the core (hw/seq_fetcher.py):
it starts step k + FETCH_AHEAD's reads once step k is handed over, so a step's round trip is spread over
that many steps (the performance model's `LayerCosts.block`). Two staging halves bound what the loader
writes, not what the DMA holds: the reads of the steps beyond wait in the ports, in order."""


def k_dims(TR: Any, TP: Any, TC: Any, k_code: int) -> tuple[Any, Any, Any]:
    """The engine shape <TRk, TPk, TCk> a layer sees in mode k: k = 2 stacks pairs of PEs into
    one 2TP-wide tree, k = 1/2 splits each PE into two TP/2-wide trees; both halve the rows.
    Works on ints and on numpy arrays."""
    if k_code == KCode.K1:
        return TR, TP, TC
    if k_code == KCode.K2:
        return TR // 2, TP * 2, TC // 2
    if k_code == KCode.KHALF:
        return TR // 2, TP // 2, TC * 2
    raise FluidError(f"unknown Stackable-PE mode code {k_code}")


def k_codes(stackable: bool = True) -> tuple[KCode, ...]:
    """The modes an engine may have before its size rules any out: all three with Stackable
    PEs, k = 1 only without (`stackable=False`, the baselines'); in tie-break order."""
    return tuple(KCode) if stackable else (KCode.K1,)


def supported_k_codes(TR: int, TP: int, TC: int, stackable: bool = True) -> tuple[KCode, ...]:
    """The modes an engine of this size runs: k = 2 halves TC and TR, k = 1/2 halves TP and TR,
    so TC = 1 has no k = 2, TP = 1 no k = 1/2, TR = 1 neither; only k = 1 without Stackable PEs.
    (The DSE applies the same rule to whole design spaces through `perf_model.mode_dims`:
    a mode exists where all three of its dimensions are at least 1.)"""
    return tuple(c for c in k_codes(stackable)
                 if c == KCode.K1 or (TR >= 2 and (TC if c == KCode.K2 else TP) >= 2))


def _maximum(a: Any, b: Any) -> Any:
    """max(a, b) elementwise for ints and numpy arrays alike (this module imports no numpy)."""
    return a + (b - a) * (b > a)


def nmax(TP: Any, TC: Any) -> Any:
    """NMAX, the longest vector one DMA command moves: an input row (2TP words), a weight row
    (2TC) or NMAX_MIN bias words. The DMA and control unit datapaths are this wide. Works on
    ints (the RTL) and on numpy arrays (the DSE's resource model, a whole design space)."""
    return _maximum(_maximum(2 * TP, 2 * TC), NMAX_MIN)


BUFFER_LANES = 4           # 16-bit words in a row of one bank of the block input buffer (hw/input_buffer.py)


def buffer_banks(TP: int, lanes: int = BUFFER_LANES) -> int:
    """Banks a half of the block input buffer needs so that a run of up to 2 TP words starting at any
    word reads each bank at most once: a power of two, at least the rows of `lanes` words such a run
    can touch."""
    touched = -(-(2 * TP + lanes - 1) // lanes)
    return 1 << (touched - 1).bit_length()


def buffer_window(TP: int, lanes: int = BUFFER_LANES) -> int:
    """Words of one row across all banks of the block input buffer: regions start on it, a fill writes
    whole ones."""
    return buffer_banks(TP, lanes) * lanes


def fill_chunk(nmax: int, window: int) -> int:
    """Words one fill of the block input buffer writes (a window is its banks x lanes words): whole
    windows where NMAX holds one, else the largest power of two up to NMAX, which then lies inside one
    window (both are powers of two)."""
    return (nmax // window) * window if nmax >= window else 1 << (nmax.bit_length() - 1)


def fill_regions(out_w: int, out_h: int, in_h: int, sh: int, kh: int, ph: int, row_words: int,
                 s0: int, p0: int, t: int, gend: int) -> list[tuple[int, int, int]]:
    """The regions the fill walker (hw/fill_walker.py) reads for t output pixels from pixel p0 of sample
    s0, up to the group's end sample `gend` (exclusive): per sample reached, (sample, first input row,
    words), the input rows its output rows' windows cover, whole rows of `row_words` words. What the
    bit-accurate model device checks a buffered block against the buffer's halves with."""
    npix, regions, s, p, left = out_w * out_h, [], s0, p0, t
    while left > 0 and s < gend:
        n = min(left, npix - p)
        first, last = p // out_w, (p + n - 1) // out_w
        lo, hi = max(0, first * sh - ph), min(in_h - 1, last * sh - ph + kh - 1)
        regions.append((s, lo, (hi - lo + 1) * row_words))
        left, s, p = left - n, s + 1, 0
    return regions


def block_fill_end(regions: list[tuple[int, int, int]], window: int, start: int = 0) -> int:
    """The word of a buffer half after a block's regions (each starts on a window, after `start`): the
    words the block needs. The walker raises BUFFER_OVERFLOW where a region ends past the half."""
    end = start
    for _, _, words in regions:
        start = -(-end // window) * window
        end = start + words
    return end


# Lanes per DSP cascade chain of a PE (hw/mac_tree.py). Longer chains leave fewer fabric adders but
# skew more operand bits into flip-flops (lane r of a chain is delayed r cycles) and lengthen the
# pipeline; 16 makes every PE up to TP = 32 one chain a half (only the root adder in the fabric), at a
# few thousand flip-flops and 16 cycles of fill a layer, and stays under Yosys's cascade limit (20).
CHAIN = 16


def chains(TP: int, chain: int = CHAIN) -> list[tuple[int, int]]:
    """The [start, end) lane runs of one PE's DSP cascades: the lower half [0, TP // 2) and the
    upper half [TP // 2, TP) (the Stackable-PE split), each cut into runs of `chain` from its start."""
    h = TP // 2
    return [(s, min(s + chain, hi)) for lo, hi in ((0, h), (h, TP)) for s in range(lo, hi, chain)]


def chain_position(TP: int, lane: int, chain: int = CHAIN) -> int:
    """Lane `lane`'s place in its chain, the cycles its operands are skewed by. Both halves are
    cut from their own start, so lanes i and i + TP // 2 share a position (the upper k = 1/2 PE
    reads lanes [0, h) of its row into lanes [h, 2h): one skewed copy of a word serves both)."""
    h = TP // 2
    return (lane if lane < h else lane - h) % chain


def _ceil_log2(n: Any) -> Any:
    """ceil(log2 n) for n >= 1, ints and numpy arrays alike (n below 2**32)."""
    return sum((n > (1 << k)) * 1 for k in range(32))


def longest_chain(TP: Any, chain: int = CHAIN) -> Any:
    """Lanes of a PE's longest chain (its upper half is the larger). Ints or numpy arrays."""
    upper = TP - TP // 2
    return upper - (upper - chain) * (upper > chain)


def chain_count(TP: Any, chain: int = CHAIN) -> Any:
    """Chains of one PE (`chains`): its fabric adders are this many less one. Ints or numpy arrays."""
    return -(-(TP // 2) // chain) + -(-(TP - TP // 2) // chain)


def skew_words(TP: Any, chain: int = CHAIN) -> Any:
    """Sum over a PE's lanes of `chain_position`: the 16-bit words of register delay one skewed
    copy of an input row holds (the core keeps one per bank, per lane set). Ints or numpy arrays."""
    def half(n: Any) -> Any:
        full, rest = n // chain, n % chain
        return full * (chain * (chain - 1) // 2) + rest * (rest - 1) // 2
    return half(TP // 2) + half(TP - TP // 2)


def sum_depth(TP: Any, chain: int = CHAIN) -> Any:
    """Cycles from a PE's first-lane product register to its root, all TP lanes summed: the
    longest chain's length - 1, the adder tree over a half's chain outputs, and the root adder
    (0 for TP = 1). The RTL asserts it against what it builds (hw/engine_core.py); the
    performance model prices the pipeline fill with it (`mode_depth`). Ints or numpy arrays."""
    upper = TP - TP // 2                                  # the larger half
    return (TP >= 2) * (longest_chain(TP, chain) + _ceil_log2(-(-upper // chain)))


def mode_depth(TP: Any, k_code: int) -> Any:
    """Cycles from a PE's first-lane product to the sum a layer in Stackable-PE mode k
    accumulates: the root (k = 1), one pair adder more (k = 2), the half sums (k = 1/2)."""
    return sum_depth(TP) + {KCode.K1: 0, KCode.K2: 1, KCode.KHALF: -1}[KCode(k_code)]


class Access(str, Enum):
    """How software may touch a register."""

    RO = "RO"    # read only; writes ignored
    RW = "RW"    # read/write
    WO = "WO"    # write only (an action); reads return 0
    W1C = "W1C"  # write 1 to clear a bit; writing 0 leaves it


@dataclass(frozen=True)
class Field:
    """A bit field of a register; `lsb`/`width` give its place in the 32-bit word."""

    name: str
    lsb: int
    width: int
    desc: str

    @property
    def mask(self) -> int:
        """The field's bits in place (e.g. 0xFF00 for [15:8])."""
        return ((1 << self.width) - 1) << self.lsb

    @property
    def msb(self) -> int:
        return self.lsb + self.width - 1

    def get(self, word: int) -> int:
        """This field's value in a register word."""
        return (word >> self.lsb) & ((1 << self.width) - 1)

    def put(self, value: int) -> int:
        """`value` placed in this field (checked, so a too-large value is not silently cut)."""
        if not 0 <= value < 1 << self.width:
            raise FluidError(f"field {self.name} is {self.width} bits; {value} does not fit")
        return value << self.lsb


@dataclass(frozen=True)
class Register:
    """One 32-bit register. `reset` None means the value depends on the generated design."""

    name: str
    offset: int
    access: Access
    desc: str
    fields: tuple[Field, ...] = ()
    reset: int | None = 0

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"register {self.name} has no field {name}")

    @property
    def mask(self) -> int:
        """The bits that exist (read back or act); the rest read 0."""
        m = 0
        for f in self.fields:
            m |= f.mask
        return m


def _whole(name: str, desc: str, width: int = 32) -> tuple[Field, ...]:
    return (Field(name, 0, width, desc),)


_CFG = "Read-only build parameter of this bitstream: "

REGISTERS: tuple[Register, ...] = (
    Register("ID", 0x00, Access.RO, 'Identifies the block: 0x464E5055 ("FNPU").',
             _whole("ID", "constant 0x464E5055"), ID_VALUE),
    Register("VERSION", 0x04, Access.RO, "Register-map version; a driver refuses a major it does not know.",
             (Field("MINOR", 0, 16, "minor version (compatible additions)"),
              Field("MAJOR", 16, 16, "major version (incompatible changes)")), VERSION_VALUE),
    Register("CTRL", 0x08, Access.WO,
             "Actions; every bit is a self-clearing pulse. SOFT_RESET wins over START in the same write.",
             (Field("START", 0, 1, "run DESC_COUNT layers from DESC_BASE at Bactive; refused with BAD_BACTIVE "
                                   "unless 1 <= BACTIVE <= Bmax, with START_WHILE_BUSY while BUSY; an accepted "
                                   "START clears STATUS.DONE/ERROR/ERROR_CODE and LAYER"),
              Field("SOFT_RESET", 1, 1, "abort the sequencer and DMA, clear STATUS, IRQ_STATUS and LAYER; "
                                        "configuration, FBCB contents and counters are kept"),
              Field("CLEAR_COUNTERS", 2, 1, "zero CYC_BUSY, CYC_MAC, CYC_DMA_STALL and CYC_LAYERS"))),
    Register("IRQ_EN", 0x0C, Access.RW, "Interrupt enables; the irq line is |(IRQ_STATUS & IRQ_EN).",
             (Field("DONE", 0, 1, "interrupt when a run finishes"),
              Field("ERROR", 1, 1, "interrupt on any error"))),
    Register("STATUS", 0x10, Access.RO,
             "Run state. A driver waits for BUSY = 0, then checks ERROR.",
             (Field("BUSY", 0, 1, "a run is in progress (set from the START write on)"),
              Field("DONE", 1, 1, "the last run finished; cleared by the next accepted START"),
              Field("ERROR", 2, 1, "an error happened since the last accepted START or SOFT_RESET"),
              Field("ERROR_CODE", 8, 8, "the most recent error (ErrorCode)"))),
    Register("IRQ_STATUS", 0x14, Access.W1C, "Latched interrupt events; write 1 to clear. A new event in the "
                                             "clearing cycle wins, so none is lost.",
             (Field("DONE", 0, 1, "a run finished"),
              Field("ERROR", 1, 1, "an error was raised"))),
    Register("DESC_BASE", 0x18, Access.RW, "Byte address of the subnet's first layer descriptor "
                                           "(hw/descriptor.py). Not writable while BUSY.",
             _whole("ADDR", "byte address")),
    Register("DESC_COUNT", 0x1C, Access.RW, "Number of layers in the subnet. Not writable while BUSY.",
             _whole("COUNT", "layers", 16)),
    Register("BACTIVE", 0x20, Access.RW, "Active batch size b of the next run (Fluid Batching's Bactive). "
                                         "Any value may be written; START checks 1 <= b <= Bmax. "
                                         "Not writable while BUSY.",
             _whole("VALUE", "samples in the batch")),
    Register("BEXIT", 0x24, Access.WO, "Bactive -= value: samples that left at an exit. Refused with "
                                       "BAD_BACTIVE_UPDATE (Bactive unchanged) if value > Bactive.",
             _whole("COUNT", "samples that exited")),
    Register("BINCR", 0x28, Access.WO, "Bactive += value: samples backfilled into the batch. Refused with "
                                       "BAD_BACTIVE_UPDATE (Bactive unchanged) if the sum exceeds Bmax.",
             _whole("COUNT", "samples added")),
    Register("FBCB_ADDR", 0x2C, Access.RW, "FBCB entry index layer*Bmax + (b-1) that FBCB_DATA writes next.",
             _whole("INDEX", "entry index", 16)),
    Register("FBCB_DATA", 0x30, Access.WO,
             "Writes the FBCB entry at FBCB_ADDR, then FBCB_ADDR += 1. Only the low ceil(log2 Bmax) bits of "
             "BR_M1 are stored; on an NPU built with the block input buffer (the bundle's design.input_buffer) "
             "the next bit up, bit 2 + ceil(log2 Bmax), is BUFFERED too: the layer's input runs at this batch size are "
             "answered from the buffer (BUFFER_OVERFLOW if a block does not fit a half). Refused with "
             "FBCB_INDEX past the table, WRITE_WHILE_BUSY while BUSY.",
             (Field("K_CODE", 0, 2, "0: k = 1, 1: k = 2, 2: k = 1/2"),
              Field("BR_M1", 2, 14, "BR - 1 (samples per group minus one)"))),
    Register("LAYER", 0x34, Access.RO, "Layers of the current subnet completed (cleared by START).",
             _whole("COUNT", "layers", 16)),
    Register("CYC_BUSY", 0x40, Access.RO, "Cycles BUSY was set (wraps at 2^32).", _whole("COUNT", "cycles")),
    Register("CYC_MAC", 0x44, Access.RO, "Cycles a row entered the MAC array.", _whole("COUNT", "cycles")),
    Register("CYC_DMA_STALL", 0x48, Access.RO, "Cycles the MAC array waited for data.",
             _whole("COUNT", "cycles")),
    Register("CYC_LAYERS", 0x4C, Access.RO, "Layers completed since the counters were cleared.",
             _whole("COUNT", "layers")),
    Register("CFG_TR", 0x60, Access.RO, _CFG + "TR (rows per tile).", _whole("VALUE", "TR"), None),
    Register("CFG_TP", 0x64, Access.RO, _CFG + "TP (MAC tree width).", _whole("VALUE", "TP"), None),
    Register("CFG_TC", 0x68, Access.RO, _CFG + "TC (processing elements).", _whole("VALUE", "TC"), None),
    Register("CFG_BMAX", 0x6C, Access.RO, _CFG + "Bmax.", _whole("VALUE", "Bmax"), None),
    Register("CFG_LAYERS", 0x70, Access.RO, _CFG + "FBCB depth L (layers).", _whole("VALUE", "L"), None),
    Register("CFG_AXI_DW", 0x74, Access.RO, _CFG + "m_axi data width in bits.", _whole("VALUE", "bits"), None),
    Register("CFG_DESIGN_HASH", 0x78, Access.RO,
             _CFG + "design_hash() of the bundle it was built from; a driver refuses a mismatch.",
             _whole("VALUE", "hash"), None),
)

REG: dict[str, Register] = {r.name: r for r in REGISTERS}
BY_OFFSET: dict[int, Register] = {r.offset: r for r in REGISTERS}

POLICIES: tuple[str, ...] = (
    "Only byte-address bits [11:2] are decoded (a 4 KiB window). Unmapped offsets read 0 and ignore writes, "
    "with an OKAY response, like Xilinx's own AXI4-Lite IP; a driver finds the block by reading ID.",
    "Writes to read-only registers are ignored (OKAY). Write-only registers read 0.",
    "WSTRB: a write with no strobe bit set does nothing. RW registers keep the bytes whose strobe is 0; "
    "the action registers (CTRL, IRQ_STATUS, BEXIT, BINCR, FBCB_DATA) see unstrobed bytes as 0.",
    "While BUSY, the registers the running subnet reads (DESC_BASE, DESC_COUNT, BACTIVE, BEXIT, BINCR, "
    "FBCB_DATA) do not change: such a write is ignored and raises WRITE_WHILE_BUSY. IRQ_EN, IRQ_STATUS, "
    "FBCB_ADDR and CTRL work at any time. BUSY is set from the cycle START is accepted.",
    "STATUS.ERROR and ERROR_CODE hold the most recent error (a sequencer error wins over a register error "
    "in the same cycle) until the next accepted START or a SOFT_RESET. IRQ_STATUS latches DONE and ERROR "
    "events for the interrupt; an event in the cycle its bit is cleared is kept.",
    "Between subnets (runs end at exit points) the control software tracks Bactive as the paper's CU does: "
    "BEXIT with the samples that left at the exit, BINCR with the backfilled samples merged in; BACTIVE "
    "may also be written directly, e.g. to run a preempting new batch. Then DESC_BASE/DESC_COUNT and START.",
)

# Registers the running subnet reads: writes to them while BUSY are refused.
BUSY_LOCKED = ("DESC_BASE", "DESC_COUNT", "BACTIVE", "BEXIT", "BINCR", "FBCB_DATA")


class ErrorCode(IntEnum):
    """STATUS.ERROR_CODE values; `.message` is the one-line explanation a driver shows."""

    NONE = 0
    BAD_BACTIVE = 1
    BAD_BACTIVE_UPDATE = 2
    BAD_DESCRIPTOR = 3
    AXI_READ = 4
    AXI_WRITE = 5
    START_WHILE_BUSY = 6
    WRITE_WHILE_BUSY = 7
    FBCB_INDEX = 8
    BUFFER_OVERFLOW = 9

    @property
    def message(self) -> str:
        return _ERROR_MESSAGES[self]


_ERROR_MESSAGES = {
    ErrorCode.NONE: "no error",
    ErrorCode.BAD_BACTIVE: "START with BACTIVE 0 or greater than Bmax; the run did not start",
    ErrorCode.BAD_BACTIVE_UPDATE: "BEXIT greater than BACTIVE, or BINCR beyond Bmax; BACTIVE unchanged",
    ErrorCode.BAD_DESCRIPTOR: "a layer descriptor is malformed or does not fit this NPU; the run stopped",
    ErrorCode.AXI_READ: "an m_axi read returned an error response; the run stopped",
    ErrorCode.AXI_WRITE: "an m_axi write returned an error response; the run stopped",
    ErrorCode.START_WHILE_BUSY: "START while a run is in progress; ignored",
    ErrorCode.WRITE_WHILE_BUSY: "DESC_BASE, DESC_COUNT, BACTIVE, BEXIT, BINCR or FBCB_DATA written while BUSY; "
                                "ignored",
    ErrorCode.FBCB_INDEX: "FBCB_DATA written with FBCB_ADDR past the table (L*Bmax entries); ignored",
    ErrorCode.BUFFER_OVERFLOW: "a buffered layer's block reads more input than a half of the block input buffer "
                               "holds; the run stopped, its outputs are wrong",
}


# ---- FBCB entries -------------------------------------------------------------------------------

# Batching modes whose passes pack several sample groups side by side (docs/hw-architecture.md,
# "Groups"); static R and FC-only batching run one group (BR = b) per pass.
PACKING_BATCHINGS = ("fluid", "p")


def packs_groups(batching: str) -> bool:
    """Whether an engine built for this batching mode ever packs more than one group in a pass."""
    return batching in PACKING_BATCHINGS


def input_banks(bmax: int, packing: bool = True) -> int:
    """Input-buffer banks NB of the RTL.

    Packed groups read their own rows in the same cycle, one bank each, so an engine that packs
    groups has a power of two >= max(2, Bmax) banks (the bank of a row is then a bit slice). An
    engine that never packs (static R, FC-only) needs no more than the 2 the row interleaving uses:
    fewer operand multiplexer inputs and fewer, fuller RAMs.
    """
    if not packing:
        return 2
    nb = 2
    while nb < bmax:
        nb *= 2
    return nb


def bank_choices(bmax: int, packing: bool = True) -> list[int]:
    """Every bank count NB an engine for Bmax may be built with, fewest first: the powers of two
    from 2 to `input_banks`. Fewer banks than Bmax cap the groups a pass packs at NB (the
    sequencer's g = min(BP, nPE // C, NB)) for an NB:1 operand multiplexer that costs NB/Bmax
    of the LUTs; the DSE picks NB by score (docs/interpretations.md, "Bank count")."""
    top = input_banks(bmax, packing)
    return [1 << i for i in range(1, top.bit_length())]


def bank_select_bits(nb: int) -> int:
    """Bits of a PE's bank select (log2 NB): the engine's `selA`/`selB` registers, which the DSP
    chains' operand skew delays, so the resource model counts the same bits."""
    if nb < 2 or nb & (nb - 1):
        raise ValueError(f"NB = {nb}: the engine's banks are a power of two >= 2")
    return nb.bit_length() - 1


def check_banks(nb: int, bmax: int) -> None:
    """Refuse a bank count the RTL cannot build (a power of two, 2 ..= input_banks(Bmax))."""
    if nb not in bank_choices(bmax):
        raise FluidError(f"input banks NB = {nb}: must be a power of two in 2..{input_banks(bmax)} for Bmax {bmax}")


def fbcb_br_bits(bmax: int) -> int:
    """Bits of BR-1 in an entry: ceil(log2 Bmax); 0 for Bmax = 1, where BR is always 1."""
    if bmax < 1:
        raise FluidError(f"Bmax must be at least 1, got {bmax}")
    return math.ceil(math.log2(bmax)) if bmax > 1 else 0


def fbcb_entry_bits(bmax: int, buffer: bool = False) -> int:
    """Bits of one FBCB memory entry: the 2-bit k code, then BR-1 (2 bits in all at Bmax = 1), then, on
    an NPU built with the block input buffer (`buffer`), the BUFFERED bit."""
    return fbcb_br_bits(bmax) + K_CODE_BITS + int(buffer)


def fbcb_buffered_bit(bmax: int) -> int:
    """Where an FBCB entry holds BUFFERED: just above BR-1's ceil(log2 Bmax) bits. An NPU without the
    block input buffer stores only the bits below it, so there the layer runs from DDR."""
    return K_CODE_BITS + fbcb_br_bits(bmax)


def fbcb_index(layer: int, b: int, bmax: int) -> int:
    """FBCB_ADDR of layer `layer` (execution order) at active batch size b."""
    if not 1 <= b <= bmax or layer < 0:
        raise FluidError(f"no FBCB entry for layer {layer} at b={b} (Bmax={bmax})")
    return layer * bmax + (b - 1)


def encode_fbcb_entry(br: int, k_code: int, bmax: int, buffered: bool = False) -> int:
    """The FBCB_DATA word of <BR, k> (and `buffered`: the layer's input runs are answered from the
    block input buffer at this batch size): k_code | (BR-1) << 2 | buffered << fbcb_buffered_bit."""
    if k_code not in K_CODES:
        raise FluidError(f"FBCB k code must be one of {sorted(K_CODES)}, got {k_code}")
    if not 1 <= br <= bmax:
        raise FluidError(f"FBCB BR must be in 1..{bmax}, got {br}")
    return k_code | (br - 1) << K_CODE_BITS | int(buffered) << fbcb_buffered_bit(bmax)


def decode_fbcb_entry(word: int, bmax: int) -> tuple[int, int]:
    """(BR, k_code) of a stored entry (bits above the entry width are ignored)."""
    k_code = word & ((1 << K_CODE_BITS) - 1)
    br = ((word >> K_CODE_BITS) & ((1 << fbcb_br_bits(bmax)) - 1)) + 1
    return br, k_code


def fbcb_buffered(word: int, bmax: int) -> bool:
    """Whether a stored entry marks its layer buffered at its batch size (an NPU with the buffer)."""
    return bool(word >> fbcb_buffered_bit(bmax) & 1)


def _bundle_data(bundle: Any) -> Mapping[str, Any]:
    """A Bundle's JSON dict, or the dict itself (so this module never imports fluidnpu.bundle)."""
    data = getattr(bundle, "data", bundle)
    if not isinstance(data, Mapping):
        raise FluidError(f"expected a design bundle or its dict, got {type(bundle).__name__}")
    return data


def design_banks(bundle: Any) -> int:
    """NB of a Bundle or its dict: `design.NB`, which the DSE writes; a bundle without one was
    built with the most banks its batching uses (`input_banks`)."""
    d = _bundle_data(bundle)
    nb = d["design"].get("NB")
    if nb is None:
        return input_banks(int(d["bmax"]), packs_groups(d.get("dse", {}).get("batching", "fluid")))
    return int(nb)


def design_ports(bundle: Any) -> int:
    """AXI masters P of a Bundle or its dict: `design.ports`, which the DSE writes; a bundle without
    one uses every HP port of its board (at most MAX_AXI_PORTS; 1 for a board dict that names no count)."""
    d = _bundle_data(bundle)
    ports = d["design"].get("ports")
    if ports is None:
        return min(int(d["board"].get("hp_ports", 1)), MAX_AXI_PORTS)
    return int(ports)


def design_input_buffer(bundle: Any) -> int:
    """Words a half of the block input buffer of a Bundle or its dict (`design.input_buffer`, which the
    DSE writes); 0 (none built) for a bundle without one."""
    return int(_bundle_data(bundle)["design"].get("input_buffer", 0))


def fbcb_table(bundle: Any) -> list[int]:
    """The packed FBCB contents, index layer*Bmax + (b-1), of a Bundle or its dict."""
    d = _bundle_data(bundle)
    bmax = int(d["bmax"])
    words: list[int] = []
    for row in d["fbcb"]["entries"]:
        if len(row) != bmax:
            raise FluidError(f"FBCB row has {len(row)} entries, expected Bmax = {bmax}")
        # an entry is [BR, k] or [BR, k, buffered] (a design with the block input buffer)
        words.extend(encode_fbcb_entry(int(e[0]), int(e[1]), bmax, bool(e[2]) if len(e) > 2 else False)
                     for e in row)
    return words


def design_hash(bundle: Any) -> int:
    """32-bit fingerprint of what the RTL is built from: design point, Bmax and FBCB table.

    CRC-32 (zlib/IEEE, as `crc32` in most C libraries) of the little-endian
    uint32 words TR, TP, TC, Bmax, L, NB, P (AXI masters), then, on a design with the
    block input buffer, its words a half, then the L*Bmax packed FBCB entries in
    index order. A bundle re-run through the DSE with another result, or a
    bitstream built from another bundle, gives another value.
    """
    d = _bundle_data(bundle)
    des = d["design"]
    table = fbcb_table(d)
    buffer = design_input_buffer(d)
    words: Iterable[int] = (des["TR"], des["TP"], des["TC"], d["bmax"], len(d["fbcb"]["entries"]), design_banks(d),
                            design_ports(d), *((buffer,) if buffer else ()), *table)
    return zlib.crc32(b"".join(struct.pack("<I", int(w)) for w in words)) & 0xFFFFFFFF


M_AXI_PREFIX = "m_axi"


def m_axi_name(i: int) -> str:
    """Name of the NPU's i-th AXI4 master port (`m_axi0`, `m_axi1`, ...): the signature
    member, the Verilog prefix (`m_axi0__arvalid`), the Vivado bus interface (`m_axi0`)."""
    return f"{M_AXI_PREFIX}{i}"


MAX_AXI_PORTS = NPU_AXI_PORTS_MAX
"""Most AXI master ports: the Zynq boards have four HP ports, and the control unit counts
its reads in flight in 7 bits a stream (4 ports x 15 = 60 in the ports, a stream's order FIFO
64 entries, and the slices around them, < 128, `AxiDma.max_reads_in_flight`)."""


BUFFERS = ("input", "accumulator", "output")
"""The engine's buffer memories (hw/engine_core.py), as the resource model names them (`memories`)."""

RAM_STYLES = {"bram": "block", "uram": "ultra"}
"""A buffer's placement -> the `ram_style` attribute the RTL gives its memories (Vivado, Yosys)."""


@dataclass(frozen=True)
class NpuParams:
    """The build parameters the register block reports (CFG_*) and sizes itself by."""

    TR: int
    TP: int
    TC: int
    bmax: int
    layers: int
    axi_dw: int = 64
    design_hash: int = 0
    fbcb: tuple[int, ...] = field(default=(), compare=False)  # initial FBCB contents; () = all zero
    nb: int | None = None       # input banks NB (the bundle's design.NB); None: input_banks(bmax)
    stackable: bool = True      # False: plain PEs (k = 1 only), as the bundle's DSE options say
    axi_ports: int = 1          # AXI4 master ports m_axi0.. (the bundle's design.ports), DMA commands dealt round-robin
    # (buffer, "bram" | "uram"): resources.placement; () = the tool's choice
    placement: tuple[tuple[str, str], ...] = ()
    input_buffer: int = 0       # words a half of the block input buffer (hw/input_buffer.py); 0: none built

    def __post_init__(self) -> None:
        for name in ("TR", "TP", "TC", "bmax", "layers", "axi_dw"):
            if getattr(self, name) < 1:
                raise FluidError(f"NPU parameter {name} must be at least 1, got {getattr(self, name)}")
        if self.input_buffer < 0:
            raise FluidError(f"NPU parameter input_buffer must be >= 0 words, got {self.input_buffer}")
        if not 1 <= self.axi_ports <= MAX_AXI_PORTS:
            raise FluidError(f"NPU parameter axi_ports must be 1..{MAX_AXI_PORTS}, got {self.axi_ports}")
        if self.fbcb_depth > 1 << 16:
            raise FluidError(f"FBCB of {self.fbcb_depth} entries exceeds FBCB_ADDR's 16 bits")
        if self.nb is not None:
            check_banks(self.nb, self.bmax)
        for name, kind in self.placement:
            if name not in BUFFERS or kind not in RAM_STYLES:
                raise FluidError(f"NPU parameter placement: {name!r} -> {kind!r}; buffers are {', '.join(BUFFERS)}, "
                                 f"each placed in {' or '.join(RAM_STYLES)}")
        if self.fbcb and len(self.fbcb) != self.fbcb_depth:
            raise FluidError(f"initial FBCB has {len(self.fbcb)} entries, expected L*Bmax = {self.fbcb_depth}")

    @property
    def fbcb_depth(self) -> int:
        return self.layers * self.bmax

    @property
    def banks(self) -> int:
        """NB, the engine's input banks: the design's, else the most Bmax can use (`input_banks`)."""
        return self.nb if self.nb is not None else input_banks(self.bmax)

    @property
    def fbcb_width(self) -> int:
        return fbcb_entry_bits(self.bmax, self.input_buffer > 0)

    @property
    def cfg_values(self) -> dict[str, int]:
        """Values of the CFG_* registers."""
        return {"CFG_TR": self.TR, "CFG_TP": self.TP, "CFG_TC": self.TC, "CFG_BMAX": self.bmax,
                "CFG_LAYERS": self.layers, "CFG_AXI_DW": self.axi_dw, "CFG_DESIGN_HASH": self.design_hash}

    @classmethod
    def from_bundle(cls, bundle: Any, axi_dw: int | None = None, axi_ports: int | None = None) -> NpuParams:
        """Parameters of a Bundle (or its dict); AXI width and port count default to the board's
        HP port width and the design's AXI masters (`design_ports`)."""
        d = _bundle_data(bundle)
        des = d["design"]
        dw = int(axi_dw if axi_dw is not None else d["board"]["hp_width_bits"])
        ports = int(axi_ports if axi_ports is not None else design_ports(d))
        return cls(TR=int(des["TR"]), TP=int(des["TP"]), TC=int(des["TC"]), bmax=int(d["bmax"]),
                   layers=len(d["fbcb"]["entries"]), axi_dw=dw, design_hash=design_hash(d),
                   fbcb=tuple(fbcb_table(d)), nb=design_banks(d),
                   stackable=bool(d.get("dse", {}).get("stackable", True)), axi_ports=min(ports, MAX_AXI_PORTS),
                   placement=tuple(sorted(d.get("resources", {}).get("placement", {}).items())),
                   input_buffer=design_input_buffer(d))


def reset_value(reg: Register, params: NpuParams | None = None) -> int | None:
    """The value a register reads after reset; CFG_* need the design's parameters."""
    if reg.reset is None:
        return None if params is None else params.cfg_values[reg.name]
    return reg.reset
