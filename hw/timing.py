"""A timing proxy without a timing-driven tool: the longest register-to-register
path of a Yosys `synth_xilinx` netlist, counted in LUT levels and carry cells.

Yosys has no delay model for Xilinx parts (its `sta` needs abc9 timing boxes,
`ltp` counts every cell alike and names no cells), so this walks the mapped,
flattened netlist (`write_json`) itself. The proxy (docs/resources.md,
"Timing proxy"):

* **Start points**: outputs of flip-flops (FD*/LD*), block RAMs (RAMB*/FIFO*,
  whose read data is clocked), UltraRAMs, DSP slices, the clocked outputs of
  shift registers (Q31) and the design's top-level inputs.
* **End points**: every data/enable/reset/address input of those cells, the
  write ports (data, write enable) of distributed RAMs and SRLs, and the top
  outputs.
* **Combinational cells**: LUT1..LUT6 and LUT6_2 count one **LUT level**, and so
  does an INV unless a LUT drives it (Vivado folds such an inverter into that LUT;
  Yosys leaves INVs in front of carry chains, e.g. for a subtraction);
  MUXF7/MUXF8/MUXF9 count no LUT level (they sit in the slice behind the LUTs;
  reported as `muxf`); CARRY4/CARRY8 count one **carry cell** each (output bit
  i depends on inputs 0..i and the carry-in, so only real carry paths chain);
  a distributed RAM's or SRL's asynchronous read (address -> data) counts one
  LUT level (two for the 128-deep RAMs, which add a MUXF7).
* The **longest path** maximises (LUT levels, carry cells, muxf) in that order.
  `carry_path` is the same walk maximising (carry cells, LUT levels, muxf): the
  longest carry chain and what feeds it.

At 200 MHz on a 7-series -2 part, a LUT plus its routing costs ~0.5-0.7 ns and a
register's clock-to-out plus setup ~0.5 ns, so 8 LUT levels is the usual budget
of a 5 ns cycle (a CARRY4 adds ~0.1 ns; a 32-bit adder is 1 LUT + 8 CARRY4).
A DSP48 without its output register (PREG = 0) would be a multi-ns
combinational element; those are listed in `unregistered_dsps` and treated as
boundaries.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fluidnpu.errors import FluidError

LUTS = ("LUT1", "LUT2", "LUT3", "LUT4", "LUT5", "LUT6", "LUT6_2")
MUXFS = ("MUXF7", "MUXF8", "MUXF9")
CARRY_CELLS = ("CARRY4", "CARRY8")
# distributed RAMs / SRLs: clocked write, asynchronous read through their address pins
ASYNC_READ = re.compile(r"^(RAM\d+X\d+[SD]|RAM\d+M\d*|RAM64X8SW|RAM32X16DR8|SRLC?\d+E)$")
READ_ADDR = re.compile(r"^(A\d*|ADDR[A-H]?|DPRA\d*|RADR\d*|A_[A-H]?)$")
CLOCKS = re.compile(r"^(C|CLK|WCLK|CLKARDCLK|CLKBWRCLK|RDCLK|WRCLK|CLKA|CLKB)$")

Weight = tuple[int, int, int]          # (LUT levels, carry cells, muxf cells)
NO_WEIGHT: Weight = (0, 0, 0)


@dataclass(frozen=True)
class PathStep:
    """One net on a path: its name, the cell driving it (type, name, Verilog source)."""

    net: str
    cell_type: str
    cell: str
    src: str


@dataclass(frozen=True)
class TimingPath:
    """A longest path: its counts and its nets from start point to end point."""

    lut_levels: int
    carry: int
    muxf: int
    start: PathStep
    end: PathStep                       # the end point: the net and the cell (type, name) it enters
    steps: list[PathStep] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.lut_levels} LUT levels + {self.carry} carry: {self.start.net} ({self.start.cell_type}) -> "
                f"{self.end.net} ({self.end.cell_type} {self.end.cell})")


@dataclass(frozen=True)
class TimingReport:
    """The proxy of one netlist: the longest LUT path and the longest carry path."""

    critical: TimingPath                # max (LUT levels, carry, muxf)
    carry_path: TimingPath              # max (carry, LUT levels, muxf)
    comb_cells: int
    endpoints: int
    unregistered_dsps: list[str] = field(default_factory=list)
    by_scope: dict[str, TimingPath] = field(default_factory=dict)   # longest path ending in each submodule
    # per end-point group (the end register's name with its numbers as '#': "core.wrep#[#]"), the
    # longest path into it: [LUT levels, carry, muxf, start net]; says how deep each structure is
    groups: dict[str, list] = field(default_factory=dict)

    @property
    def lut_levels(self) -> int:
        return self.critical.lut_levels

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TimingReport:
        def path(p: dict[str, Any]) -> TimingPath:
            return TimingPath(p["lut_levels"], p["carry"], p["muxf"], PathStep(**p["start"]), PathStep(**p["end"]),
                              [PathStep(**s) for s in p["steps"]])
        return cls(path(d["critical"]), path(d["carry_path"]), d["comb_cells"], d["endpoints"],
                   list(d.get("unregistered_dsps", [])),
                   {k: path(v) for k, v in d.get("by_scope", {}).items()}, dict(d.get("groups", {})))


def _unescape(name: str) -> str:
    return name[1:] if name.startswith("\\") else name


class _Netlist:
    """The flat netlist as bit-level arcs: per driven bit, its driver cell and the arcs into it."""

    def __init__(self, module: dict[str, Any]) -> None:
        self.names: dict[int, str] = {}
        ranked: dict[int, tuple[int, int, str]] = {}
        for name, net in module.get("netnames", {}).items():
            name = _unescape(name)
            hidden = int(net.get("hide_name", 0)) or "$" in name
            for i, bit in enumerate(net["bits"]):
                if isinstance(bit, int):
                    label = name if len(net["bits"]) == 1 else f"{name}[{i}]"
                    key = (hidden, len(label), label)
                    if bit not in ranked or key < ranked[bit]:
                        ranked[bit] = key
        self.names = {bit: key[2] for bit, key in ranked.items()}

        # bit -> (cell index, [(input bits, weight)]) for combinationally driven bits
        self.comb: dict[int, tuple[int, list[tuple[list[int], Weight]]]] = {}
        self.starts: dict[int, int] = {}              # bit -> driving boundary cell (-1: top input)
        self.ends: list[tuple[int, int]] = []         # (bit, cell index; -1: top output)
        self.cells: list[tuple[str, str, str]] = []   # (type, name, src)
        self.unregistered_dsps: list[str] = []
        self.cell_out: dict[int, int] = {}            # boundary cell -> its first output bit (names it)
        self._invs: list[tuple[int, list[int], list]] = []
        self._walks: dict[tuple[int, int, int], tuple[dict, dict]] = {}
        for port in module.get("ports", {}).values():
            for bit in port["bits"]:
                if isinstance(bit, int):
                    if port["direction"] == "input":
                        self.starts[bit] = -1
                    else:
                        self.ends.append((bit, -1))
        for cname, cell in module.get("cells", {}).items():
            typ = _unescape(cell["type"])
            idx = len(self.cells)
            src = "|".join(p for p in cell.get("attributes", {}).get("src", "").split("|") if not p.startswith("/"))
            self.cells.append((typ, _unescape(cname), src))
            self._add_cell(idx, typ, cell)
        for idx, ins, outs in self._invs:
            by_lut = len(ins) == 1 and ins[0] in self.comb and self.cells[self.comb[ins[0]][0]][0] in LUTS
            for b in outs:
                if isinstance(b, int):
                    self.comb.setdefault(b, (idx, []))[1].append((ins, NO_WEIGHT if by_lut else (1, 0, 0)))

    def _add_cell(self, idx: int, typ: str, cell: dict[str, Any]) -> None:
        conns: dict[str, list] = cell.get("connections", {})
        dirs: dict[str, str] = cell.get("port_directions", {})
        if not dirs and conns:
            raise FluidError(f"netlist cell {self.cells[idx][1]} ({typ}) has no port directions; "
                             "write the netlist after reading the cell library")
        ins = {p: [b for b in bits if isinstance(b, int)] for p, bits in conns.items() if dirs.get(p) == "input"}
        outs = {p: bits for p, bits in conns.items() if dirs.get(p) == "output"}

        def arc(out_bits: list, in_bits: list[int], w: Weight) -> None:
            for b in out_bits:
                if isinstance(b, int):
                    self.comb.setdefault(b, (idx, []))[1].append((in_bits, w))

        if typ == "INV":                                # weighed once every LUT is known
            self._invs.append((idx, [b for bits in ins.values() for b in bits],
                               [b for bits in outs.values() for b in bits]))
            return
        if typ in LUTS or typ in MUXFS:
            w = (1, 0, 0) if typ in LUTS else (0, 0, 1)
            every = [b for bits in ins.values() for b in bits]
            for bits in outs.values():
                arc(bits, every, w)
            return
        if typ in CARRY_CELLS:
            n = 4 if typ == "CARRY4" else 8
            chain_in = ins.get("CI", []) + ins.get("CYINIT", [])
            for i in range(n):
                upto = [b for p in ("S", "DI") for b in conns.get(p, [])[:i + 1] if isinstance(b, int)]
                extra = ins.get("CI_TOP", []) if i >= 4 else []
                for p in ("O", "CO"):
                    bits = conns.get(p, [])
                    if i < len(bits):
                        arc([bits[i]], chain_in + upto + extra, (0, 1, 0))
            return
        if ASYNC_READ.match(typ):
            addr = [b for p, bits in ins.items() if READ_ADDR.match(p) for b in bits]
            levels = 2 if typ.startswith("RAM128") or typ.startswith("RAM256") or typ.startswith("RAM512") else 1
            for p, bits in outs.items():
                if p == "Q31":                          # the SRL's last stage: a register output
                    self._boundary_out(idx, bits)
                else:
                    arc(bits, addr, (levels, 0, 0))
            for p, bits in ins.items():
                if not READ_ADDR.match(p) and not CLOCKS.match(p):
                    self.ends.extend((b, idx) for b in bits)
            return
        if typ.startswith("DSP48") and str(cell.get("parameters", {}).get("PREG", "1")).strip("0") == "":
            self.unregistered_dsps.append(self.cells[idx][1])
        # every other cell (flip-flops, block RAM, DSP, URAM): a register boundary
        for bits in outs.values():
            self._boundary_out(idx, bits)
        for p, bits in ins.items():
            if not CLOCKS.match(p):
                self.ends.extend((b, idx) for b in bits)

    def _boundary_out(self, idx: int, bits: list) -> None:
        for b in bits:
            if isinstance(b, int):
                self.starts[b] = idx
                self.cell_out.setdefault(idx, b)

    def walk(self, order: tuple[int, int, int]) -> tuple[dict[int, tuple[int, ...]], dict[int, int | None]]:
        """Per bit reached from an end point, the longest arrival maximising the weight components
        in `order` (lexicographically) and the input bit it comes through (None at a start point)."""
        if order in self._walks:
            return self._walks[order]
        arrival: dict[int, tuple[int, ...]] = {}
        pred: dict[int, int | None] = {}

        def key(w: Weight) -> tuple[int, ...]:
            return tuple(w[i] for i in order)

        # iterative depth-first evaluation (netlists are far deeper than Python's recursion limit)
        on_stack: set[int] = set()
        for root, _ in self.ends:
            stack = [root]
            while stack:
                b = stack[-1]
                if b in arrival:
                    stack.pop()
                    continue
                drv = self.comb.get(b)
                if drv is None:
                    arrival[b], pred[b] = key(NO_WEIGHT), None
                    stack.pop()
                    continue
                pending = [i for ins, _ in drv[1] for i in ins if i not in arrival]
                if pending:
                    if b in on_stack or any(i in on_stack for i in pending):
                        raise FluidError(f"combinational loop through {self.names.get(b, b)}")
                    on_stack.add(b)
                    stack.extend(pending)
                    continue
                best: tuple[int, ...] | None = None
                best_in: int | None = None
                for ins, w in drv[1]:
                    starts: list[int | None] = list(ins) if ins else [None]
                    for i in starts:                       # an arc from constants only starts a path
                        cand = key(w) if i is None else tuple(a + c for a, c in zip(arrival[i], key(w)))
                        if best is None or cand > best:
                            best, best_in = cand, i
                arrival[b], pred[b] = best if best is not None else key(NO_WEIGHT), best_in
                on_stack.discard(b)
                stack.pop()
        self._walks[order] = (arrival, pred)
        return arrival, pred

    def path(self, order: tuple[int, int, int], among: list[tuple[int, int]] | None = None) -> TimingPath:
        """The path maximising `order` into any end point, or into those in `among`."""
        if not self.ends:
            raise FluidError("the netlist has no end points")
        arrival, pred = self.walk(order)
        end_bit, end_cell = max(self.ends if among is None else among, key=lambda e: arrival[e[0]])
        chain = [end_bit]
        while pred.get(chain[-1]) is not None:
            chain.append(pred[chain[-1]])
        chain.reverse()
        counts = [0, 0, 0]
        for i, v in zip(order, arrival[end_bit]):
            counts[i] = v
        return TimingPath(counts[0], counts[1], counts[2], start=self.step(chain[0]),
                          end=self.step(end_bit, end_cell), steps=[self.step(b) for b in chain[1:]])

    def step(self, bit: int, cell: int | None = None) -> PathStep:
        """The net `bit` and the cell driving it; with `cell`, the end point: a register or DSP is
        then named after its output (its D net is usually an anonymous ABC net)."""
        if cell is None:
            cell = self.comb[bit][0] if bit in self.comb else self.starts.get(bit, -1)
        elif cell in self.cell_out and self.cells[cell][0].startswith(("FD", "LD", "DSP")):
            bit = self.cell_out[cell]          # memories keep the name of the data/address net they take
        typ, name, src = self.cells[cell] if cell >= 0 else ("port", "top", "")
        return PathStep(self.names.get(bit, f"bit{bit}"), typ, name, src)

    def scope(self, cell: int) -> str:
        """The top-level submodule a cell belongs to after `flatten` ("core", "seq", ...; "top")."""
        if cell < 0:
            return "top"
        name = self.cells[cell][1]
        name = name[len("$flatten\\"):] if name.startswith("$flatten\\") else name
        head, sep, _ = name.partition(".")
        return head.lstrip("\\") if sep and not head.startswith("$") else "top"


def analyse_netlist(netlist: dict[str, Any] | str | Path, top: str | None = None) -> TimingReport:
    """The timing proxy of a flattened Yosys JSON netlist (a dict, or the path of a `write_json` file)."""
    if not isinstance(netlist, dict):
        netlist = json.loads(Path(netlist).read_text())
    modules = netlist.get("modules", {})
    if top is None:
        tops = [n for n, m in modules.items() if int(m.get("attributes", {}).get("top", 0) or 0)]
        top = tops[0] if len(tops) == 1 else None
    if top is None or top not in modules:
        raise FluidError(f"netlist has no top module {top!r}")
    net = _Netlist(modules[top])
    subs = sorted({t for t, _, _ in net.cells if t in modules and not modules[t].get("attributes", {}).get("blackbox")})
    if subs:
        raise FluidError(f"netlist is not flat (instances of {', '.join(subs[:3])}); run `flatten` first")
    carry = net.path((1, 0, 2))
    critical = net.path((0, 1, 2))
    scopes: dict[str, list[tuple[int, int]]] = {}
    for e in net.ends:
        scopes.setdefault(net.scope(e[1]), []).append(e)
    by_scope = {name: net.path((0, 1, 2), ends) for name, ends in sorted(scopes.items())}
    arrival, pred = net.walk((0, 1, 2))
    deepest: dict[str, tuple[tuple[int, ...], int]] = {}
    for bit, cell in net.ends:
        name = re.sub(r"\d+", "#", net.step(bit, cell).net)
        if name not in deepest or arrival[bit] > deepest[name][0]:
            deepest[name] = (arrival[bit], bit)
    groups = {}
    for name, (k, bit) in sorted(deepest.items()):
        first = bit
        while (before := pred.get(first)) is not None:
            first = before
        groups[name] = [*k, net.names.get(first, f"bit{first}")]
    return TimingReport(critical=critical, carry_path=carry, comb_cells=len({c for c, _ in net.comb.values()}),
                        endpoints=len(net.ends), unregistered_dsps=net.unregistered_dsps, by_scope=by_scope,
                        groups=groups)


def main(argv: list[str] | None = None) -> int:
    """python -m fluidnpu.hw.timing NETLIST.json [TOP]: print the proxy's two paths."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m fluidnpu.hw.timing NETLIST.json [TOP]", file=sys.stderr)
        return 2
    try:
        rep = analyse_netlist(args[0], args[1] if len(args) > 1 else None)
    except (FluidError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for label, p in (("critical", rep.critical), ("carry", rep.carry_path)):
        print(f"{label}: {p.summary()}")
        for s in [p.start, *p.steps]:
            print(f"  {s.cell_type:8s} {s.net}  [{s.src}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
