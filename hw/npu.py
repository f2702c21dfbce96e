"""The NPU top level: registers + control unit + DMA + EngineCore, built from a design bundle.

Ports: `s_axi` (AXI4-Lite slave, the register map of hw/regmap.py), `m_axi0`
.. `m_axi{N-1}` (AXI4 masters, ID 0, N = `NpuParams.axi_ports`: the board's HP
ports; the DMA deals its commands round-robin over them) and `irq`.
`build_npu(bundle)` sizes it from the bundle's design point, Bmax, FBCB
(preloaded into the FBCB memory, and reloadable through FBCB_ADDR/FBCB_DATA)
and board (HP port width and count).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from amaranth import Module, ResetInserter, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from fluidnpu.hw.axi import axi4_signature, axi_lite_signature, m_axi_name
from fluidnpu.hw.dma import AxiDma
from fluidnpu.hw.engine_core import EngineCore
from fluidnpu.hw.registers import NpuRegisters
from fluidnpu.hw.regmap import NpuParams, nmax
from fluidnpu.hw.sequencer import Sequencer


def control_units(p: NpuParams) -> dict[str, Any]:
    """The NPU's control units as its top level builds them: the register block `regs`, the Sequencer
    `seq` and the AxiDma `dma` (whose tags are the Sequencer's). One constructor, so that the resource
    calibration's units alone (benchmarks/synth_calibration.py) are the ones the NPU holds."""
    NMAX = nmax(p.TP, p.TC)
    seq = Sequencer(TR=p.TR, TP=p.TP, TC=p.TC, NB=p.banks, bmax=p.bmax, layers=p.layers, nmax=NMAX,
                    stackable=p.stackable, input_buffer=p.input_buffer)
    return {"seq": seq, "regs": NpuRegisters(p),
            "dma": AxiDma(addr_width=32, data_width=p.axi_dw, nmax=NMAX, tag_width=seq.tag.size, ports=p.axi_ports,
                          read_streams=2)}


class Npu(wiring.Component):
    """The fluidnpu NPU (see docs/hw-architecture.md for the block diagram)."""

    def __init__(self, params: NpuParams) -> None:
        self.params = params
        super().__init__({
            "s_axi": In(axi_lite_signature(32, 32)),
            **{m_axi_name(i): Out(axi4_signature(32, params.axi_dw, 1)) for i in range(params.axi_ports)},
            "irq": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        p = self.params
        NB, NMAX = p.banks, nmax(p.TP, p.TC)
        units = control_units(p)
        m.submodules.regs = regs = units["regs"]
        seq = units["seq"]
        m.submodules.dma = dma = units["dma"]
        core = EngineCore(TR=p.TR, TP=p.TP, TC=p.TC, NB=NB, nmax=NMAX, stackable=p.stackable,
                          placement=dict(p.placement))
        # SOFT_RESET aborts a run: the control unit and the core are held in reset while
        # the DMA finishes the bursts it has already issued (AXI has no abort), so the
        # bus is clean when the NPU is idle again.
        flushing = Signal()
        with m.If(regs.soft_reset):
            m.d.sync += flushing.eq(1)
        with m.Elif(flushing & dma.rd_idle & dma.wr_idle):
            m.d.sync += flushing.eq(0)
        hold = regs.soft_reset | flushing
        m.submodules.seq = ResetInserter(hold)(seq)
        m.submodules.core = ResetInserter(hold)(core)

        wiring.connect(m, wiring.flipped(self.s_axi), regs.s_axi)
        for i in range(p.axi_ports):
            wiring.connect(m, wiring.flipped(getattr(self, m_axi_name(i))), dma.m_axi(i))
        m.d.comb += self.irq.eq(regs.irq)

        # registers <-> control unit
        m.d.comb += [
            seq.start.eq(regs.start), seq.desc_base.eq(regs.desc_base), seq.desc_count.eq(regs.desc_count),
            seq.bactive.eq(regs.bactive), regs.fbcb_addr.eq(seq.fbcb_addr), seq.fbcb_data.eq(regs.fbcb_data),
            regs.busy.eq(seq.busy | flushing), regs.done.eq(seq.done), regs.error.eq(seq.error),
            regs.error_code.eq(seq.error_code), regs.layer_done.eq(seq.layer_done),
            regs.mac_active.eq(core.mac_active), regs.dma_stall.eq(seq.dma_stall),
        ]
        # control unit <-> DMA
        m.d.comb += [
            dma.rd_cmd.valid.eq(seq.rd_cmd_valid & ~hold), seq.rd_cmd_ready.eq(dma.rd_cmd.ready),
            dma.rd_cmd.payload.addr.eq(seq.rd_cmd_addr), dma.rd_cmd.payload.nwords.eq(seq.rd_cmd_nwords),
            dma.rd_cmd.payload.zero.eq(seq.rd_cmd_zero), dma.rd_cmd.payload.tag.eq(seq.rd_cmd_tag),
            seq.rd_rsp_valid.eq(dma.rd_rsp.valid), dma.rd_rsp.ready.eq(seq.rd_rsp_ready | hold),
            seq.rd_rsp_data.eq(dma.rd_rsp.payload.data.as_value()), seq.rd_rsp_tag.eq(dma.rd_rsp.payload.tag),
            seq.rd_error.eq(dma.rd_error),
            dma.rd_cmd1.valid.eq(seq.in_cmd_valid & ~hold), seq.in_cmd_ready.eq(dma.rd_cmd1.ready),
            dma.rd_cmd1.payload.addr.eq(seq.in_cmd_addr), dma.rd_cmd1.payload.nwords.eq(seq.in_cmd_nwords),
            dma.rd_cmd1.payload.zero.eq(seq.in_cmd_zero), dma.rd_cmd1.payload.tag.eq(seq.in_cmd_tag),
            dma.rd_restart.eq(seq.rd_restart),
            seq.in_rsp_valid.eq(dma.rd_rsp1.valid), dma.rd_rsp1.ready.eq(seq.in_rsp_ready | hold),
            seq.in_rsp_data.eq(dma.rd_rsp1.payload.data.as_value()), seq.in_rsp_tag.eq(dma.rd_rsp1.payload.tag),
            dma.wr_cmd.valid.eq(seq.wr_valid & ~hold), seq.wr_ready.eq(dma.wr_cmd.ready),
            dma.wr_cmd.payload.addr.eq(seq.wr_addr), dma.wr_cmd.payload.nwords.eq(seq.wr_nwords),
            dma.wr_cmd.payload.data.eq(seq.wr_data),
            seq.wr_idle.eq(dma.wr_idle), seq.wr_error.eq(dma.wr_error),
        ]
        # control unit <-> EngineCore: buffer writes and steps have the core's own signatures
        for port in ("in_wr", "w_wr", "b_wr", "step"):
            wiring.connect(m, getattr(seq, port), getattr(core, port))
        m.d.comb += [
            core.k.eq(seq.cfg_k), core.g.eq(seq.cfg_g), core.cw.eq(seq.cfg_cw),
            core.shift.eq(seq.cfg_shift), core.relu.eq(seq.cfg_relu),
            seq.released.eq(core.released), seq.block_done.eq(core.block_done),
            core.st_sb.eq(seq.st_sb), core.st_j.eq(seq.st_j), seq.st_data.eq(core.st_data),
            seq.mac_active.eq(core.mac_active),
        ]
        return m


def build_npu(bundle, data_width: int | None = None, ports: int | None = None) -> Npu:
    """The NPU a design bundle describes (FBCB preloaded; AXI width and port count = the board's HP ports)."""
    return Npu(NpuParams.from_bundle(bundle, axi_dw=data_width, axi_ports=ports))


@contextmanager
def _fast_memory_init() -> Iterator[None]:
    """Amaranth 0.5's RTLIL backend writes a memory's initial contents one bit at a
    time through Python objects (`_nir.Net.from_const` per bit, then a per-bit
    sigspec walk): ~10 us a bit. The full-size picks hold 25 M bits of accumulator
    and staging memory (32·TR·TC bits each), so that alone took longer than the
    rest of the generation. This swaps in a row-at-a-time formatter that writes the
    very same `$meminit_v2` cell text (same constant, same parameters), for the
    duration of one conversion."""
    from amaranth.back import rtlil

    emitter = getattr(rtlil, "ModuleEmitter", None)
    original = getattr(emitter, "emit_memory", None)
    if original is None:            # another Amaranth than the 0.5 this was written for: plain path
        yield
        return

    def emit_memory(self: Any, cell_idx: int, cell: Any) -> None:
        width, depth = cell.width, cell.depth
        if width * depth == 0:
            return original(self, cell_idx, cell)
        mask = (1 << width) - 1
        # sigspec of an all-constant value: "<n>'<bits, most significant first>"
        bits = "".join(format(int(row) & mask, f"0{width}b") for row in reversed(list(cell.init)))
        self.builder.cell("$meminit_v2", ports={
            "ADDR": self.sigspec(),
            "DATA": f"{width * depth}'{bits}",
            "EN": self.sigspec(rtlil._nir.Value.ones(width)),
        }, parameters={
            "MEMID": self.memories[cell_idx].memid,
            "ABITS": 0,
            "WIDTH": width,
            "WORDS": depth,
            "PRIORITY": 0,
        }, src_loc=cell.src_loc)

    emitter.emit_memory = emit_memory
    try:
        yield
    finally:
        emitter.emit_memory = original


def to_verilog(top: Any, name: str, **kwargs: Any) -> str:
    """`amaranth.back.verilog.convert(top, name=name, **kwargs)`, with memory
    initialisation emitted row by row (`_fast_memory_init`): the same Verilog,
    minutes sooner for the full-size designs."""
    from amaranth.back import verilog

    with _fast_memory_init():
        return verilog.convert(top, name=name, **kwargs)
