"""The control unit's writer (hw/sequencer.py).

It drains each finished block from the core's staging buffer to the output
tensors: for every block the fetcher announced (`block`) and the core has
finished (`block_done`), row by row and group by group, one DMA write (`wr`)
per row and group, with the per-group output cursors (sample, pixel,
address) it keeps across the blocks of a pass; a row block runs every column tile before the
next (hw/seq_fetcher.py), so each tile after the first starts again from the cursors the
block's first tile started from. A drained block frees its
staging half (`staging.free`), which the loader waits for before the core may
fill it again.
"""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from fluidnpu.hw.regmap import ROW_BITS
from fluidnpu.hw.seq_streams import ADDR, block_layout, plan_layout, staging_signature, write_cmd_layout


class SeqWriter(wiring.Component):
    """Drains finished blocks from staging to memory; see the module docstring.

    Ports: `plan` (the planner's), `block` (blocks from the fetcher), `block_done` and the
    staging read port `st_sb`/`st_j`/`st_data` (the core's), `wr` (stream of write commands),
    `staging` (from the loader) and `idle` (no block announced or finished is left to drain).
    """

    def __init__(self, *, TR: int, TP: int, TC: int, NB: int, bmax: int, nmax: int) -> None:
        self.TR, self.TP, self.TC, self.NB, self.bmax, self.nmax = TR, TP, TC, NB, bmax, nmax
        super().__init__({
            "plan": In(plan_layout(TR, TP, TC, NB, bmax)),
            "block": In(stream.Signature(block_layout(TR, TC, NB))), "block_done": In(1),
            "st_sb": Out(1), "st_j": Out(range(TR)), "st_data": In(16 * 2 * TC),
            "wr": Out(stream.Signature(write_cmd_layout(nmax))),
            "staging": In(staging_signature()),
            "idle": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        TR, TC, NB, bmax, nmax = self.TR, self.TC, self.NB, self.bmax, self.nmax
        b_bits = bits_for(bmax)
        pl = self.plan
        f = pl.desc
        b, BR, cw, br_dst = pl.b, pl.BR, pl.cw, pl.br_dst
        info = Signal(self.block.payload.shape())
        rowreg = Signal(16 * 2 * TC)
        j = Signal(range(TR + 1))
        q = Signal(range(NB + 1))
        qoff = Signal(range(2 * TC * (NB + 1)))
        nsamp = Signal(b_bits + 1)
        ndst = Signal(ADDR)
        busy = Signal()
        blocks_ready = Signal(range(8))     # blocks the core finished that wait to be drained

        def arr(name, shape):
            return Array(Signal(shape, name=f"{name}{i}") for i in range(NB))
        o_sample, o_gend = arr("o_sample", b_bits + 1), arr("o_gend", b_bits + 1)
        o_pix, o_addr, o_sbase = arr("o_pix", ROW_BITS), arr("o_addr", ADDR), arr("o_sbase", ADDR)
        # the row block's first cursors, for its later column tiles
        k_sample, k_pix = arr("k_sample", b_bits + 1), arr("k_pix", ROW_BITS)
        k_addr, k_sbase = arr("k_addr", ADDR), arr("k_sbase", ADDR)
        cursors = ((o_sample, k_sample), (o_pix, k_pix), (o_addr, k_addr), (o_sbase, k_sbase))

        m.d.sync += blocks_ready.eq(blocks_ready + self.block_done - (self.block.valid & self.block.ready))
        m.d.comb += self.idle.eq((blocks_ready == 0) & ~busy)
        stage_free = Signal(2, init=0b11)
        freed = Signal(2)
        m.d.sync += stage_free.eq((stage_free & ~self.staging.claim) | freed)
        m.d.comb += [self.staging.free.eq(stage_free), self.st_sb.eq(info.sb)]

        shifted = (rowreg >> (qoff * 16))
        wdata = Signal(16 * nmax)
        m.d.comb += wdata.eq(shifted[:16 * min(nmax, 2 * TC)])
        cur_ok = o_sample[q] < o_gend[q]
        wr = self.wr.payload

        with m.FSM(name="write"):
            with m.State("IDLE"):
                with m.If((blocks_ready != 0) & self.block.valid):
                    m.d.comb += self.block.ready.eq(1)
                    blk = self.block.payload
                    m.d.sync += [info.eq(blk), q.eq(0), busy.eq(1)]
                    with m.If(blk.layer_start):
                        m.d.sync += [nsamp.eq(0), ndst.eq(f.dst_base)]
                    with m.If(blk.pass_start):
                        m.next = "CURSORS"
                    with m.Else():
                        for i in range(NB):
                            for o, k in cursors:
                                with m.If(blk.again):
                                    m.d.sync += o[i].eq(k[i])
                                with m.Else():
                                    m.d.sync += k[i].eq(o[i])
                        m.next = "ROW0"
            with m.State("CURSORS"):
                end = nsamp + BR
                m.d.sync += [o_sample[q].eq(nsamp), o_gend[q].eq(Mux(end < b, end, b)), o_pix[q].eq(0),
                             o_addr[q].eq(ndst), o_sbase[q].eq(ndst), nsamp.eq(end),
                             ndst.eq(ndst + br_dst), q.eq(q + 1),
                             k_sample[q].eq(nsamp), k_pix[q].eq(0), k_addr[q].eq(ndst), k_sbase[q].eq(ndst)]
                with m.If(q + 1 == info.gp):
                    m.next = "ROW0"
            with m.State("ROW0"):
                m.d.comb += self.st_j.eq(0)
                m.d.sync += [j.eq(0), q.eq(0), qoff.eq(0)]
                m.next = "LATCH"
            with m.State("LATCH"):
                m.d.comb += self.st_j.eq(1)
                m.d.sync += rowreg.eq(self.st_data)
                m.next = "EMIT"
            with m.State("EMIT"):
                # staging answers a cycle late: ask for row j+1 while emitting row j, and for
                # row j+2 in the cycle row j ends, so the row latched then is always j+1
                row_end = (~cur_ok | self.wr.ready) & (q + 1 == info.gp)
                m.d.comb += self.st_j.eq(Mux(row_end, j + 2, j + 1))
                m.d.comb += [self.wr.valid.eq(cur_ok), wr.addr.eq(o_addr[q] + 2 * info.col0),
                             wr.nwords.eq(info.w), wr.data.eq(wdata)]
                with m.If(~cur_ok | self.wr.ready):
                    with m.If(cur_ok):
                        with m.If(o_pix[q] + 1 == f.npix):
                            m.d.sync += [o_pix[q].eq(0), o_sample[q].eq(o_sample[q] + 1),
                                         o_sbase[q].eq(o_sbase[q] + f.dst_sample_stride),
                                         o_addr[q].eq(o_sbase[q] + f.dst_sample_stride)]
                        with m.Else():
                            m.d.sync += [o_pix[q].eq(o_pix[q] + 1), o_addr[q].eq(o_addr[q] + f.dst_pix_step)]
                    m.d.sync += [q.eq(q + 1), qoff.eq(qoff + cw)]
                    with m.If(q + 1 == info.gp):
                        m.d.sync += [q.eq(0), qoff.eq(0), j.eq(j + 1), rowreg.eq(self.st_data)]
                        with m.If(j + 1 == info.t):
                            m.d.comb += freed.eq(Mux(info.sb, 0b10, 0b01))
                            m.d.sync += busy.eq(0)
                            m.next = "IDLE"
        return m
