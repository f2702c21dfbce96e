"""The Control Unit: runs a subnet's layers on the EngineCore through the DMA.

Per layer it fetches the descriptor, looks up the layer's <BR, k> in the FBCB
for the current Bactive, plans the passes and balanced row blocks exactly as
docs/interpretations.md defines them (the same plan dse/perf_model.py prices),
then four small machines run concurrently:

* the fetcher walks column tiles -> passes -> blocks -> weight steps and
  issues DMA reads for each step's weights (+ the block's bias) and its input
  rows (im2col runs straight from the previous layer's HWC tensor) into the
  free half of the double buffers;
* the loader routes DMA responses into the core's buffers and, once a step's
  data is complete, hands the step to the core;
* the core streams rows and writes post-processed blocks to staging;
* the writer drains each finished block from staging to memory.

Everything the sequencer would need a multiplier for is precomputed by the
host into the descriptor (hw/descriptor.py) or built by repeated addition.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from fluidnpu.hw.descriptor import DESC_STRIDE_BYTES, DESC_WORDS, LAYOUT
from fluidnpu.hw.divider import SeqDivider
from fluidnpu.hw.regmap import ErrorCode

KIND_DESC, KIND_WEIGHT, KIND_BIAS, KIND_INPUT = 0, 1, 2, 3
DESC_CMD_WORDS = 16                     # 16-bit words per descriptor read command
ROW_BITS = 24                           # rows of a pass (Bmax * R) and R itself
ADDR = 32


def tag_layout(NB: int, TR: int, TP: int, TC: int, nmax: int) -> data.StructLayout:
    """What a DMA read carries back so the loader knows where its data goes."""
    idx = max(bits_for(TR), bits_for(2 * TC + nmax), bits_for(DESC_WORDS * 2))
    return data.StructLayout({
        "kind": 2, "step_last": 1, "row_last": 1,
        "q": bits_for(NB), "idx": idx, "lane": bits_for(2 * TP),
    })


class Sequencer(wiring.Component):
    """The NPU's control unit; see the module docstring and docs/hw-architecture.md."""

    def __init__(self, *, TR: int, TP: int, TC: int, NB: int, bmax: int, layers: int, nmax: int,
                 stackable: bool = True) -> None:
        self.TR, self.TP, self.TC, self.NB, self.bmax, self.layers, self.nmax = TR, TP, TC, NB, bmax, layers, nmax
        self.stackable = stackable
        self.tag = tag_layout(NB, TR, TP, TC, nmax)
        b_bits = bits_for(bmax)
        self.fbcb_bits = ceil_log2(bmax) + 2
        super().__init__({
            # registers
            "start": In(1), "desc_base": In(ADDR), "desc_count": In(16), "bactive": In(b_bits),
            "fbcb_addr": Out(range(max(2, layers * bmax))), "fbcb_data": In(self.fbcb_bits),
            "busy": Out(1), "done": Out(1), "error": Out(1), "error_code": Out(8),
            "layer_done": Out(1), "dma_stall": Out(1),
            # DMA read
            "rd_cmd_valid": Out(1), "rd_cmd_ready": In(1), "rd_cmd_addr": Out(ADDR),
            "rd_cmd_nwords": Out(range(nmax + 1)), "rd_cmd_zero": Out(1), "rd_cmd_tag": Out(self.tag),
            "rd_rsp_valid": In(1), "rd_rsp_ready": Out(1), "rd_rsp_data": In(16 * nmax),
            "rd_rsp_tag": In(self.tag), "rd_error": In(1),
            # DMA write
            "wr_valid": Out(1), "wr_ready": In(1), "wr_addr": Out(ADDR),
            "wr_nwords": Out(range(nmax + 1)), "wr_data": Out(16 * nmax),
            "wr_idle": In(1), "wr_error": In(1),
            # EngineCore
            "cfg_k": Out(2), "cfg_g": Out(range(NB + 1)), "cfg_cw": Out(range(2 * TC + 1)),
            "cfg_shift": Out(5), "cfg_relu": Out(1),
            "in_wr_valid": Out(1), "in_wr_ib": Out(1), "in_wr_q": Out(range(NB)),
            "in_wr_j": Out(range(TR)), "in_wr_data": Out(16 * 2 * TP),
            "w_wr_valid": Out(1), "w_wr_wb": Out(1), "w_wr_q": Out(range(NB)), "w_wr_lane": Out(range(2 * TP)),
            "w_wr_data": Out(16 * 2 * TC),
            "b_wr_valid": Out(1), "b_wr_wb": Out(1), "b_wr_q": Out(range(NB)), "b_wr_base": Out(range(2 * TC + nmax)),
            "b_wr_data": Out(16 * nmax),
            "step_valid": Out(1), "step_ready": In(1), "step_ib": Out(1), "step_wb": Out(1),
            "step_t": Out(range(TR + 1)), "step_first": Out(1), "step_last": Out(1), "step_sb": Out(1),
            "released": In(1), "block_done": In(1),
            "st_sb": Out(1), "st_j": Out(range(TR)), "st_data": In(16 * 2 * TC),
            "mac_active": In(1),
        })

    # ------------------------------------------------------------------
    def elaborate(self, platform) -> Module:  # noqa: C901 - one FSM per concern, kept together
        m = Module()
        TR, TP, TC, NB, bmax, nmax = self.TR, self.TP, self.TC, self.NB, self.bmax, self.nmax
        h = TP // 2
        b_bits = bits_for(bmax)

        m.submodules.div = div = SeqDivider(ROW_BITS)
        # small divisions (groups per pass, rows per group) on a divider as narrow as their operands
        m.submodules.divs = divs = SeqDivider(bits_for(max(TR, 2 * TC, NB)))

        # ---------------- descriptor registers ----------------
        desc_hw = Array(Signal(16, name=f"desc_hw{i}") for i in range(DESC_WORDS * 2))
        words = [Cat(desc_hw[2 * i], desc_hw[2 * i + 1]) for i in range(DESC_WORDS)]
        f = {}
        for name, word, lsb, width, is_signed in LAYOUT:
            v = words[word][lsb:lsb + width]
            f[name] = v.as_signed() if is_signed else v

        # ---------------- per-layer plan ----------------
        b = Signal(b_bits)
        kcode = Signal(2)
        BR = Signal(b_bits)
        BP = Signal(b_bits)
        n_last = Signal(b_bits)            # samples of the last group
        nPE = Signal(range(2 * TC + 1))
        TPk = Signal(range(2 * TP + 1))
        TRk = Signal(range(TR + 1))
        g = Signal(range(NB + 1))          # groups of a full pass
        gl = Signal(range(NB + 1))         # groups of the last pass
        cw = Signal(range(2 * TC + 1))
        rows_f, rows_l, rows_nl = Signal(ROW_BITS), Signal(ROW_BITS), Signal(ROW_BITS)
        br_src, br_dst = Signal(ADDR), Signal(ADDR)
        plan = {kind: {"n": Signal(ROW_BITS, name=f"n_{kind}"), "s": Signal(ROW_BITS, name=f"s_{kind}"),
                       "big": Signal(ROW_BITS, name=f"big_{kind}"), "tre": Signal(ROW_BITS, name=f"tre_{kind}")}
                for kind in ("f", "l")}
        acc = Signal(ROW_BITS)
        cnt = Signal(b_bits + 1)
        cur_layer = Signal(16)
        desc_addr = Signal(ADDR)
        desc_got = Signal(range(4))
        desc_sent = Signal(range(4))
        err_latched = Signal(8)
        div_started = Signal()

        m.d.comb += [self.cfg_k.eq(kcode), self.cfg_cw.eq(cw), self.cfg_shift.eq(f["shift"]),
                     self.cfg_relu.eq(f["relu"])]

        # ---------------- shared state between the concurrent machines ----------------
        fetch_go = Signal()
        fetch_done = Signal()
        stage_free = Signal(2, init=0b11)
        steps_out = Signal(range(8))
        blocks_ready = Signal(range(8))
        rd_out = Signal(range(64))         # read commands accepted, responses not yet consumed

        step_fifo = fifo.SyncFIFOBuffered(width=bits_for(TR) + 3, depth=4)
        m.submodules.step_fifo = step_fifo
        blk_layout = data.StructLayout({"t": bits_for(TR), "gp": bits_for(NB), "col0": 16, "w": bits_for(2 * TC),
                                        "sb": 1, "pass_start": 1, "tile_start": 1})
        blk_fifo = fifo.SyncFIFOBuffered(width=blk_layout.size, depth=4)
        m.submodules.blk_fifo = blk_fifo

        # ---------------- main control FSM ----------------
        rd_cmd_desc = Signal()            # the control FSM owns the read port (descriptor fetch)
        writer_busy = Signal()
        with m.FSM(name="ctrl") as ctrl:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [cur_layer.eq(0), desc_addr.eq(self.desc_base), b.eq(self.bactive),
                                 err_latched.eq(0)]
                    with m.If((self.bactive == 0) | (self.bactive > bmax)):
                        m.d.sync += err_latched.eq(ErrorCode.BAD_BACTIVE)
                        m.next = "ERROR"
                    with m.Elif(self.desc_count == 0):
                        m.next = "DONE"
                    with m.Else():
                        m.d.sync += [desc_got.eq(0), desc_sent.eq(0)]
                        m.next = "DESC"
            with m.State("DESC"):
                m.d.comb += rd_cmd_desc.eq(desc_sent < 3)
                with m.If(self.rd_cmd_valid & self.rd_cmd_ready):
                    m.d.sync += desc_sent.eq(desc_sent + 1)
                with m.If(desc_got == 3):
                    m.next = "FBCB"
            with m.State("FBCB"):
                m.d.comb += self.fbcb_addr.eq(f["layer"] * bmax + b - 1)
                with m.If((f["layer"] >= self.layers) | (f["npix"] == 0) | (f["cout"] == 0)
                          | (f["P"] == 0) | (f["cin"] == 0) | (f["kw"] == 0) | (f["out_w"] == 0)):
                    m.d.sync += err_latched.eq(ErrorCode.BAD_DESCRIPTOR)
                    m.next = "ERROR"
                with m.Else():
                    m.next = "FBCB2"
            with m.State("FBCB2"):
                m.d.comb += self.fbcb_addr.eq(f["layer"] * bmax + b - 1)
                code = self.fbcb_data[:2]
                brm1 = self.fbcb_data[2:] if self.fbcb_bits > 2 else Const(0, 1)
                m.d.sync += [kcode.eq(code), BR.eq(brm1 + 1), acc.eq(0), cnt.eq(0)]
                st = self.stackable
                no_mode = ((code == 3) | ((code == 1) & (not st or TC < 2 or TR < 2))
                           | ((code == 2) & (not st or TP < 2 or TR < 2)))
                with m.If(no_mode | (brm1 + 1 > b)):
                    m.d.sync += err_latched.eq(ErrorCode.BAD_DESCRIPTOR)
                    m.next = "ERROR"
                with m.Else():
                    with m.Switch(code):
                        with m.Case(0):
                            m.d.sync += [nPE.eq(TC), TPk.eq(TP), TRk.eq(TR)]
                        with m.Case(1):
                            m.d.sync += [nPE.eq(TC // 2), TPk.eq(2 * TP), TRk.eq(TR // 2)]
                        with m.Case(2):
                            m.d.sync += [nPE.eq(2 * TC), TPk.eq(h), TRk.eq(TR // 2)]
                    m.next = "BP"
            with m.State("BP"):           # BP = ceil(b / BR), n_last = samples of the last group
                with m.If(acc + BR >= b):
                    m.d.sync += [BP.eq(cnt + 1), n_last.eq(b - acc), acc.eq(0), cnt.eq(0),
                                 rows_f.eq(0), rows_nl.eq(0), br_src.eq(0), br_dst.eq(0)]
                    m.next = "ROWS"
                with m.Else():
                    m.d.sync += [acc.eq(acc + BR), cnt.eq(cnt + 1)]
            with m.State("ROWS"):         # BR*R, n_last*R, BR*strides by repeated addition
                m.d.sync += [rows_f.eq(rows_f + f["npix"]), br_src.eq(br_src + f["src_sample_stride"]),
                             br_dst.eq(br_dst + f["dst_sample_stride"]), cnt.eq(cnt + 1)]
                with m.If(cnt < n_last):
                    m.d.sync += rows_nl.eq(rows_nl + f["npix"])
                with m.If(cnt + 1 == BR):
                    m.d.sync += div_started.eq(0)
                    m.next = "GMAX"
            with m.State("GMAX"):         # g = min(BP, nPE // C) when C <= nPE
                packed = f["cout"] <= nPE
                with m.If(~packed):
                    m.d.sync += [g.eq(1), cw.eq(nPE)]
                    m.next = "LAST"
                with m.Elif(~div_started):
                    m.d.comb += [divs.start.eq(1), divs.dividend.eq(nPE), divs.divisor.eq(f["cout"])]
                    m.d.sync += div_started.eq(1)
                with m.Elif(divs.done):
                    # never more groups than banks: an engine built without packing (NB = 2) still
                    # runs an FBCB that asks for more groups, in more passes
                    gmax = Mux(BP < NB, BP, NB)
                    m.d.sync += [g.eq(Mux(divs.quotient < gmax, divs.quotient, gmax)), cw.eq(f["cout"])]
                    m.next = "LAST"
            with m.State("LAST"):         # groups of the last pass: BP - (npass-1)*g
                m.d.sync += [acc.eq(BP), div_started.eq(0)]
                m.next = "LAST2"
            with m.State("LAST2"):
                with m.If(acc > g):
                    m.d.sync += acc.eq(acc - g)
                with m.Else():
                    m.d.sync += [gl.eq(acc), rows_l.eq(Mux(acc == 1, rows_nl, rows_f))]
                    # one pass: only the last pass's plan is needed
                    m.next = "TRE_F"
                    with m.If(BP <= g):
                        m.next = "TRE_L"
            # The block plan of both pass kinds: TRe = TRk // groups, n = ceil(rows / TRe),
            # s, big = divmod(rows, n). A pass that fits one block (rows <= TRe) needs no
            # division beyond TRe: n = 1, s = rows.
            for kind, groups, rows, nxt in (("f", g, rows_f, "TRE_L"), ("l", gl, rows_l, "RUN_START")):
                p = plan[kind]

                def planned(s_val, big_val, p=p, kind=kind, nxt=nxt):
                    m.d.sync += [p["s"].eq(s_val), p["big"].eq(big_val), div_started.eq(0)]
                    m.next = nxt
                    if kind == "f":   # the last pass is like the others: reuse the plan
                        with m.If((gl == g) & (rows_l == rows_f)):
                            m.d.sync += [plan["l"]["tre"].eq(plan["f"]["tre"]), plan["l"]["s"].eq(s_val),
                                         plan["l"]["big"].eq(big_val)]
                            m.next = "RUN_START"

                with m.State(f"TRE_{kind.upper()}"):
                    with m.If(~div_started):
                        m.d.comb += [divs.start.eq(1), divs.dividend.eq(TRk), divs.divisor.eq(groups)]
                        m.d.sync += div_started.eq(1)
                    with m.Elif(divs.done):
                        m.d.sync += [p["tre"].eq(divs.quotient), div_started.eq(0)]
                        with m.If(divs.quotient == 0):
                            m.d.sync += err_latched.eq(ErrorCode.BAD_DESCRIPTOR)
                            m.next = "ERROR"
                        with m.Else():
                            m.next = f"N_{kind.upper()}"
                with m.State(f"N_{kind.upper()}"):
                    with m.If(rows <= p["tre"]):
                        m.d.sync += p["n"].eq(1)
                        if kind == "f":
                            with m.If((gl == g) & (rows_l == rows_f)):
                                m.d.sync += plan["l"]["n"].eq(1)
                        planned(rows, 0)
                    with m.Elif(~div_started):
                        m.d.comb += [div.start.eq(1), div.dividend.eq(rows), div.divisor.eq(p["tre"])]
                        m.d.sync += div_started.eq(1)
                    with m.Elif(div.done):
                        m.d.sync += [p["n"].eq(div.quotient + (div.remainder != 0)), div_started.eq(0)]
                        m.next = f"S_{kind.upper()}"
                with m.State(f"S_{kind.upper()}"):
                    with m.If(~div_started):
                        m.d.comb += [div.start.eq(1), div.dividend.eq(rows), div.divisor.eq(p["n"])]
                        m.d.sync += div_started.eq(1)
                    with m.Elif(div.done):
                        if kind == "f":
                            with m.If((gl == g) & (rows_l == rows_f)):
                                m.d.sync += plan["l"]["n"].eq(p["n"])
                        planned(div.quotient, div.remainder)
            with m.State("RUN_START"):
                m.d.comb += fetch_go.eq(1)
                m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += self.dma_stall.eq(~self.mac_active)
                quiet = (fetch_done & (step_fifo.level == 0) & (steps_out == 0) & (blk_fifo.level == 0)
                         & (blocks_ready == 0) & self.wr_idle & (rd_out == 0) & ~writer_busy)
                with m.If(quiet):
                    m.next = "LAYER_END"
            with m.State("LAYER_END"):
                m.d.comb += self.layer_done.eq(1)
                with m.If(err_latched != 0):
                    m.next = "ERROR"
                with m.Elif(cur_layer + 1 == self.desc_count):
                    m.next = "DONE"
                with m.Else():
                    m.d.sync += [cur_layer.eq(cur_layer + 1), desc_addr.eq(desc_addr + DESC_STRIDE_BYTES),
                                 desc_got.eq(0), desc_sent.eq(0)]
                    m.next = "DESC"
            with m.State("DONE"):
                m.d.comb += self.done.eq(1)
                m.next = "IDLE"
            with m.State("ERROR"):
                m.d.comb += [self.error.eq(1), self.error_code.eq(err_latched)]
                m.next = "IDLE"
        m.d.comb += self.busy.eq(~ctrl.ongoing("IDLE"))

        # DMA errors are latched and reported when the layer has drained.
        with m.If((self.rd_error | self.wr_error) & (err_latched == 0) & self.busy):
            m.d.sync += err_latched.eq(Mux(self.rd_error, ErrorCode.AXI_READ, ErrorCode.AXI_WRITE))

        self._fetcher(m, f, b, BR, BP, nPE, TPk, g, gl, cw, plan, br_src, fetch_go, fetch_done,
                      steps_out, step_fifo, blk_fifo, blk_layout, rd_cmd_desc, desc_addr, desc_sent)
        self._loader(m, desc_hw, desc_got, step_fifo, stage_free, steps_out)
        self._writer(m, f, b, BR, cw, br_dst, blk_fifo, blk_layout, blocks_ready, stage_free, writer_busy)

        # read-command / response bookkeeping
        issued = self.rd_cmd_valid & self.rd_cmd_ready
        consumed = self.rd_rsp_valid & self.rd_rsp_ready
        m.d.sync += rd_out.eq(rd_out + issued - consumed)
        return m

    # ------------------------------------------------------------------
    def _fetcher(self, m, f, b, BR, BP, nPE, TPk, g, gl, cw, plan, br_src, fetch_go, fetch_done,
                 steps_out, step_fifo, blk_fifo, blk_layout, rd_cmd_desc, desc_addr, desc_sent):
        """Issues the reads of every step ahead of the core.

        The fetcher starts a step's reads once the step before the previous one has been
        handed to the core (at most two fetched steps wait for the core), not when its
        buffer half is released: the loader writes a step's data only after the previous
        step has been handed over, which is when the core lets that half be overwritten,
        so the DMA round trip overlaps the core's last rows instead of following them.
        """
        TR, TP, TC, NB, bmax, nmax = self.TR, self.TP, self.TC, self.NB, self.bmax, self.nmax
        b_bits = bits_for(bmax)
        tag = Signal(self.tag)

        col0 = Signal(16)
        w = Signal(range(2 * TC + 1))
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
        rem = Signal(range(2 * TP + 1))
        wrow = Signal(ADDR)
        # every group's copy of a weight row / bias chunk is a read of its own, moved back by
        # q*cw words so that the row lands in group q's columns (docs/hw-architecture.md)
        wq, bq = Signal(range(NB + 1)), Signal(range(NB + 1))
        wq_off, bq_off = Signal(range(2 * TC + 1)), Signal(range(2 * TC + 1))     # q*cw, q < g
        bcol = Signal(range(2 * TC + nmax + 1))        # logical column of the bias chunk read
        sb = Signal()
        first = Signal()
        last = Signal()
        cur_g = Signal(range(NB + 1))
        m.d.comb += self.cfg_g.eq(cur_g)

        n_sel = Mux(last_pass, plan["l"]["n"], plan["f"]["n"])
        s_sel = Mux(last_pass, plan["l"]["s"], plan["f"]["s"])
        big_sel = Mux(last_pass, plan["l"]["big"], plan["f"]["big"])

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
        # tap state (ky, kx, ci, byte offset): at the step start, and while walking a row
        s_ky, s_kx, s_ci, s_off = Signal(8), Signal(8), Signal(16), Signal(signed(ADDR))
        t_ky, t_kx, t_ci, t_off = Signal(8), Signal(8), Signal(16), Signal(signed(ADDR))

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

        # one im2col run of the current row: contiguous channels of one kernel tap
        left_in_tap = f["cin"] - t_ci
        run = Signal(range(2 * TP + 1))
        m.d.comb += run.eq(Mux(left_in_tap < rem, left_in_tap, rem))
        iy = w_iy + t_ky
        ix = w_ix + t_kx
        inside = (iy >= 0) & (iy < f["in_h"]) & (ix >= 0) & (ix < f["in_w"])
        row_ok = w_sample < w_gend
        # tap state after this run
        nt_ky, nt_kx, nt_ci, nt_off = Signal(8), Signal(8), Signal(16), Signal(signed(ADDR))
        with m.If(t_ci + run == f["cin"]):
            with m.If(t_kx + 1 == f["kw"]):
                m.d.comb += [nt_ky.eq(t_ky + 1), nt_kx.eq(0), nt_ci.eq(0),
                             nt_off.eq(t_off + 2 * run + f["kx_delta"] + f["ky_delta"])]
            with m.Else():
                m.d.comb += [nt_ky.eq(t_ky), nt_kx.eq(t_kx + 1), nt_ci.eq(0),
                             nt_off.eq(t_off + 2 * run + f["kx_delta"])]
        with m.Else():
            m.d.comb += [nt_ky.eq(t_ky), nt_kx.eq(t_kx), nt_ci.eq(t_ci + run), nt_off.eq(t_off + 2 * run)]

        # the read command port is shared with the descriptor fetch
        m.d.comb += self.rd_cmd_tag.eq(tag)
        with m.If(rd_cmd_desc):
            m.d.comb += [self.rd_cmd_valid.eq(1), self.rd_cmd_addr.eq(desc_addr + desc_sent * 2 * DESC_CMD_WORDS),
                         self.rd_cmd_nwords.eq(DESC_CMD_WORDS), tag.kind.eq(KIND_DESC),
                         tag.idx.eq(desc_sent * DESC_CMD_WORDS)]
        accepted = self.rd_cmd_valid & self.rd_cmd_ready

        ahead_ok = step_fifo.level < 2

        first_c, last_c = Signal(), Signal()
        step_word = Cat(t, first_c, last_c, sb)
        m.d.comb += step_fifo.w_data.eq(step_word)
        blk = Signal(blk_layout)
        m.d.comb += blk_fifo.w_data.eq(blk.as_value())

        with m.FSM(name="fetch"):
            with m.State("IDLE"):
                m.d.comb += fetch_done.eq(1)
                with m.If(fetch_go):
                    m.d.sync += [col0.eq(0)]
                    m.next = "TILE"
            with m.State("TILE"):
                rest = f["cout"] - col0
                m.d.sync += [w.eq(Mux(rest < nPE, rest, nPE)), grp_next.eq(0), nsamp.eq(0),
                             nsrc.eq(f["src_base"])]
                m.next = "PASS"
            with m.State("PASS"):
                is_last = BP - grp_next <= g
                groups = Mux(is_last, gl, g)
                m.d.sync += [gp.eq(groups), last_pass.eq(is_last), q.eq(0), bi.eq(0)]
                # the core's bank placement depends on the pass's group count: change it only when idle
                with m.If(groups != cur_g):
                    with m.If((steps_out == 0) & (step_fifo.level == 0)):
                        m.d.sync += cur_g.eq(groups)
                        m.next = "CURSORS"
                with m.Else():
                    m.next = "CURSORS"
            with m.State("CURSORS"):      # each group of the pass starts at its first sample, pixel 0
                end = nsamp + BR
                m.d.sync += [c_sample[q].eq(nsamp), c_gend[q].eq(Mux(end < b, end, b)), c_pix[q].eq(0),
                             c_oy[q].eq(0), c_ox[q].eq(0), c_iy[q].eq(-f["ph"]), c_ix[q].eq(-f["pw"]),
                             c_off[q].eq(f["origin"]), c_sbase[q].eq(nsrc),
                             nsamp.eq(end), nsrc.eq(nsrc + br_src), q.eq(q + 1)]
                with m.If(q + 1 == gp):
                    m.next = "BLOCK"
            with m.State("BLOCK"):
                m.d.comb += [blk.t.eq(Mux(bi < big_sel, s_sel + 1, s_sel)), blk.gp.eq(gp), blk.col0.eq(col0),
                             blk.w.eq(w), blk.sb.eq(sb), blk.pass_start.eq(bi == 0),
                             blk.tile_start.eq((bi == 0) & (grp_next == 0))]
                with m.If(blk_fifo.w_rdy):
                    m.d.comb += blk_fifo.w_en.eq(1)
                    m.d.sync += [t.eq(Mux(bi < big_sel, s_sel + 1, s_sel)), p0.eq(0),
                                 s_ky.eq(0), s_kx.eq(0), s_ci.eq(0), s_off.eq(0),
                                 wrow.eq(f["weight_base"] + 2 * col0)]
                    m.next = "STEP"
            with m.State("STEP"):
                left = f["P"] - p0
                m.d.comb += [first_c.eq(p0 == 0), last_c.eq(left <= TPk)]
                with m.If(ahead_ok & step_fifo.w_rdy):
                    m.d.comb += step_fifo.w_en.eq(1)
                    m.d.sync += [nl.eq(Mux(left < TPk, left, TPk)), lane.eq(0),
                                 first.eq(p0 == 0), last.eq(left <= TPk)]
                    m.next = "WEIGHTS"
            def load_group(qv, taps_too: bool) -> None:
                """Start walking group qv's rows from its block-start cursor (same cycle, no bubble)."""
                m.d.sync += [w_sample.eq(c_sample[qv]), w_gend.eq(c_gend[qv]), w_pix.eq(c_pix[qv]),
                             w_oy.eq(c_oy[qv]), w_ox.eq(c_ox[qv]), w_iy.eq(c_iy[qv]), w_ix.eq(c_ix[qv]),
                             w_off.eq(c_off[qv]), w_sbase.eq(c_sbase[qv]), j.eq(0), q.eq(qv),
                             rem.eq(nl), lane.eq(0)]
                if taps_too:
                    m.d.sync += [t_ky.eq(s_ky), t_kx.eq(s_kx), t_ci.eq(s_ci), t_off.eq(s_off)]

            with m.State("WEIGHTS"):      # per weight row, one read per group q (wq, wq_off = q*cw)
                m.d.comb += [self.rd_cmd_valid.eq(1), self.rd_cmd_addr.eq(wrow - 2 * wq_off),
                             self.rd_cmd_nwords.eq(wq_off + w), tag.kind.eq(KIND_WEIGHT), tag.lane.eq(lane),
                             tag.q.eq(wq)]
                with m.If(accepted):
                    m.d.sync += [wq.eq(wq + 1), wq_off.eq(wq_off + cw)]
                    with m.If(wq + 1 == gp):
                        m.d.sync += [wq.eq(0), wq_off.eq(0), wrow.eq(wrow + 2 * f["cout"]), lane.eq(lane + 1)]
                        with m.If(lane + 1 == nl):
                            with m.If(first):
                                m.next = "BIAS"
                            with m.Else():
                                load_group(0, True)
                                m.next = "INPUT"
            with m.State("BIAS"):
                # int32 bias of the tile's w columns for group q (bq, bq_off = q*cw), in chunks of
                # nmax/2 logical columns from bcol (a multiple of nmax/2, starting at the chunk
                # holding column q*cw), each read q*cw int32 before the column it lands in
                left_words = 2 * (bq_off + w - bcol)
                m.d.comb += [self.rd_cmd_valid.eq(1),
                             self.rd_cmd_addr.eq(f["bias_base"] + 4 * col0 + 4 * bcol - 4 * bq_off),
                             self.rd_cmd_nwords.eq(Mux(left_words < nmax, left_words, nmax)),
                             tag.kind.eq(KIND_BIAS), tag.idx.eq(bcol), tag.q.eq(bq)]
                with m.If(accepted):
                    m.d.sync += bcol.eq(bcol + nmax // 2)
                    with m.If(left_words <= nmax):          # group q's last chunk
                        nxt_off = bq_off + cw
                        # the next group starts in this chunk unless its first column is the next one's
                        m.d.sync += [bq.eq(bq + 1), bq_off.eq(nxt_off),
                                     bcol.eq(Mux(nxt_off < bcol + nmax // 2, bcol, bcol + nmax // 2))]
                        with m.If(bq + 1 == gp):
                            m.d.sync += [bq.eq(0), bq_off.eq(0), bcol.eq(0)]
                            load_group(0, True)
                            m.next = "INPUT"
            with m.State("INPUT"):
                row_last = run == rem
                m.d.comb += [self.rd_cmd_valid.eq(1),
                             self.rd_cmd_addr.eq(w_sbase + w_off + t_off),
                             self.rd_cmd_nwords.eq(run), self.rd_cmd_zero.eq(~(inside & row_ok)),
                             tag.kind.eq(KIND_INPUT), tag.q.eq(q), tag.idx.eq(j), tag.lane.eq(lane),
                             tag.row_last.eq(row_last),
                             tag.step_last.eq(row_last & (j + 1 == t) & (q + 1 == gp))]
                with m.If(accepted):
                    with m.If(row_last):
                        # every row walks the same taps: the state after a row is the next step's start
                        m.d.sync += [t_ky.eq(s_ky), t_kx.eq(s_kx), t_ci.eq(s_ci), t_off.eq(s_off),
                                     rem.eq(nl), lane.eq(0), j.eq(j + 1)]
                        for k in nc_sig:
                            m.d.sync += {"sample": w_sample, "pix": w_pix, "oy": w_oy, "ox": w_ox, "iy": w_iy,
                                         "ix": w_ix, "off": w_off, "sbase": w_sbase}[k].eq(nc_sig[k])
                        with m.If(j + 1 == t):
                            with m.If(last):  # the block's cursor moves on for the next block
                                m.d.sync += [c_sample[q].eq(nc_sig["sample"]), c_pix[q].eq(nc_sig["pix"]),
                                             c_oy[q].eq(nc_sig["oy"]), c_ox[q].eq(nc_sig["ox"]),
                                             c_iy[q].eq(nc_sig["iy"]), c_ix[q].eq(nc_sig["ix"]),
                                             c_off[q].eq(nc_sig["off"]), c_sbase[q].eq(nc_sig["sbase"])]
                            with m.If(q + 1 != gp):
                                load_group(q + 1, False)     # same taps, the next group's rows
                            with m.Else():
                                # the step's reads are all issued: on to the next step, block or pass
                                m.d.sync += [p0.eq(p0 + TPk),
                                             s_ky.eq(nt_ky), s_kx.eq(nt_kx), s_ci.eq(nt_ci), s_off.eq(nt_off)]
                                with m.If(last):
                                    m.d.sync += [bi.eq(bi + 1), sb.eq(~sb)]
                                    with m.If(bi + 1 == n_sel):
                                        m.d.sync += [grp_next.eq(grp_next + gp), q.eq(0)]
                                        with m.If(grp_next + gp == BP):
                                            m.d.sync += col0.eq(col0 + nPE)
                                            with m.If(col0 + nPE >= f["cout"]):
                                                m.next = "IDLE"
                                            with m.Else():
                                                m.next = "TILE"
                                        with m.Else():
                                            m.next = "PASS"
                                    with m.Else():
                                        m.next = "BLOCK"
                                with m.Else():
                                    # the next step of the block: start it at once when the fetcher
                                    # may run ahead, so its first weight read follows this read directly
                                    nleft = f["P"] - (p0 + TPk)
                                    with m.If(ahead_ok & step_fifo.w_rdy):
                                        m.d.comb += [step_fifo.w_en.eq(1), first_c.eq(0), last_c.eq(nleft <= TPk)]
                                        m.d.sync += [nl.eq(Mux(nleft < TPk, nleft, TPk)), lane.eq(0),
                                                     first.eq(0), last.eq(nleft <= TPk)]
                                        m.next = "WEIGHTS"
                                    with m.Else():
                                        m.next = "STEP"
                    with m.Else():
                        m.d.sync += [t_ky.eq(nt_ky), t_kx.eq(nt_kx), t_ci.eq(nt_ci), t_off.eq(nt_off),
                                     rem.eq(rem - run), lane.eq(lane + run)]

    # ------------------------------------------------------------------
    def _loader(self, m, desc_hw, desc_got, step_fifo, stage_free, steps_out):
        """Routes read responses into the core; hands each complete step to the core.

        Writes into the core go through one register stage, so a response can be taken in
        the very cycle the previous step is handed over: it lands in the half the core
        releases in the next cycle (the cycle its write happens), with no bubble per step.
        """
        TR, TP, TC, nmax = self.TR, self.TP, self.TC, self.nmax
        rtag = Signal(self.tag)
        m.d.comb += rtag.eq(self.rd_rsp_tag)
        lhalf = Signal()
        pending = Signal()
        issued = Signal()
        row = Signal(16 * 2 * TP)
        placed = Signal(16 * 2 * TP)
        m.d.comb += placed.eq(row | (self.rd_rsp_data << (rtag.lane * 16))[:16 * 2 * TP])

        m.d.comb += self.rd_rsp_ready.eq(~pending | issued)
        take = self.rd_rsp_valid & (~pending | issued)
        # the registered write port
        dw = 16 * max(nmax, 2 * TP)
        ld_in, ld_w, ld_b = Signal(), Signal(), Signal()
        ld_half = Signal()
        ld_lane = Signal.like(rtag.lane)
        ld_q = Signal.like(rtag.q)
        ld_idx = Signal.like(rtag.idx)
        ld_data = Signal(dw)
        m.d.sync += [ld_in.eq(0), ld_w.eq(0), ld_b.eq(0)]
        m.d.comb += [self.w_wr_valid.eq(ld_w), self.w_wr_wb.eq(ld_half), self.w_wr_lane.eq(ld_lane),
                     self.w_wr_q.eq(ld_q), self.b_wr_q.eq(ld_q),
                     self.w_wr_data.eq(ld_data[:16 * 2 * TC]),
                     self.b_wr_valid.eq(ld_b), self.b_wr_wb.eq(ld_half), self.b_wr_base.eq(ld_idx),
                     self.b_wr_data.eq(ld_data[:16 * nmax]),
                     self.in_wr_valid.eq(ld_in), self.in_wr_ib.eq(ld_half), self.in_wr_q.eq(ld_q),
                     self.in_wr_j.eq(ld_idx), self.in_wr_data.eq(ld_data[:16 * 2 * TP])]
        with m.If(take):
            # a response taken while the previous step is handed over belongs to the other half
            m.d.sync += [ld_half.eq(lhalf ^ issued), ld_lane.eq(rtag.lane), ld_q.eq(rtag.q), ld_idx.eq(rtag.idx),
                         ld_data.eq(Mux(rtag.kind == KIND_INPUT, placed, self.rd_rsp_data))]
            with m.Switch(rtag.kind):
                with m.Case(KIND_DESC):
                    with m.Switch(rtag.idx):
                        for base in range(0, 2 * DESC_WORDS, DESC_CMD_WORDS):
                            with m.Case(base):
                                for i in range(DESC_CMD_WORDS):
                                    m.d.sync += desc_hw[base + i].eq(self.rd_rsp_data[16 * i:16 * (i + 1)])
                    m.d.sync += desc_got.eq(desc_got + 1)
                with m.Case(KIND_WEIGHT):
                    m.d.sync += ld_w.eq(1)
                with m.Case(KIND_BIAS):
                    m.d.sync += ld_b.eq(1)
                with m.Case(KIND_INPUT):
                    with m.If(rtag.row_last):
                        m.d.sync += [ld_in.eq(1), row.eq(0)]
                    with m.Else():
                        m.d.sync += row.eq(placed)

        # hand the step to the core (a block's last step also needs its staging half drained)
        st_t = step_fifo.r_data[:bits_for(TR)]
        st_first = step_fifo.r_data[bits_for(TR)]
        st_last = step_fifo.r_data[bits_for(TR) + 1]
        st_sb = step_fifo.r_data[bits_for(TR) + 2]
        can = pending & step_fifo.r_rdy & (~st_last | stage_free.bit_select(st_sb, 1))
        m.d.comb += [self.step_valid.eq(can), self.step_ib.eq(lhalf), self.step_wb.eq(lhalf),
                     self.step_t.eq(st_t), self.step_first.eq(st_first), self.step_last.eq(st_last),
                     self.step_sb.eq(st_sb)]
        m.d.comb += issued.eq(can & self.step_ready)
        with m.If(issued):
            m.d.comb += step_fifo.r_en.eq(1)
            m.d.sync += [pending.eq(0), lhalf.eq(~lhalf)]
        with m.If(take & rtag.step_last):
            m.d.sync += pending.eq(1)
        self._stage_claim = Signal(2)
        m.d.comb += self._stage_claim.eq(Mux(issued & st_last, Mux(st_sb, 0b10, 0b01), 0))
        m.d.sync += steps_out.eq(steps_out + issued - self.released)

    # ------------------------------------------------------------------
    def _writer(self, m, f, b, BR, cw, br_dst, blk_fifo, blk_layout, blocks_ready, stage_free, busy):
        """Drains finished blocks from staging to the output tensors (one command per row and group)."""
        TR, TP, TC, NB, bmax, nmax = self.TR, self.TP, self.TC, self.NB, self.bmax, self.nmax
        b_bits = bits_for(bmax)
        info = Signal(blk_layout)
        rowreg = Signal(16 * 2 * TC)
        j = Signal(range(TR + 1))
        q = Signal(range(NB + 1))
        qoff = Signal(range(2 * TC * (NB + 1)))
        nsamp = Signal(b_bits + 1)
        ndst = Signal(ADDR)

        def arr(name, shape):
            return Array(Signal(shape, name=f"{name}{i}") for i in range(NB))
        o_sample, o_gend = arr("o_sample", b_bits + 1), arr("o_gend", b_bits + 1)
        o_pix, o_addr, o_sbase = arr("o_pix", ROW_BITS), arr("o_addr", ADDR), arr("o_sbase", ADDR)

        m.d.sync += blocks_ready.eq(blocks_ready + self.block_done - (blk_fifo.r_en & 1))
        freed = Signal(2)
        m.d.sync += stage_free.eq((stage_free & ~self._stage_claim) | freed)
        m.d.comb += [self.st_sb.eq(info.sb)]

        shifted = (rowreg >> (qoff * 16))
        wdata = Signal(16 * nmax)
        m.d.comb += wdata.eq(shifted[:16 * min(nmax, 2 * TC)])
        cur_ok = o_sample[q] < o_gend[q]

        with m.FSM(name="write"):
            with m.State("IDLE"):
                with m.If((blocks_ready != 0) & blk_fifo.r_rdy):
                    m.d.comb += blk_fifo.r_en.eq(1)
                    m.d.sync += [info.eq(blk_fifo.r_data), q.eq(0), busy.eq(1)]
                    with m.If(blk_fifo.r_data[blk_layout.size - 1]):   # tile_start
                        m.d.sync += [nsamp.eq(0), ndst.eq(f["dst_base"])]
                    with m.If(blk_fifo.r_data[blk_layout.size - 2]):   # pass_start
                        m.next = "CURSORS"
                    with m.Else():
                        m.next = "ROW0"
            with m.State("CURSORS"):
                end = nsamp + BR
                m.d.sync += [o_sample[q].eq(nsamp), o_gend[q].eq(Mux(end < b, end, b)), o_pix[q].eq(0),
                             o_addr[q].eq(ndst), o_sbase[q].eq(ndst), nsamp.eq(end),
                             ndst.eq(ndst + br_dst), q.eq(q + 1)]
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
                row_end = (~cur_ok | self.wr_ready) & (q + 1 == info.gp)
                m.d.comb += self.st_j.eq(Mux(row_end, j + 2, j + 1))
                m.d.comb += [self.wr_valid.eq(cur_ok), self.wr_addr.eq(o_addr[q] + 2 * info.col0),
                             self.wr_nwords.eq(info.w), self.wr_data.eq(wdata)]
                with m.If(~cur_ok | self.wr_ready):
                    with m.If(cur_ok):
                        with m.If(o_pix[q] + 1 == f["npix"]):
                            m.d.sync += [o_pix[q].eq(0), o_sample[q].eq(o_sample[q] + 1),
                                         o_sbase[q].eq(o_sbase[q] + f["dst_sample_stride"]),
                                         o_addr[q].eq(o_sbase[q] + f["dst_sample_stride"])]
                        with m.Else():
                            m.d.sync += [o_pix[q].eq(o_pix[q] + 1), o_addr[q].eq(o_addr[q] + f["dst_pix_step"])]
                    m.d.sync += [q.eq(q + 1), qoff.eq(qoff + cw)]
                    with m.If(q + 1 == info.gp):
                        m.d.sync += [q.eq(0), qoff.eq(0), j.eq(j + 1), rowreg.eq(self.st_data)]
                        with m.If(j + 1 == info.t):
                            m.d.comb += freed.eq(Mux(info.sb, 0b10, 0b01))
                            m.d.sync += busy.eq(0)
                            m.next = "IDLE"
