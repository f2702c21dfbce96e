"""What the control unit's four machines hand each other (hw/sequencer.py).

The planner, the im2col fetcher, the response loader and the writer
(docs/hw-architecture.md, "Control unit") are joined by typed streams
(`amaranth.lib.stream`, valid/ready with a StructLayout payload) and a few
level signals; every layout they share is defined here, once, so a FIFO word
says what it holds instead of being sliced by bit position.
"""

from __future__ import annotations

from amaranth import signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from fluidnpu.hw.descriptor import BUFFER_LAYOUT, DESC_WORDS, LAYOUT
from fluidnpu.hw.regmap import ROW_BITS, fbcb_entry_bits

KIND_DESC, KIND_WEIGHT, KIND_BIAS, KIND_INPUT = 0, 1, 2, 3   # what a DMA read brings back
DESC_CMD_WORDS = 16                     # 16-bit words per descriptor read command
ADDR = 32


def store_control_params(obj: object, *, TR: int, TP: int, TC: int, NB: int, bmax: int, layers: int, nmax: int,
                         stackable: bool) -> None:
    """The build parameters the Sequencer and its planner keep (and the DMA tag they imply)."""
    obj.TR, obj.TP, obj.TC, obj.NB, obj.bmax, obj.layers, obj.nmax = TR, TP, TC, NB, bmax, layers, nmax  # type: ignore[attr-defined]
    obj.stackable = stackable  # type: ignore[attr-defined]
    obj.tag = tag_layout(NB, TR, TP, TC, nmax)  # type: ignore[attr-defined]


def register_ports(bmax: int, layers: int, buffer: bool = False) -> dict[str, wiring.Member]:
    """The control unit's ports to the register block (hw/registers.py): the run's start and
    parameters, the FBCB read port (its entries one bit wider with the block input buffer), and the
    status the registers report. The Sequencer has them and passes them to the planner, which owns
    the run."""
    return {
        "start": In(1), "desc_base": In(ADDR), "desc_count": In(16), "bactive": In(bits_for(bmax)),
        "fbcb_addr": Out(range(max(2, layers * bmax))), "fbcb_data": In(fbcb_entry_bits(bmax, buffer)),
        "busy": Out(1), "done": Out(1), "error": Out(1), "error_code": Out(8),
        "layer_done": Out(1), "dma_stall": Out(1),
    }


def tag_layout(NB: int, TR: int, TP: int, TC: int, nmax: int) -> data.StructLayout:
    """What a DMA read carries back so the loader knows where its data goes."""
    idx = max(bits_for(TR), bits_for(2 * TC + nmax), bits_for(DESC_WORDS * 2))
    return data.StructLayout({
        "kind": 2, "step_last": 1, "row_last": 1,
        "q": bits_for(NB), "idx": idx, "lane": bits_for(2 * TP),
    })


def read_cmd_layout(tag: data.StructLayout, nmax: int) -> data.StructLayout:
    """A DMA read command: byte address, 1..NMAX words, `zero` (padding: zeros back, no access)."""
    return data.StructLayout({"addr": ADDR, "nwords": range(nmax + 1), "zero": 1, "tag": tag})


def read_rsp_layout(tag: data.StructLayout, nmax: int) -> data.StructLayout:
    """A DMA read response: NMAX 16-bit words (word i at bits 16i) and the command's tag."""
    return data.StructLayout({"data": 16 * nmax, "tag": tag})


def write_cmd_layout(nmax: int) -> data.StructLayout:
    """A DMA write command: byte address, 1..NMAX words, the words."""
    return data.StructLayout({"addr": ADDR, "nwords": range(nmax + 1), "data": 16 * nmax})


def desc_chunk_layout() -> data.StructLayout:
    """One descriptor read's words, from the loader to the planner: `idx` is its first 16-bit word."""
    return data.StructLayout({"idx": bits_for(DESC_WORDS * 2), "data": 16 * DESC_CMD_WORDS})


def desc_fields_layout() -> data.StructLayout:
    """The decoded layer descriptor (hw/descriptor.py's LAYOUT), field by field."""
    return data.StructLayout({name: signed(width) if is_signed else unsigned(width)
                              for name, _word, _lsb, width, is_signed in LAYOUT})


def buffer_desc_layout() -> data.StructLayout:
    """The descriptor's block-input-buffer fields (hw/descriptor.py's BUFFER_LAYOUT), decoded only by
    an NPU built with the buffer."""
    return data.StructLayout({name: unsigned(width) for name, _word, _lsb, width, _signed in BUFFER_LAYOUT})


def step_layout(TR: int) -> data.StructLayout:
    """A weight step from the fetcher to the loader: `t` rows, first/last step of its block,
    `sb` the staging half its block drains into."""
    return data.StructLayout({"t": bits_for(TR), "first": 1, "last": 1, "sb": 1})


def block_layout(TR: int, TC: int, NB: int) -> data.StructLayout:
    """A row block in one column tile from the fetcher to the writer: its rows `t`, groups `gp`, first
    column `col0` and width `w` of the tile, staging half `sb`; whether it starts the layer or a pass
    (the writer then sets its output cursors), and whether it is a row block's later tile (`again`:
    the writer goes back to the block's first rows)."""
    return data.StructLayout({"t": bits_for(TR), "gp": bits_for(NB), "col0": 16, "w": bits_for(2 * TC),
                              "sb": 1, "pass_start": 1, "layer_start": 1, "again": 1})


def pass_plan_layout() -> data.StructLayout:
    """The balanced row blocks of one pass kind: n blocks of s rows, the first `big` one more."""
    return data.StructLayout({"n": ROW_BITS, "s": ROW_BITS, "big": ROW_BITS})


def plan_layout(TR: int, TP: int, TC: int, NB: int, bmax: int) -> data.StructLayout:
    """A layer's plan, held by the planner for the whole layer and read by the fetcher and writer:
    the descriptor, the batch b, <BR, BP> and the mode's PE count and tree width, groups g of a
    full pass and gl of the last, the tile width cw, BR times the sample strides, and the
    block plans of full (`full`) and last (`last`) passes."""
    b_bits = bits_for(bmax)
    return data.StructLayout({
        "desc": desc_fields_layout(),
        "b": b_bits, "BR": b_bits, "BP": b_bits,
        "nPE": range(2 * TC + 1), "TPk": range(2 * TP + 1),
        "g": range(NB + 1), "gl": range(NB + 1), "cw": range(2 * TC + 1),
        "br_src": ADDR, "br_dst": ADDR,
        "full": pass_plan_layout(), "last": pass_plan_layout(),
    })


def staging_signature() -> wiring.Signature:
    """The staging halves between loader and writer (loader's view): the loader `claim`s a
    half when it hands the core a block's last step (the core then fills it), the writer
    reports the halves `free` (drained, or never claimed)."""
    return wiring.Signature({"claim": Out(2), "free": In(2)})

