"""The control unit's planner: runs a subnet layer by layer (hw/sequencer.py).

Per layer it reads the descriptor (its own read commands on `desc_cmd`, the
words back from the loader on `desc_rsp`), looks up <BR, k> in the FBCB for
the current Bactive, plans the passes and balanced row blocks exactly as
docs/interpretations.md defines them (the plan dse/perf_model.py prices,
`plan_cycles`), presents the plan on `plan` and pulses `go`; the fetcher and
writer then run the layer, and the planner waits for `drained` (every machine
idle, every read answered, every write done) before the next layer.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from fluidnpu.hw.descriptor import BUFFER_LAYOUT, DESC_STRIDE_BYTES, DESC_WORDS, LAYOUT
from fluidnpu.hw.divider import SeqDivider
from fluidnpu.hw.regmap import (
    K_CODE_BITS,
    ROW_BITS,
    ErrorCode,
    KCode,
    fbcb_br_bits,
    fbcb_buffered_bit,
    k_dims,
    supported_k_codes,
)
from fluidnpu.hw.seq_streams import (
    ADDR,
    DESC_CMD_WORDS,
    KIND_DESC,
    buffer_desc_layout,
    desc_chunk_layout,
    plan_layout,
    read_cmd_layout,
    register_ports,
    store_control_params,
)


class SeqPlanner(wiring.Component):
    """Layer loop, descriptor fetch, FBCB lookup and pass/block planning.

    Ports: the register block's (`start` .. `dma_stall`), the core's layer configuration
    (`cfg_*`), `desc_cmd` (stream of descriptor read commands), `desc_rsp` (the descriptor
    words, always taken), `plan` (the current layer's plan, `plan_layout`), `go` (one cycle:
    run the layer) and `drained` (the other machines and the DMA are idle). With `buffer` (an NPU
    built with the block input buffer) also `buf_desc` (the descriptor's buffer fields), `buf_on`
    (the FBCB entry's BUFFERED bit: the layer runs buffered at this batch size) and `buf_overflow`
    (a block did not fit the buffer: latched like a DMA error).
    """

    def __init__(self, *, TR: int, TP: int, TC: int, NB: int, bmax: int, layers: int, nmax: int,
                 stackable: bool = True, buffer: bool = False) -> None:
        store_control_params(self, TR=TR, TP=TP, TC=TC, NB=NB, bmax=bmax, layers=layers, nmax=nmax,
                             stackable=stackable)
        self.buffer = buffer
        super().__init__({
            **({"buf_desc": Out(buffer_desc_layout()), "buf_on": Out(1), "buf_overflow": In(1)} if buffer else {}),
            **register_ports(bmax, layers, buffer), "mac_active": In(1),
            "rd_error": In(1), "wr_error": In(1),
            "cfg_k": Out(2), "cfg_cw": Out(range(2 * TC + 1)), "cfg_shift": Out(5), "cfg_relu": Out(1),
            "desc_cmd": Out(stream.Signature(read_cmd_layout(self.tag, nmax))),
            "desc_rsp": In(stream.Signature(desc_chunk_layout(), always_ready=True)),
            "plan": Out(plan_layout(TR, TP, TC, NB, bmax)),
            "go": Out(1), "drained": In(1),
        })

    def elaborate(self, platform) -> Module:  # noqa: C901 - one FSM, state by state
        m = Module()
        TR, TP, TC, NB, bmax = self.TR, self.TP, self.TC, self.NB, self.bmax
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
            m.d.comb += self.plan.desc[name].eq(v)
        if self.buffer:
            for name, word, lsb, width, _signed in BUFFER_LAYOUT:
                m.d.comb += self.buf_desc[name].eq(words[word][lsb:lsb + width])

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

        out = self.plan
        m.d.comb += [out.b.eq(b), out.BR.eq(BR), out.BP.eq(BP), out.nPE.eq(nPE), out.TPk.eq(TPk), out.g.eq(g),
                     out.gl.eq(gl), out.cw.eq(cw), out.br_src.eq(br_src), out.br_dst.eq(br_dst)]
        for kind, view in (("f", out.full), ("l", out.last)):
            m.d.comb += [view.n.eq(plan[kind]["n"]), view.s.eq(plan[kind]["s"]), view.big.eq(plan[kind]["big"])]
        m.d.comb += [self.cfg_k.eq(kcode), self.cfg_cw.eq(cw), self.cfg_shift.eq(f["shift"]),
                     self.cfg_relu.eq(f["relu"])]

        # descriptor reads: three commands of DESC_CMD_WORDS words
        m.d.comb += [self.desc_cmd.payload.addr.eq(desc_addr + desc_sent * 2 * DESC_CMD_WORDS),
                     self.desc_cmd.payload.nwords.eq(DESC_CMD_WORDS), self.desc_cmd.payload.tag.kind.eq(KIND_DESC),
                     self.desc_cmd.payload.tag.idx.eq(desc_sent * DESC_CMD_WORDS)]

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
                m.d.comb += self.desc_cmd.valid.eq(desc_sent < 3)
                with m.If(self.desc_cmd.valid & self.desc_cmd.ready):
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
                code = self.fbcb_data[:K_CODE_BITS]
                brm1 = self.fbcb_data[K_CODE_BITS:fbcb_buffered_bit(bmax)] if fbcb_br_bits(bmax) else Const(0, 1)
                m.d.sync += [kcode.eq(code), BR.eq(brm1 + 1), acc.eq(0), cnt.eq(0)]
                if self.buffer:
                    m.d.sync += self.buf_on.eq(self.fbcb_data[fbcb_buffered_bit(bmax)])
                no_mode = ~Cat(code == c for c in supported_k_codes(TR, TP, TC, self.stackable)).any()
                with m.If(no_mode | (brm1 + 1 > b)):
                    m.d.sync += err_latched.eq(ErrorCode.BAD_DESCRIPTOR)
                    m.next = "ERROR"
                with m.Else():
                    with m.Switch(code):
                        for c in KCode:
                            TRc, TPc, TCc = k_dims(TR, TP, TC, c)
                            with m.Case(int(c)):
                                m.d.sync += [nPE.eq(TCc), TPk.eq(TPc), TRk.eq(TRc)]
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
                m.d.comb += self.go.eq(1)
                m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += self.dma_stall.eq(~self.mac_active)
                with m.If(self.drained):
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
        if self.buffer:
            with m.If(self.buf_overflow & ~self.rd_error & ~self.wr_error & (err_latched == 0) & self.busy):
                m.d.sync += err_latched.eq(ErrorCode.BUFFER_OVERFLOW)

        # the descriptor's words, as the loader hands them over
        with m.If(self.desc_rsp.valid):
            with m.Switch(self.desc_rsp.payload.idx):
                for base in range(0, 2 * DESC_WORDS, DESC_CMD_WORDS):
                    with m.Case(base):
                        for i in range(DESC_CMD_WORDS):
                            m.d.sync += desc_hw[base + i].eq(self.desc_rsp.payload.data[16 * i:16 * (i + 1)])
            m.d.sync += desc_got.eq(desc_got + 1)
        return m
