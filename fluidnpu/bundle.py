"""The design bundle: one versioned JSON file that every later stage reads.

It holds the board, clock, design point, Bmax, the workload with its exits,
the Fluid Batching Control Block table, the latency tables the scheduler uses,
and the resource and performance estimates. `load_bundle` schema-checks and
cross-checks it, and compares its integrity record (a digest of every field the
DSE computed), so a corrupt or hand-edited file is refused with one line that
names the field: the FBCB, the latency tables and the resources are computed
for one design, and editing the design (or any of them) by hand breaks that.
A user who wants a specific design asks for it: `fluidnpu dse --design TR,TP,TC`.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fluidnpu import __version__
from fluidnpu.boards.catalog import Board
from fluidnpu.dse.perf_model import EngineTiming
from fluidnpu.errors import FluidError
from fluidnpu.hw.regmap import K_CODES, check_banks, design_banks, design_input_buffer, design_ports, fbcb_entry_bits
from fluidnpu.output import read_json, write_text
from fluidnpu.schema import check
from fluidnpu.workload import Workload

FORMAT = "fluidnpu-design"
VERSION = 2  # 2: the integrity record; version 1 bundles are refused with how to regenerate them
INTEGRITY_ALGORITHM = "sha256-64 of each field's canonical JSON"
_NOT_COVERED = ("format", "version", "generator", "integrity")

_INT = {"type": "integer"}
_POS = {"type": "integer", "minimum": 1}
_NUM = {"type": "number"}


def _matrix(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1, "items": item}}


BUNDLE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["format", "version", "generator", "board", "clock_mhz", "design", "bmax", "dse", "workload",
                 "fbcb", "latency", "resources", "performance", "integrity"],
    "properties": {
        "format": {"const": FORMAT},
        "version": {"const": VERSION},
        "generator": {"type": "string"},
        "board": {"type": "object", "required": ["name", "part", "dsp", "bram36", "uram", "lut", "ff",
                                                 "clock_mhz", "max_clock_mhz", "hp_ports", "hp_width_bits",
                                                 "ddr_width_bits", "ddr_mega_transfers", "ddr_efficiency"]},
        "clock_mhz": {"type": "number", "exclusiveMinimum": 0},
        "design": {"type": "object", "required": ["TR", "TP", "TC"],
                   "properties": {"TR": _POS, "TP": _POS, "TC": _POS, "NB": _POS, "ports": _POS,
                                  "input_buffer": {"type": "integer", "minimum": 0}}},
        "bmax": _POS,
        "dse": {"type": "object", "required": ["batching", "stackable", "weights", "timing"],
                "properties": {"batching": {"enum": ["fluid", "r", "p", "fc"]}, "stackable": {"type": "boolean"},
                               "weights": {"type": "array", "items": _NUM},
                               "timing": {"type": "object",
                                          "required": ["word_bytes", "fill_base", "layer_overhead"]}}},
        "workload": {"type": "object", "required": ["name", "backbone", "exits"]},
        "fbcb": {"type": "object", "required": ["bits_per_entry", "entries", "serial"],
                 "properties": {"bits_per_entry": _POS,
                                # [BR, k code] or [BR, k code, buffered (0/1)]
                                "entries": _matrix({"type": "array", "minItems": 2, "maxItems": 3, "items": _INT}),
                                "serial": _matrix({"type": "boolean"})}},
        "latency": {"type": "object", "required": ["layer_cycles", "segment_cycles", "segment_seconds"],
                    "properties": {"layer_cycles": _matrix(_POS), "segment_cycles": _matrix(_POS),
                                   "segment_seconds": _matrix({"type": "number", "exclusiveMinimum": 0})}},
        "resources": {"type": "object", "required": ["dsp", "bram36", "uram", "lut", "ff"]},
        "performance": {"type": "object", "required": ["gops", "peak_gops", "total_cycles"],
                        "properties": {"gops": {"type": "array", "items": _NUM}}},
        "integrity": {"type": "object", "required": ["algorithm", "fields"],
                      "properties": {"algorithm": {"const": INTEGRITY_ALGORITHM},
                                     "fields": {"type": "object", "additionalProperties": {"type": "string"}}}},
    },
}


def _digest(value: Any) -> str:
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def field_digests(data: dict[str, Any]) -> dict[str, str]:
    """The integrity record's digests: one per second-level field ('design.TP', 'fbcb.entries', ...)
    and per top-level scalar ('bmax', 'clock_mhz'), so a mismatch names the field that was edited."""
    out: dict[str, str] = {}
    for key, value in data.items():
        if key in _NOT_COVERED:
            continue
        if isinstance(value, dict):
            out.update({f"{key}.{sub}": _digest(v) for sub, v in value.items()})
        else:
            out[key] = _digest(value)
    return out


def seal(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with its integrity record (computed over what the DSE wrote)."""
    return data | {"integrity": {"algorithm": INTEGRITY_ALGORITHM, "fields": field_digests(data)}}


def check_integrity(data: dict[str, Any], what: str) -> None:
    """Refuse, in one line naming the field, a bundle edited after the DSE wrote it."""
    want = data["integrity"]["fields"]
    have = field_digests(data)
    for name in [*want, *(k for k in have if k not in want)]:
        if want.get(name) != have.get(name):
            change = ("was removed" if name not in have else "was added" if name not in want
                      else "was changed")
            d = data.get("design", {})
            given = ",".join(str(d.get(k, k)) for k in ("TR", "TP", "TC"))
            raise FluidError(f"{what}: {name} {change} after the DSE computed this bundle (its integrity digest "
                             "disagrees), so its FBCB, latency tables and resources do not belong to it; for a "
                             f"consistent bundle of a given design run `fluidnpu dse --model M --board B "
                             f"--design {given} -o FILE`")


@dataclass(frozen=True)
class FbcbEntry:
    """One Fluid Batching Control Block entry: how a layer runs at a batch size."""

    BR: int
    k_code: int
    serial: bool = False
    buffered: bool = False      # input runs from the block input buffer (design.input_buffer)

    @property
    def k(self) -> float:
        return K_CODES[self.k_code]

    def BP(self, b: int) -> int:
        """Sample groups appended along P: ceil(b / BR)."""
        return -(-b // self.BR)


class Bundle:
    """A loaded, checked design bundle with typed accessors over its JSON."""

    def __init__(self, data: dict[str, Any], origin: str = "<memory>") -> None:
        self.data = data
        self.origin = origin
        self.board = Board.from_dict(data["board"])
        self.workload = Workload.from_dict(data["workload"])
        self._cross_check()

    @property
    def clock_mhz(self) -> float:
        return float(self.data["clock_mhz"])

    @property
    def design(self) -> tuple[int, int, int]:
        d = self.data["design"]
        return d["TR"], d["TP"], d["TC"]

    @property
    def bmax(self) -> int:
        return int(self.data["bmax"])

    @property
    def banks(self) -> int:
        """NB, the engine's input banks (`design.NB`; older bundles: the most their batching used)."""
        return design_banks(self.data)

    @property
    def ports(self) -> int:
        """P, the NPU's AXI masters (`design.ports`; older bundles: every HP port of the board)."""
        return design_ports(self.data)

    @property
    def timing(self) -> EngineTiming:
        return EngineTiming(**self.data["dse"]["timing"])

    def fbcb(self, layer: int, b: int) -> FbcbEntry:
        """FBCB entry for layer index `layer` (execution order) at active batch size b."""
        entry = self.data["fbcb"]["entries"][layer][b - 1]
        return FbcbEntry(entry[0], entry[1], self.data["fbcb"]["serial"][layer][b - 1], bool(entry[2:3] == [1]))

    @property
    def input_buffer(self) -> int:
        """Words a half of the NPU's block input buffer (`design.input_buffer`; 0: none built)."""
        return design_input_buffer(self.data)

    def layer_cycles(self, layer: int, b: int) -> int:
        return int(self.data["latency"]["layer_cycles"][layer][b - 1])

    def segment_seconds(self, segment: int, b: int) -> float:
        """Latency of exit segment `segment` at batch b (the scheduler's Nexits x Bmax table)."""
        return float(self.data["latency"]["segment_seconds"][segment][b - 1])

    def latency_table(self) -> list[list[float]]:
        return [list(map(float, row)) for row in self.data["latency"]["segment_seconds"]]

    def save(self, path: str | Path) -> None:
        write_text(path, json.dumps(self.data, indent=1) + "\n", "design bundle")

    def _cross_check(self) -> None:
        d = self.data
        what = f"design bundle {self.origin}"
        n_layers = len(self.workload.layers())
        n_exits = len(self.workload.exits)
        bmax = self.bmax
        tables = {
            "fbcb.entries": (d["fbcb"]["entries"], n_layers),
            "fbcb.serial": (d["fbcb"]["serial"], n_layers),
            "latency.layer_cycles": (d["latency"]["layer_cycles"], n_layers),
            "latency.segment_cycles": (d["latency"]["segment_cycles"], n_exits),
            "latency.segment_seconds": (d["latency"]["segment_seconds"], n_exits),
        }
        for name, (table, rows) in tables.items():
            if len(table) != rows or any(len(r) != bmax for r in table):
                raise FluidError(f"{what}: {name} must be {rows} x {bmax} (layers/exits x Bmax)")
        buffer = self.input_buffer > 0
        for li, row in enumerate(d["fbcb"]["entries"]):
            for b, (br, k, *buffered) in enumerate(row, start=1):
                if not 1 <= br <= b or k not in K_CODES or buffered not in ([], [0], [1]):
                    raise FluidError(f"{what}: FBCB entry layer {li}, b={b} is out of range (BR={br}, k code={k}"
                                     + (f", buffered={buffered[0]})" if buffered else ")"))
                if buffered == [1] and not buffer:
                    raise FluidError(f"{what}: FBCB entry layer {li}, b={b} is buffered but design.input_buffer "
                                     "builds no block input buffer")
        if d["fbcb"]["bits_per_entry"] != fbcb_entry_bits(bmax, buffer):
            raise FluidError(f"{what}: fbcb.bits_per_entry must be {fbcb_entry_bits(bmax, buffer)} for Bmax={bmax}"
                             + (" with a block input buffer" if buffer else ""))
        if len(d["performance"]["gops"]) != bmax or len(d["dse"]["weights"]) != bmax:
            raise FluidError(f"{what}: performance.gops and dse.weights need {bmax} entries")
        try:
            check_banks(self.banks, bmax)
        except FluidError as e:
            raise FluidError(f"{what}: design.NB: {e}") from None
        try:
            self.board.check_ports(self.ports)
        except FluidError as e:
            raise FluidError(f"{what}: design.ports: {e}") from None
        TR, TP, TC = self.design
        if TP * TC > self.board.dsp:
            raise FluidError(f"{what}: TP*TC = {TP * TC} exceeds the board's {self.board.dsp} DSPs")
        for seg, row in enumerate(d["latency"]["segment_seconds"]):
            for b, s in enumerate(row, start=1):
                expect = d["latency"]["segment_cycles"][seg][b - 1] / (self.clock_mhz * 1e6)
                if not math.isclose(s, expect, rel_tol=1e-6):
                    raise FluidError(f"{what}: segment_seconds[{seg}][{b - 1}] disagrees with segment_cycles/clock")


def bundle_from_result(result: Any) -> Bundle:
    """Build the bundle of a DSE result (fluidnpu.dse.search.DSEResult)."""
    opts = result.options
    clock = result.clock_mhz
    seg_cycles = result.segment_cycles()
    data = {
        "format": FORMAT,
        "version": VERSION,
        "generator": f"fluidnpu {__version__}",
        "board": result.board.to_dict(),
        "clock_mhz": clock,
        "design": {"TR": result.TR, "TP": result.TP, "TC": result.TC, "NB": result.NB, "ports": result.ports,
                   **({"input_buffer": result.input_buffer} if result.input_buffer else {})},
        "bmax": opts.bmax,
        "dse": {
            "batching": opts.batching, "stackable": opts.stackable,
            "weights": [float(w) for w in opts.batch_weights()], "fixed_batch": opts.fixed_batch,
            "min_dsp": opts.min_dsp, "designs_evaluated": result.n_designs, "designs_scored": result.n_scored,
            "score_gops": result.score, "seconds": result.seconds,
            "timing": asdict(opts.timing), "runners_up": result.runners_up,
        },
        "workload": result.workload.to_dict(),
        "fbcb": {
            "bits_per_entry": fbcb_entry_bits(opts.bmax, result.input_buffer > 0),
            "k_codes": {str(c): k for c, k in K_CODES.items()},
            "entries": [[[br, k, 1] if bf else [br, k] for br, k, bf in zip(brs, ks, bfs or [False] * len(brs))]
                        for brs, ks, bfs in zip(result.plan.BR, result.plan.k_code,
                                                result.plan.buffered or [[]] * len(result.plan.BR))],
            "serial": result.plan.serial,
        },
        "latency": {
            "layer_cycles": result.plan.cycles,
            "segment_cycles": seg_cycles,
            "segment_seconds": [[c / (clock * 1e6) for c in row] for row in seg_cycles],
        },
        "resources": result.resources.to_dict(),
        "utilisation": result.resources.utilisation(result.board),
        "performance": {
            "gops": result.gops, "peak_gops": result.peak_gops, "total_cycles": result.total_cycles,
            "utilisation": [g / result.peak_gops for g in result.gops],
        },
    }
    if getattr(result, "timing_proxy", None) is not None:
        data["timing_proxy"] = result.timing_proxy.to_dict()
    return Bundle(seal(data))


def design_summary(bundle: Bundle) -> dict[str, Any]:
    """The figures people look at, as a JSON-able dict (`fluidnpu dse/show --json`)."""
    d = bundle.data
    TR, TP, TC = bundle.design
    return {
        "model": bundle.workload.name, "board": bundle.board.name, "clock_mhz": bundle.clock_mhz,
        "bmax": bundle.bmax, "batching": d["dse"]["batching"], "stackable": d["dse"]["stackable"],
        "design": {"TR": TR, "TP": TP, "TC": TC, "NB": bundle.banks, "ports": bundle.ports,
                   "input_buffer": bundle.input_buffer},
        "searched": d["dse"].get("score_gops") is not None,
        "designs_evaluated": d["dse"].get("designs_evaluated"), "designs_scored": d["dse"].get("designs_scored"),
        "dse_seconds": d["dse"].get("seconds"), "min_dsp": d["dse"].get("min_dsp", 0.0),
        "resources": d["resources"], "utilisation": d.get("utilisation", {}),
        "gops": d["performance"]["gops"], "peak_gops": d["performance"]["peak_gops"],
        "segment_latency_ms": [[s * 1e3 for s in row] for row in bundle.latency_table()],
        "exits": [{"name": e.name, "position": e.position, "rate": e.rate} for e in bundle.workload.exits],
        "timing_proxy": d.get("timing_proxy"),
        "stem": stem_summary(bundle.workload),
    }


def stem_summary(workload: Any) -> dict[str, Any] | None:
    """How the first layer is fed where it is folded (fluidnpu/lowering.py): the network's layer and the NPU's."""
    if workload.stem is None:
        return None
    s, f = workload.stem, workload.backbone[0]
    return {"layer": s.name, "network": {"kernel": list(s.kernel), "stride": list(s.stride), "in_ch": s.in_ch},
            "npu": {"kernel": list(f.kernel), "stride": list(f.stride), "in_ch": f.in_ch, "in_hw": list(f.in_hw)}}


def load_bundle(path: str | Path) -> Bundle:
    """Read and check a design bundle; any problem is a one-line FluidError."""
    p = Path(path)
    data = read_json(p, "design bundle")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise FluidError(f"design bundle {p}: not a fluidnpu design bundle (format {found!r}, expected {FORMAT!r})")
    if data.get("version") == 1:
        raise FluidError(f"design bundle {p}: version 1 predates the integrity record of version {VERSION}; "
                         "regenerate it with `fluidnpu dse ... -o FILE` (add --design TR,TP,TC to keep its design)")
    if data.get("version") != VERSION:
        raise FluidError(f"design bundle {p}: version {data.get('version')!r} is not supported (this is v{VERSION})")
    check(BUNDLE_SCHEMA, data, f"design bundle {p}")
    try:
        bundle = Bundle(data, origin=str(p))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        if isinstance(exc, FluidError):
            raise
        raise FluidError(f"design bundle {p}: malformed ({type(exc).__name__}: {exc})") from None
    check_integrity(data, f"design bundle {p}")
    return bundle
