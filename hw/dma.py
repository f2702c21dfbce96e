"""AXI4 master DMA: a ReadEngine and a WriteEngine per AXI port (`AxiDma`, 1..N ports).

The sequencer moves vectors of int16 words (activations, weights, bias pairs)
between DDR and the engine: a command names a byte address and a word count
of at most NMAX, and the engine turns it into INCR bursts of the port's full
width. The performance model (`dse/perf_model.py`) assumes the DMA moves
WPB = DW/16 words per cycle, so both engines are built to keep one beat per
cycle moving with several bursts outstanding:

* commands are accepted at up to one per cycle, and `cmd.ready` depends on
  registers only (never combinationally on an AXI `*ready`), so the
  sequencer's logic is not in the interconnect's timing path;
* address requests go through a small queue and issue back-to-back, up to
  `max_outstanding` bursts in flight (counted from AR/AW to the last R beat or
  the B response);
* R beats are accepted every cycle unless the response register is full and
  not being taken; W beats follow the command queue at one per cycle, even
  before their AW has been accepted (AXI4 allows write data ahead of the
  address, and the in-order queues make this deadlock-free).

One AXI ID (0) is used, so R data and B responses return in request order and
responses come back in command order without reordering buffers. A command
whose bytes cross a 4 KiB boundary becomes two bursts (AXI forbids a burst
crossing one); it is still one response (ReadEngine) and one entry in the
`idle` bookkeeping (WriteEngine).

Wiring both engines to one port: use `AxiDma` (engines + streams + `m_axi0`
.. `m_axi{N-1}`, commands dealt round-robin over the ports), or call
`connect_axi4_master(m, m_axi, read=rd.axi, write=wr.axi)` in the top level's
`elaborate`.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.hdl import ValueLike
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .axi import AXI_BURST_INCR, AXI_RESP_OKAY, axi4_signature, m_axi_name
from .stream_slice import StreamSlice

PAGE_BYTES = 4096
"""AXI bursts must not cross this boundary."""

AXI_CACHE_NORMAL = 0b0011
"""AxCACHE "normal non-cacheable bufferable": what Xilinx HP ports expect for plain DMA."""

_DATA_WIDTHS = (32, 64, 128, 256)


def _is_read_member(name: str) -> bool:
    return name.startswith(("ar", "r"))


def axi4_read_signature(addr_width: int = 32, data_width: int = 64, id_width: int = 1) -> wiring.Signature:
    """The AR and R channels of `axi4_signature` (master view), for a read-only master."""
    members = axi4_signature(addr_width, data_width, id_width).members
    return wiring.Signature({n: mem for n, mem in members.items() if _is_read_member(n)})


def axi4_write_signature(addr_width: int = 32, data_width: int = 64, id_width: int = 1) -> wiring.Signature:
    """The AW, W and B channels of `axi4_signature` (master view), for a write-only master."""
    members = axi4_signature(addr_width, data_width, id_width).members
    return wiring.Signature({n: mem for n, mem in members.items() if not _is_read_member(n)})


def connect_axi4_master(m: Module, m_axi, *, read=None, write=None) -> None:
    """Join a read-only and a write-only master onto one full AXI4 master interface.

    `m_axi` is the master-view interface (e.g. the top level's `Out(axi4_signature())`
    port); `read`/`write` are the engines' `axi` members. AXI4's read and write halves
    are independent, so this is plain wiring, no arbitration. A half given as None
    has its master outputs tied to 0 (no requests, no ready), so the port stays legal.
    """
    for name, member in m_axi.signature.members.items():
        half = read if _is_read_member(name) else write
        if member.flow == Out:
            m.d.comb += getattr(m_axi, name).eq(0 if half is None else getattr(half, name))
        elif half is not None:
            m.d.comb += getattr(half, name).eq(getattr(m_axi, name))


def max_beats(data_width: int, nmax: int) -> int:
    """Most beats one command can need: NMAX words starting at the last word of a beat."""
    wpb = data_width // 16
    return -(-(nmax + wpb - 1) // wpb)


class _Geometry:
    """Parameter checks and derived constants shared by both engines."""

    def __init__(self, addr_width: int, data_width: int, nmax: int, max_outstanding: int, id_width: int):
        if data_width not in _DATA_WIDTHS:
            raise ValueError(f"data_width must be one of {_DATA_WIDTHS}, not {data_width}")
        if nmax < 1:
            raise ValueError(f"nmax must be >= 1, not {nmax}")
        if not 13 <= addr_width <= 64:
            raise ValueError(f"addr_width must be 13..64, not {addr_width}")
        if max_outstanding < 1:
            raise ValueError(f"max_outstanding must be >= 1, not {max_outstanding}")
        if id_width < 1:
            raise ValueError(f"id_width must be >= 1, not {id_width}")
        self.addr_width = addr_width
        self.dw = data_width
        self.nmax = nmax
        self.max_outstanding = max_outstanding
        self.id_width = id_width
        self.beat_bytes = data_width // 8
        self.lb = exact_log2(self.beat_bytes)          # byte-offset bits within a beat
        self.wpb = data_width // 16                    # 16-bit words per beat
        self.max_beats = max_beats(data_width, nmax)
        # One command then splits into at most two bursts, each within AXI4's 256 beats.
        if 2 * nmax + self.beat_bytes > PAGE_BYTES or self.max_beats > 256:
            raise ValueError(f"nmax={nmax} is too long for one {data_width}-bit DMA command")
        self.nwords_shape = range(nmax + 1)


class _BurstPlan:
    """Combinational split of (addr, nwords) into one or two INCR bursts.

    Bursts start at the beat-aligned address below `addr` and cover every beat
    holding a byte of [addr, addr + 2·nwords); `split` when that range crosses a
    4 KiB page, the second burst then starting at the page boundary. Lengths are
    AxLEN values (beats − 1).
    """

    def __init__(self, m: Module, g: _Geometry, addr, nwords):
        lb, page_beats = g.lb, PAGE_BYTES // g.beat_bytes
        self.off = addr[1:lb]                          # first word's index within its beat
        self.nbeats = Signal(range(g.max_beats + 1))
        room = Signal(range(page_beats + 1))           # beats left in addr's page
        self.split = Signal()
        self.len1 = Signal(8)
        self.len2 = Signal(8)
        self.addr1 = Signal(g.addr_width)
        self.addr2 = Signal(g.addr_width)
        m.d.comb += [
            self.nbeats.eq(((addr[:lb] + (nwords << 1) - 1) >> lb) + 1),
            room.eq(page_beats - addr[lb:12]),
            self.split.eq(self.nbeats > room),
            self.len1.eq(Mux(self.split, room, self.nbeats) - 1),
            self.len2.eq(self.nbeats - room - 1),
            self.addr1.eq(Cat(Const(0, lb), addr[lb:])),
            self.addr2.eq(Cat(Const(0, 12), addr[12:] + 1)),
        ]


class _AddressIssuer:
    """Queue of (addr, len) bursts driving AR or AW, with the outstanding-burst limit.

    The caller drives `push` (take `plan`'s first burst; only while
    `push_ready`) and `complete` (pulse per finished burst: last R beat, or
    B). A split command's second burst is held in a register and queued on
    the next cycle, during which `push_ready` is low. `push_ready` and `valid`
    depend on registers only; `inflight` counts issued, unfinished bursts.
    """

    def __init__(self, m: Module, g: _Geometry, prefix: str, plan: _BurstPlan, ready):
        m.submodules[f"{prefix}_q"] = q = SyncFIFOBuffered(width=g.addr_width + 8, depth=4)
        self.q = q
        self.push = Signal(name=f"{prefix}_push")
        self.complete = Signal(name=f"{prefix}_complete")
        self.push_ready = Signal(name=f"{prefix}_push_ready")
        self.valid = Signal(name=f"{prefix}_valid")
        self.addr = q.r_data[:g.addr_width]
        self.len = q.r_data[g.addr_width:]
        self.p2_valid = p2_valid = Signal(name=f"{prefix}_p2_valid")
        p2 = Signal(g.addr_width + 8, name=f"{prefix}_p2")
        self.inflight = inflight = Signal(range(g.max_outstanding + 1), name=f"{prefix}_inflight")
        fire = self.valid & ready
        m.d.comb += [
            self.push_ready.eq(q.w_rdy & ~p2_valid),
            self.valid.eq(q.r_rdy & (inflight < g.max_outstanding)),
            q.r_en.eq(fire),
        ]
        with m.If(p2_valid):
            m.d.comb += [q.w_en.eq(1), q.w_data.eq(p2)]
            with m.If(q.w_rdy):
                m.d.sync += p2_valid.eq(0)
        with m.Elif(self.push):
            m.d.comb += [q.w_en.eq(1), q.w_data.eq(Cat(plan.addr1, plan.len1))]
            m.d.sync += [p2_valid.eq(plan.split), p2.eq(Cat(plan.addr2, plan.len2))]
        with m.If(fire & ~self.complete):
            m.d.sync += inflight.eq(inflight + 1)
        with m.Elif(~fire & self.complete):
            m.d.sync += inflight.eq(inflight - 1)

    @property
    def empty(self):
        return (self.q.level == 0) & ~self.p2_valid


def _drive_constant_ax(m: Module, axi, prefix: str, g: _Geometry) -> None:
    m.d.comb += [
        getattr(axi, f"{prefix}id").eq(0),
        getattr(axi, f"{prefix}size").eq(g.lb),
        getattr(axi, f"{prefix}burst").eq(AXI_BURST_INCR),
        getattr(axi, f"{prefix}lock").eq(0),
        getattr(axi, f"{prefix}cache").eq(AXI_CACHE_NORMAL),
        getattr(axi, f"{prefix}prot").eq(0),
    ]


def read_cmd_layout(addr_width: int, nmax: int, tag_width: int) -> data.StructLayout:
    """ReadEngine command: byte `addr` (2-aligned), `nwords` 1..NMAX, `zero` (no access, zeros back), `tag`."""
    return data.StructLayout({"addr": addr_width, "nwords": range(nmax + 1), "zero": 1, "tag": tag_width})


def read_rsp_layout(nmax: int, tag_width: int) -> data.StructLayout:
    """ReadEngine response: `data` word i = i-th 16-bit word from addr (words ≥ nwords are 0)."""
    return data.StructLayout({"data": data.ArrayLayout(16, nmax), "nwords": range(nmax + 1), "tag": tag_width})


def write_cmd_layout(addr_width: int, nmax: int) -> data.StructLayout:
    """WriteEngine command: byte `addr` (2-aligned), `nwords` 1..NMAX, `data` (words ≥ nwords ignored)."""
    return data.StructLayout({"addr": addr_width, "nwords": range(nmax + 1), "data": data.ArrayLayout(16, nmax)})


class ReadEngine(wiring.Component):
    """Reads vectors of up to NMAX int16 words into `rsp`, one response per command, in order.

    Ports: `cmd` (stream of `read_cmd_layout`), `rsp` (stream of `read_rsp_layout`),
    `axi` (AR + R, `axi4_read_signature`), `error` (sticky: some RRESP was not OKAY;
    the failed burst's data is still delivered so nothing waits forever), `idle`
    (no command in flight and no response waiting).

    `two_streams` (a port of `AxiDma` with two read streams on several ports): the
    tag's top bit names a command's stream, and each stream has a response register
    of its own, `rsp` and `rsp1`, so a response its stream's merge cannot take yet
    holds only that register: the port's next read, of the other stream, still
    completes into the other one (a port waits only behind two held responses).
    """

    def __init__(self, addr_width: int = 32, data_width: int = 64, nmax: int = 16, tag_width: int = 4,
                 max_outstanding: int = 8, id_width: int = 1, two_streams: bool = False):
        self.geometry = _Geometry(addr_width, data_width, nmax, max_outstanding, id_width)
        if tag_width < 1:
            raise ValueError(f"tag_width must be >= 1, not {tag_width}")
        self.tag_width = tag_width
        self.two_streams = two_streams
        super().__init__({
            "cmd": In(stream.Signature(read_cmd_layout(addr_width, nmax, tag_width))),
            "rsp": Out(stream.Signature(read_rsp_layout(nmax, tag_width))),
            **({"rsp1": Out(stream.Signature(read_rsp_layout(nmax, tag_width)))} if two_streams else {}),
            "axi": Out(axi4_read_signature(addr_width, data_width, id_width)),
            "error": Out(1),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        g, axi, cmd, rsp = self.geometry, self.axi, self.cmd, self.rsp
        # Per-command bookkeeping for the R side, in command order.
        desc_layout = data.StructLayout({
            "off": g.lb - 1, "nbeats": range(g.max_beats + 1), "nwords": g.nwords_shape,
            "tag": self.tag_width, "zero": 1,
        })
        m.submodules.desc_q = desc_q = SyncFIFOBuffered(width=desc_layout.size,
                                                        depth=g.max_outstanding + 4)
        plan = _BurstPlan(m, g, cmd.payload.addr, cmd.payload.nwords)
        ar = _AddressIssuer(m, g, "ar", plan, axi.arready)
        accept = cmd.valid & cmd.ready
        m.d.comb += [
            cmd.ready.eq(desc_q.w_rdy & ar.push_ready),
            ar.push.eq(accept & ~cmd.payload.zero),
        ]
        desc_in = Signal(desc_layout)
        m.d.comb += [
            desc_in.off.eq(plan.off), desc_in.nbeats.eq(plan.nbeats), desc_in.nwords.eq(cmd.payload.nwords),
            desc_in.tag.eq(cmd.payload.tag), desc_in.zero.eq(cmd.payload.zero),
            desc_q.w_data.eq(desc_in), desc_q.w_en.eq(accept),
        ]
        _drive_constant_ax(m, axi, "ar", g)
        m.d.comb += [axi.arvalid.eq(ar.valid), axi.araddr.eq(ar.addr), axi.arlen.eq(ar.len)]

        # R side: align the head command's beats as they arrive and register the response. Response
        # beat k (words k*wpb ..) is raw words k*wpb + off .., from raw beats k and k+1: when raw
        # beat k+1 arrives, beside the previous one (`prev`), response beat k is a one-beat shift
        # and goes to its slot; the last raw beat completes the last two response beats. One
        # beat-wide shifter instead of an NMAX-word one (docs/resources.md, "The DMA's shifters").
        head = desc_layout(desc_q.r_data)
        bidx = Signal(range(g.max_beats))
        out_beats = -(-g.nmax // g.wpb)
        slots = [Signal(g.dw, name=f"slot{k}") for k in range(out_beats)]
        prev = Signal(g.dw)
        last_beat = Signal()
        outs = [rsp, self.rsp1] if self.two_streams else [rsp]
        sel = head.tag[-1] if self.two_streams else Const(0)      # the head's stream: its response register
        out_free = Mux(sel, ~outs[-1].valid | outs[-1].ready, ~rsp.valid | rsp.ready)
        r_fire = Signal()
        m.d.comb += [
            last_beat.eq(bidx == head.nbeats - 1),
            axi.rready.eq(desc_q.r_rdy & ~head.zero & (~last_beat | out_free)),
            r_fire.eq(axi.rvalid & axi.rready),
            ar.complete.eq(r_fire & axi.rlast),
        ]
        done = Signal(g.dw)      # response beat bidx - 1: from prev and this beat
        tail = Signal(g.dw)      # response beat bidx: from this beat alone (the last one's)
        with m.Switch(head.off):
            for o in range(g.wpb):
                with m.Case(o):
                    m.d.comb += [done.eq(Cat(prev, axi.rdata)[16 * o: 16 * (o + g.wpb)]),
                                 tail.eq(axi.rdata[16 * o:])]
        beats = Cat(*(Mux(bidx == k + 1, done, Mux(bidx == k, tail, slot)) for k, slot in enumerate(slots)))
        masked = Cat(*(Mux(i < head.nwords, beats[16 * i: 16 * i + 16], 0) for i in range(g.nmax)))

        for o in outs:
            with m.If(o.ready):
                m.d.sync += o.valid.eq(0)
        with m.If(r_fire):
            with m.If(axi.rresp != AXI_RESP_OKAY):
                m.d.sync += self.error.eq(1)
            with m.If(last_beat):
                m.d.comb += desc_q.r_en.eq(1)
                m.d.sync += bidx.eq(0)
                self._respond(m, outs, sel, masked, head)
            with m.Else():
                m.d.sync += [bidx.eq(bidx + 1), prev.eq(axi.rdata)]
                with m.Switch(bidx):
                    for k, slot in enumerate(slots):
                        with m.Case(k + 1):
                            m.d.sync += slot.eq(done)
        with m.Elif(desc_q.r_rdy & head.zero & out_free):
            m.d.comb += desc_q.r_en.eq(1)
            self._respond(m, outs, sel, 0, head)
        m.d.comb += self.idle.eq((desc_q.level == 0) & ~Cat(o.valid for o in outs).any())
        return m

    @staticmethod
    def _respond(m: Module, outs: list, sel: Value, value: ValueLike, head) -> None:
        """Load the head command's response (`value`) into its stream's response register (`outs[sel]`)."""
        for k, o in enumerate(outs):
            with m.If(sel == k):
                m.d.sync += [o.valid.eq(1), o.payload.data.eq(value), o.payload.nwords.eq(head.nwords),
                             o.payload.tag.eq(head.tag)]


class WriteEngine(wiring.Component):
    """Writes vectors of up to NMAX int16 words from `cmd` to memory.

    Ports: `cmd` (stream of `write_cmd_layout`), `axi` (AW + W + B,
    `axi4_write_signature`), `idle` (every accepted command has had all its B
    responses), `error` (sticky: some BRESP was not OKAY). WSTRB masks the bytes
    outside [addr, addr + 2·nwords) in the first and last beats.
    """

    def __init__(self, addr_width: int = 32, data_width: int = 64, nmax: int = 16,
                 max_outstanding: int = 8, id_width: int = 1):
        self.geometry = _Geometry(addr_width, data_width, nmax, max_outstanding, id_width)
        super().__init__({
            "cmd": In(stream.Signature(write_cmd_layout(addr_width, nmax))),
            "axi": Out(axi4_write_signature(addr_width, data_width, id_width)),
            "error": Out(1),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        g, axi, cmd = self.geometry, self.axi, self.cmd
        # W-side queue: the command's words plus where its beats and bursts end.
        wq_layout = data.StructLayout({
            "data": 16 * g.nmax, "off": g.lb - 1, "nwords": g.nwords_shape,
            "end": range(g.max_beats), "end1": range(g.max_beats),
        })
        m.submodules.w_q = w_q = SyncFIFOBuffered(width=wq_layout.size, depth=4)
        plan = _BurstPlan(m, g, cmd.payload.addr, cmd.payload.nwords)
        aw = _AddressIssuer(m, g, "aw", plan, axi.awready)
        accept = cmd.valid & cmd.ready
        m.d.comb += [cmd.ready.eq(w_q.w_rdy & aw.push_ready), aw.push.eq(accept)]
        w_in = Signal(wq_layout)
        m.d.comb += [
            w_in.data.eq(cmd.payload.data), w_in.off.eq(plan.off), w_in.nwords.eq(cmd.payload.nwords),
            w_in.end.eq(plan.nbeats - 1), w_in.end1.eq(Mux(plan.split, plan.len1, plan.nbeats - 1)),
            w_q.w_data.eq(w_in), w_q.w_en.eq(accept),
        ]
        _drive_constant_ax(m, axi, "aw", g)
        m.d.comb += [axi.awvalid.eq(aw.valid), axi.awaddr.eq(aw.addr), axi.awlen.eq(aw.len)]

        # W: beat `widx` of the head command, words shifted up by `off` within the beats: word w is
        # command word widx*wpb + w - off, from the command's beats widx - 1 and widx. The previous
        # one is kept (`prev`, zero before the first), so the shifter is one beat wide, not NMAX words.
        head = wq_layout(w_q.r_data)
        widx = Signal(range(g.max_beats))
        cur = Cat(head.data, Const(0, g.max_beats * g.dw - 16 * g.nmax)).word_select(widx, g.dw)
        prev = Signal(g.dw)
        wdata = Signal(g.dw)
        with m.Switch(head.off):
            for o in range(g.wpb):
                with m.Case(o):
                    m.d.comb += wdata.eq(Cat(prev, cur)[16 * (g.wpb - o): 16 * (2 * g.wpb - o)])
        strb = []
        for w in range(g.wpb):
            j = widx * g.wpb + w                       # word index counted from the first beat
            keep = (j >= head.off) & (j < head.off + head.nwords)
            strb += [keep, keep]
        w_last = Signal()
        w_fire = Signal()
        m.d.comb += [
            axi.wdata.eq(wdata),
            axi.wstrb.eq(Cat(*strb)),
            axi.wlast.eq((widx == head.end) | (widx == head.end1)),
            axi.wvalid.eq(w_q.r_rdy),
            w_last.eq(widx == head.end),
            w_fire.eq(axi.wvalid & axi.wready),
            w_q.r_en.eq(w_fire & w_last),
        ]
        with m.If(w_fire):
            m.d.sync += [widx.eq(Mux(w_last, 0, widx + 1)), prev.eq(Mux(w_last, 0, cur))]

        b_fire = axi.bvalid & axi.bready
        m.d.comb += [axi.bready.eq(1), aw.complete.eq(b_fire)]
        with m.If(b_fire & (axi.bresp != AXI_RESP_OKAY)):
            m.d.sync += self.error.eq(1)
        m.d.comb += self.idle.eq((w_q.level == 0) & aw.empty & (aw.inflight == 0))
        return m


class AxiDma(wiring.Component):
    """Read and write engines behind `ports` AXI4 master ports `m_axi0` .. `m_axi{ports-1}`.

    Ports: one `m_axi<i>` per AXI port (`axi4_signature`, master; `m_axi_name(i)`),
    `rd_cmd`/`rd_rsp`/`rd_error`/`rd_idle` and `wr_cmd`/`wr_error`/`wr_idle`. This
    is the unit the NPU top level instantiates, and the wrapper the cocotb test drives.

    Each port has its own ReadEngine and WriteEngine. Commands are dealt round-robin
    in acceptance order: command n goes to port n mod `ports`, reads and writes each
    with their own pointer, zero reads included. A port answers its commands in
    order, so the n-th response is the head of port n mod `ports`: the merger takes
    responses round-robin and the caller sees one in-order stream, as with one port,
    without a reordering buffer or an order queue. While one port moves a command's
    beats the next commands' beats move on the others, so a stream of several-beat
    commands is no longer capped at one port's beat rate; the command rate stays
    one per cycle. `rd_cmd.ready`/`wr_cmd.ready` select a register-driven ready by
    a register, so they still depend on registers only. `idle`: every port idle;
    `error`: any port's. Write commands to different ports complete in no fixed
    order: `wr_idle` (all B responses in) is what orders writes before later reads.

    `read_streams` = 2 adds a second read stream (`rd_cmd1`/`rd_rsp1`): the control
    unit's weight and input walkers issue side by side (docs/hw-architecture.md, "Two
    walkers"). Both streams share the one round-robin order: in a cycle one stream's
    command goes to the next port and the other's to the port after it, so up to two
    commands a cycle are taken (one on a single port). Which stream goes first swaps
    each time the deal wraps round an even number of ports, so that neither stream's
    beats keep to half of the ports. A caller that needs an order between the two
    streams (the Sequencer: a step's reads before the next step's) presents a read
    only once the reads it must follow are taken. Each command
    carries its stream in a tag bit of its own through the port, and each stream records,
    in a small FIFO of its own, the port each of its reads went to. The merger gives each
    stream the head of the port its next read went to, once that head is its own, so up
    to two responses a cycle leave, each stream in its own command order, and a stall of
    one stream never bunches the other's responses behind it (the oldest read in flight is
    always at the head of its port and of its stream, so neither waits for ever). Each
    port takes its reads through a forward register slice, so the deal's multiplexers
    end at a register (+1 cycle a read), and on several ports through a skid register
    first, so the deal's ready logic starts at one (no cycle). The second command's `valid` depends on the
    first's `ready` (it may only leave behind it): the Sequencer's skid buffers make both
    readies registers. `rd_restart` (only while no read is in flight) starts the
    deal over at port 0, stream 0 first: the NPU pulses it at each layer's start,
    so a layer's reads land on the ports the same way whatever ran before (the
    performance model's `LayerCosts.busiest_port` reasons from there).

    On several ports the second stream's zero reads (the input walker's padding) go to no
    port: a zero read is dealt like any read (so every real read lands where it would have),
    but its port's slice drops it instead of handing it to the ReadEngine; the stream's order
    holds it with its words and tag, and the merge answers it itself, zeros, when it reaches
    it. So the padding holds no port's response register, and no read of either stream waits
    behind it there (on one port, or on the first stream, a zero read still goes through a
    ReadEngine, which answers it without a bus access). docs/hw-architecture.md, "Zero fills
    on several ports". Likewise each port's ReadEngine keeps a response register per stream
    there (`ReadEngine(two_streams=True)`): a response that is not yet its stream's next holds
    its own stream's register, and the port goes on with a read of the other stream, so one
    stream's order no longer stalls the other's beats on the ports it shares (docs/hw-architecture.md,
    "A response register per stream").
    """

    def __init__(self, addr_width: int = 32, data_width: int = 64, nmax: int = 16, tag_width: int = 4,
                 max_outstanding: int = 8, id_width: int = 1, ports: int = 1, read_streams: int = 1):
        if ports < 1:
            raise ValueError(f"ports must be >= 1, not {ports}")
        if read_streams not in (1, 2):
            raise ValueError(f"read_streams must be 1 or 2, not {read_streams}")
        self.ports, self.read_streams, self.tag_width = ports, read_streams, tag_width
        self.max_outstanding, self.nmax = max_outstanding, nmax
        engine_tag = tag_width + (read_streams - 1)          # + the stream bit, on top
        split = read_streams == 2 and ports > 1              # a response register per stream (the merge's)
        self.reads = [ReadEngine(addr_width, data_width, nmax, engine_tag, max_outstanding, id_width, split)
                      for _ in range(ports)]
        self.writes = [WriteEngine(addr_width, data_width, nmax, max_outstanding, id_width) for _ in range(ports)]
        axi = {m_axi_name(i): Out(axi4_signature(addr_width, data_width, id_width)) for i in range(ports)}
        super().__init__({
            **axi,
            "rd_cmd": In(stream.Signature(read_cmd_layout(addr_width, nmax, tag_width))),
            "rd_rsp": Out(stream.Signature(read_rsp_layout(nmax, tag_width))),
            **({"rd_cmd1": In(stream.Signature(read_cmd_layout(addr_width, nmax, tag_width))),
                "rd_rsp1": Out(stream.Signature(read_rsp_layout(nmax, tag_width))),
                "rd_restart": In(1)} if read_streams == 2 else {}),
            "rd_error": Out(1),
            "rd_idle": Out(1),
            "wr_cmd": In(stream.Signature(write_cmd_layout(addr_width, nmax))),
            "wr_error": Out(1),
            "wr_idle": Out(1),
        })

    @staticmethod
    def max_reads_in_flight(ports: int, max_outstanding: int = 8) -> int:
        """Most read commands accepted and not yet answered that a port holds: its command queue
        (`max_outstanding` + 4), its response register and, on several ports, its command slice's
        skid register and its second stream's response register."""
        return ports * (max_outstanding + 5 + 2 * (ports > 1))

    def m_axi(self, i: int):
        """Port i's AXI4 master interface."""
        return getattr(self, m_axi_name(i))

    def elaborate(self, platform):
        m = Module()
        n = self.ports
        for i, (rd, wr) in enumerate(zip(self.reads, self.writes)):
            m.submodules[f"read{i}"] = rd
            m.submodules[f"write{i}"] = wr
            connect_axi4_master(m, self.m_axi(i), read=rd.axi, write=wr.axi)
        held = self._deal_two_streams(m) if self.read_streams == 2 else []     # reads in the ports' slices
        m.d.comb += [self.rd_error.eq(Cat(rd.error for rd in self.reads).any()),
                     self.rd_idle.eq(Cat(*(rd.idle for rd in self.reads), *(~b for b in held)).all()),
                     self.wr_error.eq(Cat(wr.error for wr in self.writes).any()),
                     self.wr_idle.eq(Cat(wr.idle for wr in self.writes).all())]
        if n == 1:
            if self.read_streams == 1:
                wiring.connect(m, wiring.flipped(self.rd_cmd), self.reads[0].cmd)
                wiring.connect(m, self.reads[0].rsp, wiring.flipped(self.rd_rsp))
            wiring.connect(m, wiring.flipped(self.wr_cmd), self.writes[0].cmd)
            return m
        if self.read_streams == 1:
            self._deal_one_stream(m)
        wr_next = Signal(range(n))
        for i, wr in enumerate(self.writes):
            m.d.comb += [wr.cmd.payload.eq(self.wr_cmd.payload), wr.cmd.valid.eq(self.wr_cmd.valid & (wr_next == i))]
        m.d.comb += self.wr_cmd.ready.eq(Array(wr.cmd.ready for wr in self.writes)[wr_next])
        with m.If(self.wr_cmd.valid & self.wr_cmd.ready):
            m.d.sync += _advance(wr_next, n)
        return m

    def _deal_one_stream(self, m: Module) -> None:
        """One read stream over n > 1 ports: command k to port k mod n, responses merged in that order."""
        n = self.ports
        rd_next, rsp_next = Signal(range(n), name="rd_next"), Signal(range(n), name="rsp_next")
        for i, rd in enumerate(self.reads):
            m.d.comb += [rd.cmd.payload.eq(self.rd_cmd.payload), rd.cmd.valid.eq(self.rd_cmd.valid & (rd_next == i)),
                         rd.rsp.ready.eq(self.rd_rsp.ready & (rsp_next == i))]
        m.d.comb += [
            self.rd_cmd.ready.eq(Array(rd.cmd.ready for rd in self.reads)[rd_next]),
            self.rd_rsp.valid.eq(Array(rd.rsp.valid for rd in self.reads)[rsp_next]),
            self.rd_rsp.payload.eq(Array(rd.rsp.payload.as_value() for rd in self.reads)[rsp_next]),
        ]
        with m.If(self.rd_cmd.valid & self.rd_cmd.ready):
            m.d.sync += _advance(rd_next, n)
        with m.If(self.rd_rsp.valid & self.rd_rsp.ready):
            m.d.sync += _advance(rsp_next, n)

    def _deal_two_streams(self, m: Module) -> list[Signal]:
        """Two read streams over n ports (see the class docstring): the first stream's command to port
        `rd_next`, the second's to the port after (on one port: only when the first has none; on
        several, a zero read of stream 1 is dealt its port, whose slice drops it); responses: each stream's
        next from the port its next read went to, or, for a zero read of stream 1, from its order itself.
        Returns what keeps a read in flight outside the engines: each port slice's `busy` (a read
        taken but not yet in its engine) and, on several ports, stream 1's order not empty (a zero
        read no port holds)."""
        n, tw = self.ports, self.tag_width
        cmds, rsps = (self.rd_cmd, self.rd_cmd1), (self.rd_rsp, self.rd_rsp1)
        rd_next = Signal(range(n), name="rd_next")

        def after(ptr, k):
            return ptr + k if n == 1 else Mux(ptr + k >= n, ptr + k - n, ptr + k)

        # which stream goes first in a cycle: on an even port count, the one that went second since the
        # deal last wrapped round the ports, so that neither stream keeps to every other port
        swap = Signal()
        first, second = Mux(swap, 1, 0), Mux(swap, 0, 1)
        cmd_valid = Array(c.valid for c in cmds)
        cmd_payload = Array(c.payload.as_value() for c in cmds)
        # each port takes its reads through a forward register slice: the deal's multiplexers end at a
        # register, not in the engine's burst planning (+1 cycle on every read's trip). On several ports
        # the second stream's zero reads (the input walker's padding) are dealt like any read but go to no
        # port: the slice drops them (its output is a register, so the deal's logic is what it was), the
        # stream's order holds them with their words and tag, and the merge answers them itself
        slices = [StreamSlice(rd.cmd.payload.shape(), backward=n > 1) for rd in self.reads]
        for i, (sl, rd) in enumerate(zip(slices, self.reads)):
            m.submodules[f"cmd_slice{i}"] = sl
            drop = sl.o.payload.zero & sl.o.payload.tag[tw] if n > 1 else Const(0)
            m.d.comb += [rd.cmd.payload.eq(sl.o.payload), rd.cmd.valid.eq(sl.o.valid & ~drop),
                         sl.o.ready.eq(rd.cmd.ready | drop)]
        # on several ports each stream records, in its own order, the port each of its reads went to (with,
        # for the second stream, whether it is a zero read and that read's words and tag): the merge then
        # takes each stream's next response from that port, whatever the other stream does
        port_fifos = []
        tokens = [data.StructLayout({"port": range(n)}),
                  data.StructLayout({"port": range(n), "zero": 1, "nwords": range(self.nmax + 1), "tag": tw})]
        if n > 1:
            for s in range(2):
                q = SyncFIFOBuffered(width=tokens[s].size, depth=self.max_reads_in_flight(n, self.max_outstanding) + n)
                m.submodules[f"port_order{s}"] = q
                port_fifos.append(q)
            fifo_w_rdy = Array(q.w_rdy for q in port_fifos)
            port_ready = Array(sl.i.ready for sl in slices)
            a_ok, b_ok = port_ready[rd_next] & fifo_w_rdy[first], fifo_w_rdy[second]
        else:
            port_ready = Array(sl.i.ready for sl in slices)
            a_ok, b_ok = port_ready[rd_next], 1
        a_valid, a_fire = Signal(), Signal()
        m.d.comb += [a_valid.eq(cmd_valid[first]), a_fire.eq(a_valid & a_ok)]
        if n == 1:
            b_ready = port_ready[0] & ~a_valid
            port_b = rd_next
        else:
            port_b = Signal(range(n), name="port_b")
            m.d.comb += port_b.eq(after(rd_next, a_fire))
            b_ready = port_ready[port_b] & b_ok
        for s, c in enumerate(cmds):
            m.d.comb += c.ready.eq(Mux(swap == s, a_ok, b_ready))
        b_fire = cmd_valid[second] & b_ready
        layout = self.reads[0].cmd.payload.shape()
        a_cmd, b_cmd = (layout(Cat(cmd_payload[x], x)) for x in (first, second))      # + the stream bit
        for i, sl in enumerate(slices):
            from_a = a_valid & (rd_next == i)
            if n > 1:   # the order's room too: a stream of zero reads, which no port holds, may fill it
                m.d.comb += sl.i.valid.eq((from_a & fifo_w_rdy[first]) | (cmd_valid[second] & b_ok & (port_b == i)))
            else:
                m.d.comb += sl.i.valid.eq(from_a | (cmd_valid[second] & (port_b == i)))
            m.d.comb += sl.i.payload.eq(Mux(from_a, a_cmd.as_value(), b_cmd.as_value()))
        if n > 1:
            m.d.sync += rd_next.eq(after(rd_next, a_fire + b_fire))
            if n % 2 == 0:
                with m.If(rd_next + a_fire + b_fire >= n):
                    m.d.sync += swap.eq(~swap)
            token1 = Signal(tokens[1])
            m.d.comb += [token1.port.eq(Mux(swap == 1, rd_next, port_b)), token1.zero.eq(self.rd_cmd1.payload.zero),
                         token1.nwords.eq(self.rd_cmd1.payload.nwords), token1.tag.eq(self.rd_cmd1.payload.tag)]
            m.d.comb += [port_fifos[0].w_en.eq(Mux(swap == 0, a_fire, b_fire)),
                         port_fifos[0].w_data.eq(Mux(swap == 0, rd_next, port_b)),
                         port_fifos[1].w_en.eq(Mux(swap == 1, a_fire, b_fire)),
                         port_fifos[1].w_data.eq(token1)]

        layout = self.reads[0].rsp.payload.shape()
        if n == 1:
            # one port: its head goes to the stream it belongs to
            head = Signal(layout, name="head")
            one = self.reads[0].rsp
            m.d.comb += head.eq(one.payload)
            for s, r in enumerate(rsps):
                m.d.comb += [r.valid.eq(one.valid & (head.tag[tw] == s)), r.payload.data.eq(head.data),
                             r.payload.nwords.eq(head.nwords), r.payload.tag.eq(head.tag[:tw])]
            m.d.comb += one.ready.eq(Array(r.ready for r in rsps)[head.tag[tw]])
        else:
            # the merge: each stream's next response is in its own response register of the port its next
            # read went to (`ReadEngine(two_streams=True)`); the oldest read in flight is always at the head
            # of its port and of its stream, so neither stream waits on the other for ever, and up to two
            # responses leave a cycle
            takes = []
            for s, (r, q) in enumerate(zip(rsps, port_fifos)):
                token = Signal(tokens[s], name=f"token{s}")
                head = Signal(layout, name=f"head{s}")
                mine = Signal(name=f"mine{s}")
                zero = token.zero if s == 1 else Const(0)
                outs = [rd.rsp1 if s else rd.rsp for rd in self.reads]
                s_valid = Array(o.valid for o in outs)
                s_payload = Array(o.payload.as_value() for o in outs)
                m.d.comb += [token.eq(q.r_data), head.eq(s_payload[token.port]),
                             mine.eq(q.r_rdy & (zero | s_valid[token.port])),
                             r.valid.eq(mine), q.r_en.eq(mine & r.ready)]
                if s == 1:
                    m.d.comb += [r.payload.data.eq(Mux(zero, 0, head.data)),
                                 r.payload.nwords.eq(Mux(zero, token.nwords, head.nwords)),
                                 r.payload.tag.eq(Mux(zero, token.tag, head.tag[:tw]))]
                else:
                    m.d.comb += [r.payload.data.eq(head.data), r.payload.nwords.eq(head.nwords),
                                 r.payload.tag.eq(head.tag[:tw])]
                takes.append((token.port, mine & r.ready & ~zero))
            for i, rd in enumerate(self.reads):
                m.d.comb += [rd.rsp.ready.eq((takes[0][0] == i) & takes[0][1]),
                             rd.rsp1.ready.eq((takes[1][0] == i) & takes[1][1])]
        with m.If(self.rd_restart):
            m.d.sync += [rd_next.eq(0), swap.eq(0)]
        # a zero read waiting in the second stream's order is a read in flight that no port holds
        return [sl.busy for sl in slices] + ([port_fifos[1].level != 0] if port_fifos else [])


def _advance(ptr: Signal, n: int):
    """`ptr` one on, round the n ports."""
    return ptr.eq(Mux(ptr == n - 1, 0, ptr + 1))

