"""The control unit's im2col fetcher (hw/sequencer.py).

For the layer the planner presents on `plan`, from `go` on, it walks passes ->
row blocks -> column tiles -> weight steps and issues the DMA reads of every
step ahead of the core (`rd_cmd`): each step's weight rows (one read per
packed group), the block's bias on its first step, and its input rows, which
im2col builds straight from the previous layer's HWC tensor (one read per
run of contiguous channels of a kernel tap, or of a kernel row where its taps
follow in memory and the row's window reads no padding; padding reads are
zero fills).
Each step goes to the loader (`step`), each block to the writer (`block`),
both through 4-deep FIFOs. A row block runs every column tile before the next
block starts, so a buffered layer fills each block's input once for all its tiles
(the tiles re-read only the weights), and a pass's group count changes once a layer.

The fetcher starts step k + FETCH_AHEAD's reads once step k has been handed
to the core (at most FETCH_AHEAD = 3 fetched steps wait for the core), not
when a buffer half is released: the loader writes a step's data only after
the previous step has been handed over, which is when the core lets that half
be overwritten, so the reads of the steps beyond wait in the DMA's ports, in
order, and a step's round trip overlaps the core's work on the steps before
it instead of following them (with two, a short step waited for its round
trip every other step: docs/rtl-agreement.md).
"""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal, signed
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from fluidnpu.hw.descriptor import LAYOUT
from fluidnpu.hw.fill_walker import block_layout as fill_block_layout
from fluidnpu.hw.regmap import FETCH_AHEAD, ROW_BITS
from fluidnpu.hw.seq_streams import (
    ADDR,
    KIND_BIAS,
    KIND_INPUT,
    KIND_WEIGHT,
    block_layout,
    plan_layout,
    read_cmd_layout,
    step_layout,
    tag_layout,
)


class SeqFetcher(wiring.Component):
    """Issues the reads of every step ahead of the core; see the module docstring.

    Ports: `plan` and `go` from the planner, `rd_cmd` (stream of read commands), `step`
    (stream of `step_layout` to the loader), `block` (stream of `block_layout` to the
    writer), `cfg_g` (the core's group count, changed only while the core is idle),
    `core_idle` (from the loader: no step handed to the core is unreleased) and `idle`
    (the layer's reads are all issued and both FIFOs are empty).

    With `buffer` (an NPU built with the block input buffer, hw/buffered_input.py), for a layer whose
    descriptor is `buffered`: `fill_block` hands the fill walker each row block's groups while the
    block before it walks its first step in its first column tile (the cursors then reach the next
    block's first pixels; a pass's last block hands over the next pass's first block), the layer's
    first block as its pass starts, and `in_ctx` says of each input run its row block's half (`hb`,
    which alternates by row block, while the staging half `sb` alternates by block and tile), its
    sample and whether it is the row block's last run (in its last tile: the half then empties);
    `fill_issued` (one cycle) says a block's fill reads have all been issued.
    """

    def __init__(self, *, TR: int, TP: int, TC: int, NB: int, bmax: int, nmax: int, buffer: bool = False) -> None:
        self.TR, self.TP, self.TC, self.NB, self.bmax, self.nmax = TR, TP, TC, NB, bmax, nmax
        self.tag = tag_layout(NB, TR, TP, TC, nmax)
        self.buffer = buffer
        super().__init__({
            **({"buffered": In(1), "fill_issued": In(1),
                "fill_block": Out(stream.Signature(fill_block_layout(bmax, TR))),
                "in_ctx": Out(data.StructLayout({"half": 1, "sample": bits_for(bmax) + 1, "last": 1}))}
               if buffer else {}),
            "plan": In(plan_layout(TR, TP, TC, NB, bmax)), "go": In(1), "idle": Out(1),
            "rd_cmd": Out(stream.Signature(read_cmd_layout(self.tag, nmax))),
            "in_cmd": Out(stream.Signature(read_cmd_layout(self.tag, nmax))),
            "step": Out(stream.Signature(step_layout(TR))),
            "block": Out(stream.Signature(block_layout(TR, TC, NB))),
            "cfg_g": Out(range(NB + 1)), "core_idle": In(1),
        })

    def elaborate(self, platform) -> Module:  # noqa: C901 - one FSM, state by state
        m = Module()
        TR, TP, TC, NB, bmax, nmax = self.TR, self.TP, self.TC, self.NB, self.bmax, self.nmax
        b_bits = bits_for(bmax)
        pl = self.plan
        f = {name: pl.desc[name] for name, *_ in LAYOUT}
        b, BR, BP, nPE, TPk, g, gl, cw, br_src = pl.b, pl.BR, pl.BP, pl.nPE, pl.TPk, pl.g, pl.gl, pl.cw, pl.br_src
        cmd, icmd = self.rd_cmd.payload, self.in_cmd.payload
        tag, itag = cmd.tag, icmd.tag

        # at most 4 steps and 4 blocks wait for the loader and the writer
        m.submodules.step_fifo = step_fifo = fifo.SyncFIFOBuffered(width=self.step.payload.shape().size, depth=4)
        m.submodules.blk_fifo = blk_fifo = fifo.SyncFIFOBuffered(width=self.block.payload.shape().size, depth=4)
        m.d.comb += [self.step.valid.eq(step_fifo.r_rdy), self.step.payload.eq(step_fifo.r_data),
                     step_fifo.r_en.eq(self.step.ready),
                     self.block.valid.eq(blk_fifo.r_rdy), self.block.payload.eq(blk_fifo.r_data),
                     blk_fifo.r_en.eq(self.block.ready)]
        fetch_done = Signal()
        w_go, w_idle = Signal(), Signal()              # start the weight walker; it has no step
        if self.buffer:
            fill_depth = 4 * NB + 4
            m.submodules.fill_fifo = fill_fifo = fifo.SyncFIFOBuffered(width=self.fill_block.payload.shape().size,
                                                                       depth=fill_depth)
            # a block's first step hands over at most NB groups, one a cycle: it runs while the FIFO
            # has room for them (a register, so that no input run's valid waits on the hand-over)
            fill_room = Signal()
            m.d.sync += fill_room.eq(fill_fifo.level < fill_depth - NB - 1)
            m.d.comb += [self.fill_block.valid.eq(fill_fifo.r_rdy), self.fill_block.payload.eq(fill_fifo.r_data),
                         fill_fifo.r_en.eq(self.fill_block.ready)]
            m.d.comb += self.idle.eq(fetch_done & w_idle & (step_fifo.level == 0) & (blk_fifo.level == 0)
                                     & (fill_fifo.level == 0))
        else:
            m.d.comb += self.idle.eq(fetch_done & w_idle & (step_fifo.level == 0) & (blk_fifo.level == 0))

        col0 = Signal(16)
        w = Signal(range(2 * TC + 1))
        # the tile: the first of its row block (tile0), not the last (more_tiles), set as col0 moves; and
        # the next tile's width and whether one follows it, registers of col0 and the plan (col0 holds
        # for a whole (block, tile), at least two cycles)
        more_tiles, tile0 = Signal(), Signal()
        next_w, first_w = Signal.like(w), Signal.like(w)
        more_next, multi = Signal(), Signal()
        rest_next = f["cout"] - (col0 + nPE)
        w_first, tiles_more = Mux(f["cout"] < nPE, f["cout"], nPE), nPE < f["cout"]   # the first tile's
        m.d.sync += [next_w.eq(Mux(rest_next < nPE, rest_next, nPE)), more_next.eq(col0 + 2 * nPE < f["cout"]),
                     first_w.eq(w_first), multi.eq(tiles_more)]
        grp_next = Signal(b_bits + 1)
        nsamp = Signal(b_bits + 1)
        nsrc = Signal(ADDR)
        gp = Signal(range(NB + 1))
        last_pass = Signal()
        q = Signal(range(NB + 1))
        bi = Signal(ROW_BITS)
        t = Signal(range(TR + 1))
        j = Signal(range(TR + 1))
        p0 = Signal(ROW_BITS)
        nl = Signal(range(2 * TP + 1))
        lane = Signal(range(2 * TP + 1))
        w_lane = Signal(range(2 * TP + 1))             # the weight walker's row of the step
        rem = Signal(range(2 * TP + 1))
        wrow = Signal(ADDR)
        # every group's copy of a weight row / bias chunk is a read of its own, moved back by
        # q*cw words so that the row lands in group q's columns (docs/hw-architecture.md)
        wq, bq = Signal(range(NB + 1)), Signal(range(NB + 1))
        wq_off, bq_off = Signal(range(2 * TC + 1)), Signal(range(2 * TC + 1))     # q*cw, q < g
        bcol = Signal(range(2 * TC + nmax + 1))        # logical column of the bias chunk read
        sb = Signal()                                  # staging half: alternates by (row block, tile)
        hb = Signal()                                  # buffer half: alternates by row block
        first = Signal()
        last = Signal()
        cur_g = Signal(range(NB + 1))
        m.d.comb += self.cfg_g.eq(cur_g)

        n_sel = Mux(last_pass, pl.last.n, pl.full.n)
        s_sel = Mux(last_pass, pl.last.s, pl.full.s)
        big_sel = Mux(last_pass, pl.last.big, pl.full.big)

        # per-group cursors at the start of the current block
        def arr(name, shape):
            return Array(Signal(shape, name=f"{name}{i}") for i in range(NB))
        c_sample, c_gend = arr("c_sample", b_bits + 1), arr("c_gend", b_bits + 1)
        c_pix, c_oy, c_ox = arr("c_pix", ROW_BITS), arr("c_oy", 16), arr("c_ox", 16)
        c_iy, c_ix = arr("c_iy", signed(18)), arr("c_ix", signed(18))
        c_off, c_sbase = arr("c_off", signed(ADDR)), arr("c_sbase", ADDR)
        # working cursor of the row being fetched
        w_sample, w_gend = Signal(b_bits + 1), Signal(b_bits + 1)
        w_pix, w_oy, w_ox = Signal(ROW_BITS), Signal(16), Signal(16)
        w_iy, w_ix = Signal(signed(18)), Signal(signed(18))
        w_off, w_sbase = Signal(signed(ADDR)), Signal(ADDR)
        # tap state (ky, kx, channels left in the tap, byte offset): at the step start, and while
        # walking a row. The channels left (cin - ci) are kept rather than ci, and the move to the
        # next kernel row (kx_delta + ky_delta) is summed once per layer, so a run is one compare
        # after registers and the tap update one adder after the run (the timing proxy's budget)
        s_ky, s_kx, s_lit, s_off = Signal(8), Signal(8), Signal(16), Signal(signed(ADDR))
        t_ky, t_kx, t_lit, t_off = Signal(8), Signal(8), Signal(16), Signal(signed(ADDR))
        s_rlit, t_rlit = Signal(24), Signal(24)          # words left in the kernel row (from the tap)
        # the next step's start, as the current step's first row ends (that row walks tap by tap)
        n_ky, n_kx, n_lit, n_off, n_rlit = Signal(8), Signal(8), Signal(16), Signal(signed(ADDR)), Signal(24)
        kxy_delta = Signal(signed(ADDR))
        m.d.sync += kxy_delta.eq(f["kx_delta"] + f["ky_delta"])      # the plan is constant while a layer runs

        # next cursor after one row
        last_x = w_ox + 1 == f["out_w"]
        last_p = w_pix + 1 == f["npix"]
        nc_sig = {k: Signal.like(v, name=f"nc_{k}") for k, v in
                  dict(sample=w_sample, pix=w_pix, oy=w_oy, ox=w_ox, iy=w_iy, ix=w_ix, off=w_off,
                       sbase=w_sbase).items()}
        with m.If(last_p):
            m.d.comb += [nc_sig["sample"].eq(w_sample + 1), nc_sig["pix"].eq(0), nc_sig["oy"].eq(0),
                         nc_sig["ox"].eq(0), nc_sig["iy"].eq(-f["ph"]), nc_sig["ix"].eq(-f["pw"]),
                         nc_sig["off"].eq(f["origin"]), nc_sig["sbase"].eq(w_sbase + f["src_sample_stride"])]
        with m.Elif(last_x):
            m.d.comb += [nc_sig["sample"].eq(w_sample), nc_sig["pix"].eq(w_pix + 1), nc_sig["oy"].eq(w_oy + 1),
                         nc_sig["ox"].eq(0), nc_sig["iy"].eq(w_iy + f["sh"]), nc_sig["ix"].eq(-f["pw"]),
                         nc_sig["off"].eq(w_off + f["y_wrap"]), nc_sig["sbase"].eq(w_sbase)]
        with m.Else():
            m.d.comb += [nc_sig["sample"].eq(w_sample), nc_sig["pix"].eq(w_pix + 1), nc_sig["oy"].eq(w_oy),
                         nc_sig["ox"].eq(w_ox + 1), nc_sig["iy"].eq(w_iy), nc_sig["ix"].eq(w_ix + f["sw"]),
                         nc_sig["off"].eq(w_off + f["x_step"]), nc_sig["sbase"].eq(w_sbase)]

        # one im2col run of the current row: contiguous channels of one kernel tap -- or, where the taps of
        # a kernel row follow each other in memory (kx_delta = 0: the pixel pitch is cin) and the row's
        # whole window reads the input (or the row is a short group's padding, all zero fills), the rest
        # of the kernel row (`t_rlit` words left in it): one command, not one per tap. The first row of
        # each step (of its first group) still walks tap by tap: its end is the next step's start
        # (`n_*`), which a run ending inside a later tap would need a division by cin to find. Every
        # outcome's next tap state is computed from registers beside the choice, which only selects
        # (the timing proxy's budget).
        iy = w_iy + t_ky
        ix = w_ix + t_kx
        row_ok = w_sample < w_gend
        inside = (iy >= 0) & (iy < f["in_h"]) & (ix >= 0) & (ix < f["in_w"])
        kx_contig, x_lim, y_lim = Signal(), Signal(signed(18)), Signal(signed(18))
        m.d.sync += [kx_contig.eq(f["kx_delta"] == 0), x_lim.eq(f["in_w"] - f["kw"] + 1),
                     y_lim.eq(f["in_h"] - f["kh"] + 1)]
        window_in = (w_ix >= 0) & (w_ix < x_lim) & (w_iy >= 0) & (w_iy < y_lim)
        first_row = (j == 0) & (q == 0)
        merge = Signal()
        m.d.comb += merge.eq(kx_contig & (window_in | ~row_ok) & ~first_row)
        lit_le, rlit_le, last_tap = t_lit <= rem, t_rlit <= rem, t_lit == t_rlit
        row_end = Signal()       # the run ends the kernel row: on to the next one
        tap_end = Signal()       # the run ends the tap: on to the next tap of the kernel row
        m.d.comb += [row_end.eq(Mux(merge, rlit_le, lit_le & last_tap)), tap_end.eq(~merge & lit_le & ~last_tap)]
        run = Signal(range(2 * TP + 1))
        m.d.comb += run.eq(Mux(row_end, t_rlit, Mux(tap_end, t_lit, rem)))
        # tap state after this run (after a merged run that ends inside a tap, unused: the row ends there)
        nt_ky, nt_kx, nt_lit, nt_off = Signal(8), Signal(8), Signal(16), Signal(signed(ADDR))
        nt_rlit = Signal(24)
        with m.If(row_end):
            m.d.comb += [nt_ky.eq(t_ky + 1), nt_kx.eq(0), nt_lit.eq(f["cin"]), nt_rlit.eq(f["row_words"]),
                         nt_off.eq(t_off + 2 * t_rlit + kxy_delta)]
        with m.Elif(tap_end):
            m.d.comb += [nt_ky.eq(t_ky), nt_kx.eq(t_kx + 1), nt_lit.eq(f["cin"]), nt_rlit.eq(t_rlit - t_lit),
                         nt_off.eq(t_off + 2 * t_lit + f["kx_delta"])]
        with m.Else():
            m.d.comb += [nt_ky.eq(t_ky), nt_kx.eq(t_kx), nt_lit.eq(t_lit - rem), nt_rlit.eq(t_rlit - rem),
                         nt_off.eq(t_off + 2 * rem)]

        w_acc = self.rd_cmd.valid & self.rd_cmd.ready
        accepted = self.in_cmd.valid & self.in_cmd.ready

        ahead_ok = step_fifo.level < FETCH_AHEAD
        may_start = ahead_ok & step_fifo.w_rdy & w_idle

        first_c, last_c = Signal(), Signal()
        if self.buffer:
            # the loader takes a step's reads only after the step before it is handed to the core, and a
            # buffered step's input waits for its block's fill: so no step's reads may enter the DMA's
            # order ahead of the fill reads the step before it waits for. A step of block k starts once
            # the fills of every block before it have all been issued, and a later step of block k once
            # block k's have: `owed` (blocks started less blocks whose fill reads are all issued) <= 0.
            # A block's start counts a cycle late, from a register (`started`: no path from the step
            # hand-over logic into the count), and no step starts in that cycle
            owed, started = Signal(signed(4)), Signal()
            m.d.sync += [started.eq(step_fifo.w_en & first_c & tile0), owed.eq(owed + started - self.fill_issued)]
            with m.If(self.go):
                m.d.sync += owed.eq(0)
            may_start = may_start & (~self.buffered | ((owed <= 0) & ~started))
        step_w = Signal(self.step.payload.shape())
        m.d.comb += [step_w.t.eq(t), step_w.first.eq(first_c), step_w.last.eq(last_c), step_w.sb.eq(sb),
                     step_fifo.w_data.eq(step_w)]
        blk = Signal(self.block.payload.shape())
        m.d.comb += blk_fifo.w_data.eq(blk)
        if self.buffer:
            fill_w = Signal(self.fill_block.payload.shape())
            m.d.comb += fill_fifo.w_data.eq(fill_w)
            # whether the pass has a block after this one, and its rows: registers (bi and the pass plan
            # settle at least a cycle before a block's first step walks its rows)
            more_blocks, next_t = Signal(), Signal.like(t)
            m.d.sync += [more_blocks.eq(bi + 1 < n_sel), next_t.eq(Mux(bi + 1 < big_sel, s_sel + 1, s_sel))]
            # the next pass's first block, handed to the fill walker during this pass's last block (in its
            # first tile) as any next block is: its group count, rows, first sample and address
            # (registers; `pre_n` of its groups handed so far, the rest in CURSORS)
            layer_last = grp_next + gp == BP
            nxt_last = BP - (grp_next + gp) <= g
            pre_ok, pre_gp, pre_t = Signal(), Signal(range(NB + 1)), Signal.like(t)
            pre_n, pre_samp, pre_src = Signal(range(NB + 1)), Signal(b_bits + 1), Signal(ADDR)
            m.d.sync += [pre_ok.eq(~layer_last), pre_gp.eq(Mux(nxt_last, gl, g)),
                         pre_t.eq(Mux(nxt_last, Mux(pl.last.big != 0, pl.last.s + 1, pl.last.s),
                                      Mux(pl.full.big != 0, pl.full.s + 1, pl.full.s)))]
            with m.If(pre_n == 0):
                m.d.sync += [pre_samp.eq(nsamp), pre_src.eq(nsrc)]

        with m.FSM(name="fetch"):
            with m.State("IDLE"):
                m.d.comb += fetch_done.eq(1)
                with m.If(self.go):
                    m.d.sync += [col0.eq(0), grp_next.eq(0), nsamp.eq(0), nsrc.eq(f["src_base"])]
                    m.next = "TILE"
            with m.State("TILE"):         # the layer's first tile
                m.d.sync += [w.eq(w_first), tile0.eq(1), more_tiles.eq(tiles_more)]
                m.next = "PASS"
            with m.State("PASS"):
                is_last = BP - grp_next <= g
                groups = Mux(is_last, gl, g)
                m.d.sync += [gp.eq(groups), last_pass.eq(is_last), q.eq(0), bi.eq(0)]
                # the core's bank placement depends on the pass's group count: change it only when idle
                with m.If(groups != cur_g):
                    with m.If(self.core_idle & (step_fifo.level == 0)):
                        m.d.sync += cur_g.eq(groups)
                        m.next = "CURSORS"
                with m.Else():
                    m.next = "CURSORS"
            with m.State("CURSORS"):      # each group of the pass starts at its first sample, pixel 0
                end = nsamp + BR

                def group_cursors() -> None:
                    m.d.sync += [c_sample[q].eq(nsamp), c_gend[q].eq(Mux(end < b, end, b)), c_pix[q].eq(0),
                                 c_oy[q].eq(0), c_ox[q].eq(0), c_iy[q].eq(-f["ph"]), c_ix[q].eq(-f["pw"]),
                                 c_off[q].eq(f["origin"]), c_sbase[q].eq(nsrc),
                                 nsamp.eq(end), nsrc.eq(nsrc + br_src), q.eq(q + 1)]
                    with m.If(q + 1 == gp):
                        m.next = "BLOCK"
                if self.buffer:
                    # the pass's first block goes to the fill walker group by group, but for the groups
                    # handed over during the pass before (`pre_n`)
                    fb = fill_w
                    hand = self.buffered & (q >= pre_n)
                    m.d.comb += [fb.half.eq(hb), fb.sample.eq(nsamp), fb.iy.eq(-f["ph"]), fb.sbase.eq(nsrc),
                                 fb.t.eq(Mux(big_sel != 0, s_sel + 1, s_sel)), fb.gend.eq(Mux(end < b, end, b)),
                                 fb.cont.eq(q != 0), fb.close.eq(q + 1 == gp),
                                 fill_fifo.w_en.eq(hand & fill_fifo.w_rdy)]
                    with m.If(~hand | fill_fifo.w_rdy):
                        group_cursors()
                        with m.If(q + 1 == gp):
                            m.d.sync += pre_n.eq(0)
                else:
                    group_cursors()
            def load_group(qv, taps=None, rem_v=nl) -> None:
                """Start walking group qv's rows from its block-start cursor (same cycle, no bubble);
                `taps`: the step's first tap state (ky, kx, lit, off, rlit), where the step starts."""
                m.d.sync += [w_sample.eq(c_sample[qv]), w_gend.eq(c_gend[qv]), w_pix.eq(c_pix[qv]),
                             w_oy.eq(c_oy[qv]), w_ox.eq(c_ox[qv]), w_iy.eq(c_iy[qv]), w_ix.eq(c_ix[qv]),
                             w_off.eq(c_off[qv]), w_sbase.eq(c_sbase[qv]), j.eq(0), q.eq(qv),
                             rem.eq(rem_v), lane.eq(0)]
                if taps is not None:
                    m.d.sync += [reg.eq(v) for reg, v in zip((t_ky, t_kx, t_lit, t_off, t_rlit), taps)]

            def start_step(left, taps) -> None:
                """Hand the step (of `left` values to go) to the loader, start the weight walker on
                its weight rows and walk its input rows from `taps`, all in this cycle."""
                nl_v = Mux(left < TPk, left, TPk)
                m.d.comb += [step_fifo.w_en.eq(1), first_c.eq(left == f["P"]), last_c.eq(left <= TPk),
                             w_go.eq(1)]
                m.d.sync += [nl.eq(nl_v), first.eq(left == f["P"]), last.eq(left <= TPk)]
                load_group(0, taps, nl_v)
                m.next = "INPUT"

            with m.State("BLOCK"):
                m.d.comb += [blk.t.eq(Mux(bi < big_sel, s_sel + 1, s_sel)), blk.gp.eq(gp), blk.col0.eq(col0),
                             blk.w.eq(w), blk.sb.eq(sb), blk.pass_start.eq((bi == 0) & tile0),
                             blk.layer_start.eq((bi == 0) & tile0 & (grp_next == 0)), blk.again.eq(~tile0)]
                with m.If(blk_fifo.w_rdy):
                    t_blk = Mux(bi < big_sel, s_sel + 1, s_sel)
                    taps0 = (0, 0, f["cin"], 0, f["row_words"])
                    m.d.comb += blk_fifo.w_en.eq(1)
                    m.d.sync += [t.eq(t_blk), p0.eq(0), wrow.eq(f["weight_base"] + 2 * col0)]
                    m.d.sync += [reg.eq(v) for reg, v in zip((s_ky, s_kx, s_lit, s_off, s_rlit), taps0)]
                    # the block's first step starts at once where the fetcher may run ahead
                    with m.If(may_start):
                        m.d.comb += step_w.t.eq(t_blk)
                        start_step(f["P"], taps0)
                    with m.Else():
                        m.next = "STEP"
            with m.State("STEP"):
                with m.If(may_start):
                    start_step(f["P"] - p0, (s_ky, s_kx, s_lit, s_off, s_rlit))
            with m.State("INPUT"):
                row_last = Mux(row_end, t_rlit == rem, Mux(tap_end, t_lit == rem, 1))
                step_done = row_last & (j + 1 == t) & (q + 1 == gp)
                # every read of a step is issued before any of the next (the two streams share the
                # ports' one order, and the loader takes a stream's next step only after this one): the
                # next step starts only once the weight walker is idle, and a block's last row waits
                # for it, since what follows the block changes what the weight walker reads (a
                # condition on registers only: the timing proxy's budget)
                in_valid = ~(last & (j + 1 == t) & (q + 1 == gp)) | w_idle
                if self.buffer:
                    # as the block's first step ends each group's rows, the next block's group goes to the
                    # fill walker: its cursor (nc_sig) is that group's first pixel of the next block
                    # (the pass's last block hands over the next pass's first block instead, one group a
                    # group-end, as many as that pass has, the rest in CURSORS)
                    at_end = self.buffered & row_last & (j + 1 == t) & first & tile0
                    push = at_end & more_blocks
                    prepush = at_end & ~more_blocks & pre_ok & (pre_n < pre_gp)
                    pre_end = pre_samp + BR
                    fb = fill_w
                    with m.If(more_blocks):
                        m.d.comb += [fb.sample.eq(nc_sig["sample"]), fb.oy.eq(nc_sig["oy"]), fb.ox.eq(nc_sig["ox"]),
                                     fb.iy.eq(nc_sig["iy"]), fb.sbase.eq(nc_sig["sbase"]), fb.t.eq(next_t),
                                     fb.gend.eq(w_gend), fb.cont.eq(q != 0), fb.close.eq(q + 1 == gp)]
                    with m.Else():
                        m.d.comb += [fb.sample.eq(pre_samp), fb.iy.eq(-f["ph"]), fb.sbase.eq(pre_src), fb.t.eq(pre_t),
                                     fb.gend.eq(Mux(pre_end < b, pre_end, b)), fb.cont.eq(pre_n != 0),
                                     fb.close.eq(pre_n + 1 == pre_gp)]
                    m.d.comb += [fb.half.eq(~hb), fill_fifo.w_en.eq(accepted & (push | prepush)),
                                 self.in_ctx.half.eq(hb), self.in_ctx.sample.eq(w_sample),
                                 self.in_ctx.last.eq(last & step_done & ~more_tiles)]
                    with m.If(accepted & prepush):
                        m.d.sync += [pre_n.eq(pre_n + 1), pre_samp.eq(pre_end), pre_src.eq(pre_src + br_src)]
                    in_valid = in_valid & ~(self.buffered & first & ~fill_room)
                m.d.comb += [self.in_cmd.valid.eq(in_valid),
                             icmd.addr.eq(w_sbase + w_off + t_off),
                             icmd.nwords.eq(run), icmd.zero.eq(~(inside & row_ok)),
                             itag.kind.eq(KIND_INPUT), itag.q.eq(q), itag.idx.eq(j), itag.lane.eq(lane),
                             itag.row_last.eq(row_last), itag.step_last.eq(step_done)]
                with m.If(accepted):
                    with m.If(row_last):
                        # every row starts at the step's first tap; the first row's end is the next step's
                        m.d.sync += [t_ky.eq(s_ky), t_kx.eq(s_kx), t_lit.eq(s_lit), t_off.eq(s_off),
                                     t_rlit.eq(s_rlit), rem.eq(nl), lane.eq(0), j.eq(j + 1)]
                        with m.If(first_row):
                            m.d.sync += [n_ky.eq(nt_ky), n_kx.eq(nt_kx), n_lit.eq(nt_lit), n_off.eq(nt_off),
                                         n_rlit.eq(nt_rlit)]
                        for k in nc_sig:
                            m.d.sync += {"sample": w_sample, "pix": w_pix, "oy": w_oy, "ox": w_ox, "iy": w_iy,
                                         "ix": w_ix, "off": w_off, "sbase": w_sbase}[k].eq(nc_sig[k])
                        with m.If(j + 1 == t):
                            with m.If(last & ~more_tiles):  # the cursor moves on for the next row block
                                m.d.sync += [c_sample[q].eq(nc_sig["sample"]), c_pix[q].eq(nc_sig["pix"]),
                                             c_oy[q].eq(nc_sig["oy"]), c_ox[q].eq(nc_sig["ox"]),
                                             c_iy[q].eq(nc_sig["iy"]), c_ix[q].eq(nc_sig["ix"]),
                                             c_off[q].eq(nc_sig["off"]), c_sbase[q].eq(nc_sig["sbase"])]
                            with m.If(q + 1 != gp):
                                load_group(q + 1)            # same taps, the next group's rows
                            with m.Else():
                                # the step's reads are all issued: on to the next step, block or pass
                                nxt = [Mux(first_row, a, b) for a, b in ((nt_ky, n_ky), (nt_kx, n_kx), (nt_lit, n_lit),
                                                                          (nt_off, n_off), (nt_rlit, n_rlit))]
                                m.d.sync += [p0.eq(p0 + TPk)]
                                m.d.sync += [reg.eq(v) for reg, v in zip((s_ky, s_kx, s_lit, s_off, s_rlit), nxt)]
                                with m.If(last):
                                    m.d.sync += sb.eq(~sb)
                                    with m.If(more_tiles):      # the same row block, the next column tile
                                        m.d.sync += [col0.eq(col0 + nPE), w.eq(next_w), tile0.eq(0),
                                                     more_tiles.eq(more_next)]
                                        m.next = "BLOCK"
                                    with m.Else():              # the row block is done in every tile
                                        m.d.sync += [col0.eq(0), w.eq(first_w), tile0.eq(1), more_tiles.eq(multi),
                                                     bi.eq(bi + 1), hb.eq(~hb)]
                                        with m.If(bi + 1 == n_sel):
                                            m.d.sync += [grp_next.eq(grp_next + gp), q.eq(0)]
                                            with m.If(grp_next + gp == BP):
                                                m.next = "IDLE"
                                            with m.Else():
                                                m.next = "PASS"
                                        with m.Else():
                                            m.next = "BLOCK"
                                with m.Else():
                                    # the next step of the block: start it at once when the fetcher
                                    # may run ahead, so its first weight read follows this read directly
                                    with m.If(may_start):
                                        start_step(f["P"] - (p0 + TPk), nxt)
                                    with m.Else():
                                        m.next = "STEP"
                    with m.Else():
                        m.d.sync += [t_ky.eq(nt_ky), t_kx.eq(nt_kx), t_lit.eq(nt_lit), t_off.eq(nt_off),
                                     t_rlit.eq(nt_rlit), rem.eq(rem - run), lane.eq(lane + run)]

        # the weight walker: a step's weight rows, one read per group q (wq, wq_off = q*cw), then on a
        # block's first step the bias, on its own command stream beside the input rows
        with m.FSM(name="weights"):
            with m.State("IDLE"):
                m.d.comb += w_idle.eq(1)
                with m.If(w_go):
                    m.d.sync += w_lane.eq(0)
                    m.next = "WEIGHTS"
            with m.State("WEIGHTS"):
                m.d.comb += [self.rd_cmd.valid.eq(1), cmd.addr.eq(wrow - 2 * wq_off),
                             cmd.nwords.eq(wq_off + w), tag.kind.eq(KIND_WEIGHT), tag.lane.eq(w_lane),
                             tag.q.eq(wq), tag.step_last.eq((wq + 1 == gp) & (w_lane + 1 == nl) & ~first)]
                with m.If(w_acc):
                    m.d.sync += [wq.eq(wq + 1), wq_off.eq(wq_off + cw)]
                    with m.If(wq + 1 == gp):
                        m.d.sync += [wq.eq(0), wq_off.eq(0), wrow.eq(wrow + 2 * f["cout"]), w_lane.eq(w_lane + 1)]
                        with m.If((w_lane + 1 == nl) & first):
                            m.next = "BIAS"
                        with m.Elif(w_lane + 1 == nl):
                            m.next = "IDLE"
            with m.State("BIAS"):
                # int32 bias of the tile's w columns for group q (bq, bq_off = q*cw), in chunks of
                # nmax/2 logical columns from bcol (a multiple of nmax/2, starting at the chunk
                # holding column q*cw), each read q*cw int32 before the column it lands in
                left_words = 2 * (bq_off + w - bcol)
                m.d.comb += [self.rd_cmd.valid.eq(1),
                             cmd.addr.eq(f["bias_base"] + 4 * col0 + 4 * bcol - 4 * bq_off),
                             cmd.nwords.eq(Mux(left_words < nmax, left_words, nmax)),
                             tag.kind.eq(KIND_BIAS), tag.idx.eq(bcol), tag.q.eq(bq),
                             tag.step_last.eq((left_words <= nmax) & (bq + 1 == gp))]
                with m.If(w_acc):
                    m.d.sync += bcol.eq(bcol + nmax // 2)
                    with m.If(left_words <= nmax):          # group q's last chunk
                        nxt_off = bq_off + cw
                        # the next group starts in this chunk unless its first column is the next one's
                        m.d.sync += [bq.eq(bq + 1), bq_off.eq(nxt_off),
                                     bcol.eq(Mux(nxt_off < bcol + nmax // 2, bcol, bcol + nmax // 2))]
                        with m.If(bq + 1 == gp):
                            m.d.sync += [bq.eq(0), bq_off.eq(0), bcol.eq(0)]
                            m.next = "IDLE"
        return m
