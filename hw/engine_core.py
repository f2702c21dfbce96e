"""EngineCore: input banks, weight/bias registers, MAC trees with Stackable-PE
pairs, accumulators, post-processing and the output staging buffer.

The interface and memory placement are specified in docs/hw-architecture.md
("Modes", "EngineCore"); this module follows it. Pipeline of one row, issued
in cycle 0 (stage numbers = cycles after issue):

    0  input-bank read (address), per-PE bank selects
    1  bank data -> rotation/lane muxes -> operand registers (DSP A/B/C regs);
       weights and bias are picked from bank `wb` here, which is why `released`
       can free both buffers as soon as the last row is in stage 1
    2  multiply (+ bias on lane 0, and on lane h in k=1/2: the DSP post-adder)
    2+r  lane r of a DSP cascade chain (hw/mac_tree.py, `regmap.chains`): its
       product plus lane r-1's partial sum in the DSP's post-adder, its operands
       skewed r cycles (the bank words, the PEs' bank selects and the step's
       weight-buffer select are delayed; the banks are still read in stage 0).
       Lane i's weights are read chain_position(i) <= i cycles late, and the
       weight rows of a step are written in lane order, one a cycle at most
       (the loader's order, `w_wr`), so a row written for the step after next
       still lands after the current step's last read of it: no write delay
    ..  adder-tree levels over the chains' outputs, one register each;
       D = `regmap.sum_depth(TP)` cycles from stage 2 to the root
    A  accumulate: read-modify-write, the read issued in stage A-1 through a
       port transparent to the write port, so one row per cycle into the same
       accumulator row (t = 1) never sees a stale value;
       A = 2+D (k=1/2: the half sums), 3+D (k=1), 4+D (k=2: one more pair add)
    A+1 round and shift (registered)
    A+2 saturate/ReLU -> staging write   (= `latency[k]`)

The bias is added inside the tree (on the first step only) rather than at the
accumulator: it is read with the weights in stage 1, so one release covers
weights and bias and the sequencer may overwrite a bias bank as soon as the
step's last row has passed the multipliers, however short the step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from fluidnpu.hw.mac_tree import adder_tree, delay, delay_taps, dsp_chain
from fluidnpu.hw.regmap import (
    BUFFERS,
    RAM_STYLES,
    KCode,
    bank_select_bits,
    chain_position,
    chains,
    mode_depth,
    nmax as npu_nmax,
    sum_depth,
    supported_k_codes,
)

K1, K2, KHALF = KCode.K1, KCode.K2, KCode.KHALF   # short names for the FBCB k codes (hw/regmap.py)


def _rng(n: int) -> range:
    """range(n) for a port width, never narrower than one bit."""
    return range(max(n, 2))


def _words(v: Value, n: int, width: int = 16) -> list[Value]:
    return [v[width * i:width * (i + 1)] for i in range(n)]


def _mul_small(m: Module, a: Value, b: Value, name: str) -> Signal:
    """a * b for a narrow b as a shift-add in LUTs (keeps the DSPs for the MACs)."""
    out = Signal(len(a) + len(b), name=name)
    m.d.comb += out.eq(sum(Mux(b[i], a << i, 0) for i in range(len(b))))
    return out


def requantise(m: Module, acc: Value, shift: Value, rnd: Value, relu: Value, name: str) -> Signal:
    """int16 y = clamp((acc + rnd) >> shift), then max(y, 0) if relu (exact, 34-bit), one cycle
    after `acc`: the shifted value is registered before the saturation compares, so neither half
    (a 34-bit add and a 5-level shift; two compares, ReLU and the staging write) exceeds the timing
    proxy's budget. `shift` and `relu` are layer constants."""
    wide = Signal(signed(34), name=f"{name}_w")
    sh = Signal(signed(34), name=f"{name}_sh")
    y = Signal(signed(16), name=name)
    m.d.comb += wide.eq(acc.as_signed() + rnd)
    m.d.sync += sh.eq(wide >> shift)
    sat = Mux(sh > 32767, 32767, Mux(sh < -32768, -32768, sh))
    m.d.comb += y.eq(Mux(relu & (sat < 0), 0, sat))
    return y


def write_signature(fields: dict[str, object]) -> wiring.Signature:
    """A single-cycle write strobe: `valid` plus fields, always accepted (driver's view)."""
    return wiring.Signature({"valid": Out(1), **{k: Out(v) for k, v in fields.items()}})


def buffer_write_signatures(TR: int, TP: int, TC: int, NB: int, nmax: int) -> dict[str, wiring.Signature]:
    """The core's buffer-write ports (driver's view): input rows, weight rows, bias chunks."""
    return {"in_wr": write_signature({"ib": 1, "q": _rng(NB), "j": _rng(TR), "data": 16 * 2 * TP}),
            "w_wr": write_signature({"wb": 1, "q": _rng(NB), "lane": _rng(2 * TP), "data": 16 * 2 * TC}),
            "b_wr": write_signature({"wb": 1, "q": _rng(NB), "base": range(2 * TC + nmax), "data": 16 * nmax})}


def step_signature(TR: int) -> wiring.Signature:
    """The core's step port (driver's view): a weight step of `t` rows from buffer halves
    `ib`/`wb`, first/last of its block, `sb` the staging half the block fills."""
    return wiring.Signature({"valid": Out(1), "ready": In(1), "ib": Out(1), "wb": Out(1),
                             "t": Out(range(TR + 1)), "first": Out(1), "last": Out(1), "sb": Out(1)})


class EngineCore(wiring.Component):
    """The NPU's compute core ⟨TR, TP, TC⟩ with NB input banks (docs/hw-architecture.md).

    `placement` ({buffer: "bram" | "uram"}, buffers as `regmap.BUFFERS`) gives the buffers' memories
    the `ram_style` the DSE priced them in; a buffer it does not name is left to the tool.

    Attributes after construction:
      modes:    the k codes this size supports (`regmap.supported_k_codes`)
      latency:  {k code: cycles from a row's issue to its staging write}; a
                block's `block_done` comes latency + 1 cycles after its last
                row's issue, i.e. a block of steps issued back to back takes
                sum(t) + latency cycles from its first row to `block_done`.
      sum_depth: cycles from the first product to a PE's root (`regmap.sum_depth`)
    """

    def __init__(self, *, TR: int, TP: int, TC: int, NB: int, nmax: int | None = None,
                 stackable: bool = True, placement: Mapping[str, str] | None = None) -> None:
        if min(TR, TP, TC) < 1:
            raise ValueError("TR, TP, TC must be >= 1")
        if NB < 2 or NB & (NB - 1):
            raise ValueError(f"NB = {NB}: the bank count must be a power of two >= 2")
        need = npu_nmax(TP, TC)
        nmax = need if nmax is None else nmax
        if nmax < need or nmax % 2:
            raise ValueError(f"nmax = {nmax} must be even and >= NMAX = max(2TP, 2TC, 16) = {need}")
        self.TR, self.TP, self.TC, self.NB, self.nmax = TR, TP, TC, NB, nmax
        self.placement = dict(placement or {})
        if not set(self.placement) <= set(BUFFERS) or not set(self.placement.values()) <= set(RAM_STYLES):
            raise ValueError(f"placement {self.placement}: memories {BUFFERS}, each one of {tuple(RAM_STYLES)}")
        self.h = TP // 2
        self.sum_depth = sum_depth(TP)
        # a plain-PE engine (stackable=False, the baselines') has k = 1 only: no pair adders, no
        # k=2/k=1/2 lane or bank multiplexers, no upper-half bias registers
        self.modes = supported_k_codes(TR, TP, TC, stackable)
        self._acc_stage = {k: 3 + mode_depth(TP, k) for k in (K1, K2, KHALF)}
        self.latency = {k: self._acc_stage[k] + 2 for k in self.modes}
        super().__init__({
            "k": In(2), "g": In(range(NB + 1)), "cw": In(range(2 * TC + 1)),
            "shift": In(5), "relu": In(1),
            **{name: In(sig) for name, sig in buffer_write_signatures(TR, TP, TC, NB, nmax).items()},
            "step": In(step_signature(TR)),
            "released": Out(1), "block_done": Out(1), "block_sb": Out(1), "mac_active": Out(1),
            "idle": Out(1),
            "st_sb": In(1), "st_j": In(_rng(TR)), "st_data": Out(16 * 2 * TC),
        })

    # ------------------------------------------------------------------
    def _ram_attrs(self, buffer: str) -> dict[str, str] | None:
        """`ram_style` of a buffer's memories: the placement the DSE priced, so the vendor tool builds it."""
        kind = self.placement.get(buffer)
        return None if kind is None else {"ram_style": RAM_STYLES[kind]}

    def elaborate(self, platform) -> Module:
        m = Module()
        TR, TP, TC, NB = self.TR, self.TP, self.TC, self.NB
        h, L = self.h, self.sum_depth
        lg = bank_select_bits(NB)
        has_k2, has_kh = K2 in self.modes, KHALF in self.modes

        # ---------------- mode decode (unsupported codes behave as k = 1) ----------------
        is2, ish, is1 = Signal(), Signal(), Signal()
        m.d.comb += [is2.eq((self.k == K2) if has_k2 else 0), ish.eq((self.k == KHALF) if has_kh else 0),
                     is1.eq(~is2 & ~ish)]

        # ---------------- per-layer derived registers ----------------
        # multiples of cw (repeated addition: no multiplier) and the group of every
        # logical column. Only cw and k feed these (both change only between
        # layers); g is used at issue and by in_wr alone, so the sequencer may
        # change g between passes once every step is released.
        mult = [Signal(range(2 * TC * (NB + 1) + 1), name=f"cw_x{i}") for i in range(NB + 1)]
        acc_cw: Value = Const(0, 1)
        for i in range(NB + 1):
            m.d.sync += mult[i].eq(acc_cw)
            acc_cw = acc_cw + self.cw

        def group_of(c: int) -> Value:
            q: Value = Const(0, max(lg, 1))
            for i in range(1, NB):
                q = Mux(mult[i] <= c, i, q)
            return q

        qA = [Signal(lg, name=f"qA{p}") for p in range(TC)]     # group of physical PE p (lanes [0,h) in k=1/2)
        qB = [Signal(lg, name=f"qB{p}") for p in range(TC)]     # group of p's upper half in k=1/2
        for p in range(TC):
            m.d.sync += qA[p].eq(Mux(is2, group_of(p // 2), group_of(p)))
            if has_kh:
                m.d.sync += qB[p].eq(group_of(p + TC))
        rnd = Signal(32)
        m.d.sync += rnd.eq((Const(1, 1) << self.shift)[1:])

        # ---------------- step issue ----------------
        active, j, jg = Signal(), Signal(range(TR + 1)), Signal(range(TR * NB + NB + 1))
        cur = {f: Signal(w, name=f"cur_{f}") for f, w in
               (("ib", 1), ("wb", 1), ("t", range(TR + 1)), ("first", 1), ("last", 1), ("sb", 1))}
        at_end = j + 1 == cur["t"]
        m.d.comb += self.step.ready.eq(~active | at_end)
        accept = self.step.valid & self.step.ready
        with m.If(accept):
            m.d.sync += [active.eq(1), j.eq(0), jg.eq(0)]
            m.d.sync += [cur[f].eq(getattr(self.step, f)) for f in cur]
        with m.Elif(active & at_end):
            m.d.sync += active.eq(0)
        with m.Elif(active):
            m.d.sync += [j.eq(j + 1), jg.eq(jg + self.g)]

        # control record per pipeline stage (stage 0 = issue)
        ctl_fields = {"valid": 1, "j": range(TR + 1), "first": 1, "last": 1, "sb": 1, "end": 1, "wb": 1}
        stage0 = {"valid": active, "j": j, "first": cur["first"], "last": cur["last"], "sb": cur["sb"],
                  "end": active & at_end, "wb": cur["wb"]}
        n_stages = max(self._acc_stage[k] for k in self.modes) + 1
        ctl = [stage0]
        for s in range(1, n_stages):
            rec = {f: Signal(w, name=f"s{s}_{f}") for f, w in ctl_fields.items()}
            m.d.sync += [rec[f].eq(ctl[-1][f]) for f in ctl_fields]
            ctl.append(rec)

        def tap(offset: int) -> dict[str, Value]:
            """The control record at stage acc_stage[k] + offset for the current mode."""
            out = {}
            for f, w in ctl_fields.items():
                v = Signal(w, name=f"tap{offset}_{f}".replace("-", "m"))
                sel: Value = ctl[self._acc_stage[K1] + offset][f]
                if has_k2:
                    sel = Mux(is2, ctl[self._acc_stage[K2] + offset][f], sel)
                if has_kh:
                    sel = Mux(ish, ctl[self._acc_stage[KHALF] + offset][f], sel)
                m.d.comb += v.eq(sel)
                out[f] = v
            return out

        # ---------------- input banks ----------------
        # NB banks, each split into a lanes [0,TP) memory (lo) and a lanes [TP,2TP)
        # memory (hi): a k=2 row uses both at one address, k=1 and k=1/2 rows
        # alternate between them, so the buffer holds TR x TP lanes per ib half.
        D = -(-TR // NB // 2)
        lo_mem: list[tuple[Any, Any]] = []             # (write port, read port) a bank
        hi_mem: list[tuple[Any, Any]] = []
        for b in range(NB):
            for lst, nm in ((lo_mem, "lo"), (hi_mem, "hi")):
                mem = Memory(shape=unsigned(16 * TP), depth=2 * D, init=[], attrs=self._ram_attrs("input"))
                m.submodules[f"in{b}_{nm}"] = mem
                lst.append((mem.write_port(), mem.read_port()))

        # writes: phys = j*g + q -> bank phys % NB, word address phys // NB
        phys = Signal(len(self.in_wr.j) + len(self.g) + 1)
        m.d.comb += phys.eq(_mul_small(m, self.in_wr.j, self.g, "in_jg") + self.in_wr.q)
        wa = phys[lg:]
        waddr = Mux(self.in_wr.ib, D, 0) + Mux(is2, wa, wa >> 1)
        data_lo = self.in_wr.data[:16 * TP]
        data_hi = self.in_wr.data[16 * TP:]
        for b in range(NB):
            hit = self.in_wr.valid & (phys[:lg] == b)
            (lw, _), (hw_, _) = lo_mem[b], hi_mem[b]
            m.d.comb += [lw.addr.eq(waddr), lw.data.eq(data_lo), lw.en.eq(hit & (is2 | ~wa[0])),
                         hw_.addr.eq(waddr), hw_.data.eq(Mux(is2, data_hi, data_lo)),
                         hw_.en.eq(hit & (is2 | wa[0]))]

        # reads (stage 0): group q's row j sits in bank (j*g + q) % NB, so bank b
        # serves phys = j*g + ((b - base) mod NB); base = (j*g) % NB
        base, jgN = jg[:lg], jg[lg:]
        sub = [Signal(name=f"in{b}_sub") for b in range(NB)]
        for b in range(NB):
            a_b = jgN + (base > b)
            raddr = Mux(cur["ib"], D, 0) + Mux(is2, a_b, a_b >> 1)
            m.d.comb += [lo_mem[b][1].addr.eq(raddr), hi_mem[b][1].addr.eq(raddr)]
            m.d.sync += sub[b].eq(a_b[0])
        selA = [Signal(lg, name=f"selA{p}") for p in range(TC)]
        selB = [Signal(lg, name=f"selB{p}") for p in range(TC)]
        for p in range(TC):
            m.d.sync += [selA[p].eq(base + qA[p]), selB[p].eq(base + qB[p])]

        # ---------------- weight and bias registers ----------------
        W = [[[Signal(signed(16), name=f"w{wb}_{p}_{i}") for i in range(TP)] for p in range(TC)] for wb in range(2)]
        BA = [[Signal(signed(32), name=f"ba{wb}_{p}") for p in range(TC)] for wb in range(2)]
        BB = [[Signal(signed(32), name=f"bb{wb}_{p}") for p in range(TC)] for wb in range(2)] if has_kh else []
        self._weight_writes(m, W, BA, BB, is1, is2, ish, qA, qB)

        # ---------------- stage 1 (+ r): operands ----------------
        # lane i of a chain is r = pos[i] cycles late: its bank words, its PE's bank select and the
        # step's weight-buffer select are delayed r cycles (shared by all PEs but the selects)
        c1 = ctl[1]
        pos = [chain_position(TP, i) for i in range(TP)]
        rmax = max(pos)
        lo_out = [Signal(16 * TP, name=f"in{b}_lane_lo") for b in range(NB)]
        for b in range(NB):
            m.d.comb += lo_out[b].eq(Mux(sub[b] & ~is2, hi_mem[b][1].data, lo_mem[b][1].data))
        lo_words = [_words(lo_out[b], TP) for b in range(NB)]
        lanes_lo = [Array(delay(m, lo_words[b][i], pos[i], f"in{b}_lo{i}") for b in range(NB)) for i in range(TP)]
        if has_k2:
            hi_words = [_words(hi_mem[b][1].data, TP) for b in range(NB)]
            lanes_hi = [Array(delay(m, hi_words[b][i], pos[i], f"in{b}_hi{i}") for b in range(NB))
                        for i in range(TP)]
        else:
            lanes_hi = []                               # k=2 only reads the upper lanes
        sA = [delay_taps(m, selA[p], rmax, f"selA{p}") for p in range(TC)]
        sB = [delay_taps(m, selB[p], rmax, f"selB{p}") for p in range(TC)] if has_kh else []
        X = [[Signal(signed(16), name=f"x{p}_{i}") for i in range(TP)] for p in range(TC)]
        WOP = [[Signal(signed(16), name=f"wop{p}_{i}") for i in range(TP)] for p in range(TC)]
        CA = [Signal(signed(32), name=f"ca{p}") for p in range(TC)]
        CB = [Signal(signed(32), name=f"cb{p}") for p in range(TC)]
        for p in range(TC):
            odd = p % 2 == 1
            for i in range(TP):
                r = pos[i]
                src: Value = lanes_lo[i][sA[p][r]]
                if has_k2 and odd:
                    src = Mux(is2, lanes_hi[i][sA[p][r]], src)
                if has_kh and h <= i < 2 * h:
                    # the upper k=1/2 PE reads lanes [0, h) of its group's row (skewed as lane i)
                    src = Mux(ish, lanes_lo[i - h][sB[p][r]], src)
                elif has_kh and i == 2 * h:       # odd TP: lane 2h idles in k=1/2
                    src = Mux(ish, 0, src)
                m.d.sync += [X[p][i].eq(src), WOP[p][i].eq(Mux(ctl[1 + r]["wb"], W[1][p][i], W[0][p][i]))]
            no_bias = c1["first"] == 0
            if odd:
                no_bias = no_bias | is2                 # the pair's bias enters on the even PE
            m.d.sync += CA[p].eq(Mux(no_bias, 0, Mux(c1["wb"], BA[1][p], BA[0][p])))
            if has_kh:
                m.d.sync += CB[p].eq(Mux(c1["first"] & ish, Mux(c1["wb"], BB[1][p], BB[0][p]), 0))

        # ---------------- stage 2 (+ r): DSP cascade chains; then trees ----------------
        runs = chains(TP)
        split = sum(1 for start, _ in runs if start < h)      # chains of the lower half
        roots, halves = [], []
        for p in range(TC):
            leaves, depths = [], []
            for start, end in runs:
                bias = [CA[p]] if start == 0 else [CB[p]] if has_kh and start == h else []
                regs = dsp_chain(m, [(X[p][i], WOP[p][i]) for i in range(start, end)], f"prod{p}", bias,
                                 index0=start)
                leaves.append(regs[-1])
                depths.append(end - start - 1)
            tree = adder_tree(m, leaves, f"tree{p}", depths=depths,
                              split=split if 0 < split < len(leaves) else None)
            assert tree.depth == L, f"built depth {tree.depth}, regmap.sum_depth says {L}"
            roots.append(tree.root)
            halves.append(tree.halves)
        pairs = []
        if has_k2:
            for c in range(TC // 2):
                pr = Signal(signed(32), name=f"pair{c}")
                m.d.sync += pr.eq(roots[2 * c] + roots[2 * c + 1])
                pairs.append(pr)

        # ---------------- accumulate (stage A) ----------------
        H = -(-TR // 2)
        acc_mem = []
        for i in range(2):
            mem = Memory(shape=unsigned(32 * TC), depth=H, init=[], attrs=self._ram_attrs("accumulator"))
            m.submodules[f"acc{i}"] = mem
            wr = mem.write_port()
            acc_mem.append((wr, mem.read_port(transparent_for=(wr,))))
        rd_tap, a_tap = tap(-1), tap(0)
        raddr = Mux(is1, rd_tap["j"] >> 1, rd_tap["j"])
        m.d.comb += [acc_mem[0][1].addr.eq(raddr), acc_mem[1][1].addr.eq(raddr)]
        waddr_acc = Mux(is1, a_tap["j"] >> 1, a_tap["j"])
        we0 = a_tap["valid"] & (~is1 | ~a_tap["j"][0])
        we1 = a_tap["valid"] & ((is1 & a_tap["j"][0]) | ish)
        new = [[Signal(signed(32), name=f"new{i}_{c}") for c in range(TC)] for i in range(2)]
        for c in range(TC):
            in0: Value = roots[c]
            in1: Value = roots[c]
            if has_k2:
                in0 = Mux(is2, pairs[c] if c < len(pairs) else Const(0, signed(32)), in0)
            if has_kh:
                half = halves[c]
                assert half is not None, "a k=1/2 engine's trees split at the half"
                in0 = Mux(ish, half[0], in0)
                in1 = Mux(ish, half[1], in1)
            for i, inp in ((0, in0), (1, in1)):
                old = acc_mem[i][1].data[32 * c:32 * (c + 1)].as_signed()
                m.d.comb += new[i][c].eq(Mux(a_tap["first"], 0, old) + inp)
        for i, we in ((0, we0), (1, we1)):
            m.d.comb += [acc_mem[i][0].addr.eq(waddr_acc), acc_mem[i][0].en.eq(we),
                         acc_mem[i][0].data.eq(Cat(new[i]))]

        # ---------------- post-process (stages A+1, A+2) -> staging ----------------
        post = [[Signal(signed(32), name=f"post{i}_{c}") for c in range(TC)] for i in range(2)]
        p_we = [Signal(name=f"post_we{i}") for i in range(2)]
        p_addr, p_sb, p_done, p_any = Signal(range(H + 1)), Signal(), Signal(), Signal()
        m.d.sync += [post[i][c].eq(new[i][c]) for i in range(2) for c in range(TC)]
        # the staging write's control, one stage later than `post` (requantise registers its shift)
        q_we = [Signal(name=f"post1_we{i}") for i in range(2)]
        q_addr, q_sb, q_done, q_any = Signal(range(H + 1)), Signal(), Signal(), Signal()
        m.d.sync += [q_we[0].eq(we0 & a_tap["last"]), q_we[1].eq(we1 & a_tap["last"]),
                     q_addr.eq(waddr_acc), q_sb.eq(a_tap["sb"]), q_any.eq(a_tap["valid"]),
                     q_done.eq(a_tap["valid"] & a_tap["last"] & a_tap["end"]),
                     p_we[0].eq(q_we[0]), p_we[1].eq(q_we[1]), p_addr.eq(q_addr), p_sb.eq(q_sb),
                     p_any.eq(q_any), p_done.eq(q_done)]
        st_mem = []
        for i in range(2):
            mem = Memory(shape=unsigned(16 * TC), depth=2 * H, init=[], attrs=self._ram_attrs("output"))
            m.submodules[f"stage{i}"] = mem
            wr = mem.write_port()
            st_mem.append((wr, mem.read_port()))
            y = [requantise(m, post[i][c], self.shift, rnd, self.relu, f"y{i}_{c}") for c in range(TC)]
            m.d.comb += [wr.addr.eq(Mux(p_sb, H, 0) + p_addr), wr.data.eq(Cat(y)), wr.en.eq(p_we[i])]
        m.d.sync += [self.block_done.eq(p_done), self.block_sb.eq(Mux(p_done, p_sb, self.block_sb))]

        # ---------------- staging read ----------------
        st_addr = Mux(self.st_sb, H, 0) + Mux(is1, self.st_j >> 1, self.st_j)
        m.d.comb += [st_mem[0][1].addr.eq(st_addr), st_mem[1][1].addr.eq(st_addr)]
        st_par = Signal()
        m.d.sync += st_par.eq(self.st_j[0])
        s0, s1 = st_mem[0][1].data, st_mem[1][1].data
        zero = Const(0, 16 * TC)
        cols = Signal(32 * TC)          # logical columns; those >= nPE read as zero
        with m.If(ish):
            m.d.comb += cols.eq(Cat(s0, s1))
        with m.Elif(is2):
            m.d.comb += cols.eq(Cat(s0[:16 * (TC // 2)], Const(0, 16 * (2 * TC - TC // 2))))
        with m.Else():
            m.d.comb += cols.eq(Cat(Mux(st_par, s1, s0), zero))
        m.d.comb += self.st_data.eq(cols)

        # ---------------- status ----------------
        m.d.comb += [self.released.eq(ctl[1]["valid"] & ctl[1]["end"]), self.mac_active.eq(ctl[2]["valid"]),
                     self.idle.eq(~active & ~q_any & ~p_any & ~Cat(c["valid"] for c in ctl[1:]).any())]
        return m

    # ------------------------------------------------------------------
    def _weight_writes(self, m: Module, W, BA, BB, is1: Value, is2: Value, ish: Value, qA, qB) -> None:
        """w_wr / b_wr: register the vector once (one cycle of write latency), then write
        the physical registers each logical (column, lane) maps to in the current mode,
        in the columns of group `q` only.

        Every group's copy is a write of its own: the control unit reads the row once per
        group with the address moved back by q*cw words, so the DMA hands over a vector
        whose group-q columns already hold the row (docs/hw-architecture.md, "EngineCore").
        The core only compares each PE's group (qA/qB, derived from cw in registers) with
        `q`: O(TC) comparators, no shifter or replication network in the fabric."""
        TP, TC, h = self.TP, self.TC, self.h
        has_k2, has_kh = K2 in self.modes, KHALF in self.modes
        bw = self.nmax // 2                      # int32 biases per b_wr

        # weights
        wd = [Signal(16, name=f"wreg{c}") for c in range(2 * TC)]
        wv, wwb, wq, wlane = Signal(), Signal(), Signal.like(self.w_wr.q), Signal.like(self.w_wr.lane)
        m.d.sync += [wd[c].eq(v) for c, v in enumerate(_words(self.w_wr.data, 2 * TC))]
        m.d.sync += [wv.eq(self.w_wr.valid), wwb.eq(self.w_wr.wb), wq.eq(self.w_wr.q), wlane.eq(self.w_wr.lane)]
        # is each PE's (lower, upper k=1/2 half) logical column in the written group?
        inA = [Signal(name=f"w_inA{p}") for p in range(TC)]
        inB = [Signal(name=f"w_inB{p}") for p in range(TC)]
        for p in range(TC):
            m.d.comb += [inA[p].eq(qA[p] == wq), inB[p].eq((qB[p] == wq) if has_kh else 0)]
        # Which (PE, lane) registers a write hits depends only on the lane, the PE's
        # parity and whether the PE has a k=2 partner, so the lane decode is built once
        # per such class (O(TP) comparators, not O(TP * TC)); the data a PE takes
        # depends only on the PE and on the half of its lanes (the k=1/2 split).
        # Per register that leaves one enable and one 16-bit data source.
        n_pair = 2 * (TC // 2)                   # PEs with a k=2 partner

        def lane_hits(par: int, paired: bool) -> list[list[Signal]]:
            """Per lane i, the write enables [wb 0, wb 1] of lane i in this class's PEs."""
            hits = []
            for i in range(TP):
                hit: Value = is1 & (wlane == i)
                if has_k2 and paired:
                    hit = hit | (is2 & (wlane == i + (TP if par else 0)))
                if has_kh and i < 2 * h:
                    hit = hit | (ish & (wlane == (i if i < h else i - h)))
                en = [Signal(name=f"wen{wb}_{par}{int(paired)}_{i}") for wb in range(2)]
                m.d.comb += [en[0].eq(wv & ~wwb & hit), en[1].eq(wv & wwb & hit)]
                hits.append(en)
            return hits

        classes = {(par, paired): lane_hits(par, paired) for par in (0, 1) for paired in (False, True)
                   if any(p % 2 == par and (p < n_pair) == paired for p in range(TC))}
        for p in range(TC):
            hits = classes[(p % 2, p < n_pair)]
            src_lo: Value = wd[p]
            if has_k2 and p < n_pair:
                src_lo = Mux(is2, wd[p // 2], src_lo)
            d_lo = Signal(16, name=f"wdat{p}_lo")
            m.d.comb += d_lo.eq(src_lo)
            d_hi = d_lo
            if has_kh:
                d_hi = Signal(16, name=f"wdat{p}_hi")
                m.d.comb += d_hi.eq(Mux(ish, wd[p + TC], d_lo))
            for i in range(TP):
                upper = has_kh and h <= i < 2 * h
                d = d_hi if upper else d_lo
                mine = Mux(ish, inB[p], inA[p]) if upper else inA[p]
                for wb in range(2):
                    with m.If(hits[i][wb] & mine):
                        m.d.sync += W[wb][p][i].eq(d)

        # bias: chunk at logical column `base` (a multiple of nmax/2); a 33rd bit marks the
        # columns this chunk covers, and only group q's columns take it
        b32 = _words(self.b_wr.data, bw, 32)
        bd = [Signal(33, name=f"breg{c}") for c in range(2 * TC)]
        bv, bwb, bq = Signal(), Signal(), Signal.like(self.b_wr.q)
        m.d.sync += [bd[c].eq(Cat(b32[c % bw], self.b_wr.base == (c // bw) * bw)) for c in range(2 * TC)]
        m.d.sync += [bv.eq(self.b_wr.valid), bwb.eq(self.b_wr.wb), bq.eq(self.b_wr.q)]
        bA = [Signal(name=f"b_inA{p}") for p in range(TC)]
        bB = [Signal(name=f"b_inB{p}") for p in range(TC)]
        for p in range(TC):
            m.d.comb += [bA[p].eq(qA[p] == bq), bB[p].eq((qB[p] == bq) if has_kh else 0)]
        for p in range(TC):
            targets = [(is1, BA, p, p, bA[p])]
            if has_k2 and p % 2 == 0 and p < 2 * (TC // 2):
                targets.append((is2, BA, p, p // 2, bA[p]))
            if has_kh:
                targets += [(ish, BA, p, p, bA[p]), (ish, BB, p, p + TC, bB[p])]
            for flag, regs, pe, col, mine in targets:
                with m.If(bv & flag & bd[col][32] & mine):
                    for wb in range(2):
                        with m.If(bwb == wb):
                            m.d.sync += regs[wb][pe].eq(bd[col][:32])
