"""Board catalog: built-in board files and validation of user board files.

A board file is data a user can copy for their own board (see boards/zc706.json):
every figure is {"value": ..., "source": "..."} so its provenance stays with it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.output import read_json
from fluidnpu.schema import check

BOARD_DIR = Path(__file__).resolve().parent
NPU_AXI_PORTS_MAX = 4
"""The NPU RTL has one AXI master per HP port, at most this many (hw/regmap.py NpuParams.axi_ports)."""
FORMAT = "fluidnpu-board"
VERSION = 1


def _fig(kind: str, minimum: float, maximum: float, exclusive: bool = False) -> dict[str, Any]:
    """A board figure: {"value": <kind in [minimum, maximum]>, "source": "..."}. The upper bounds are
    a few times the largest parts Xilinx sells (a Versal Premium has ~14,000 DSPs, ~5 M LUTs), so a
    typo such as 10^12 DSPs is refused rather than priced as a board nothing fills."""
    word = "an integer" if kind == "integer" else "a number"
    rng = f"{'above' if exclusive else 'from'} {minimum:g} to {maximum:g}"
    bound = {"exclusiveMinimum": minimum} if exclusive else {"minimum": minimum}
    return {"type": "object", "required": ["value"], "form": f'{{"value": <{word} {rng}>, "source": "<where from>"}}',
            "properties": {"value": {"type": kind, **bound, "maximum": maximum, "form": f"{word} {rng}"},
                           "source": {"type": "string"}}}


_SHARE = {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "form": "a share above 0 up to 1, e.g. 0.8"}

BOARD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["format", "version", "name", "part", "resources", "clock_mhz", "axi_hp", "ddr"],
    "form": "a fluidnpu board file (copy boards/zc706.json; docs/boards.md)",
    "properties": {
        "format": {"const": FORMAT, "form": f'"{FORMAT}"'},
        "version": {"const": VERSION, "form": str(VERSION)},
        "name": {"type": "string", "minLength": 1},
        "part": {"type": "string", "minLength": 1},
        "resources": {
            "type": "object",
            "required": ["dsp", "bram36", "uram", "lut", "ff"],
            "form": '{"dsp": {...}, "bram36": {...}, "uram": {...}, "lut": {...}, "ff": {...}}',
            "properties": {
                "dsp": _fig("integer", 1, 100_000), "bram36": _fig("integer", 0, 100_000),
                "uram": _fig("integer", 0, 100_000), "lut": _fig("integer", 1, 50_000_000),
                "ff": _fig("integer", 1, 100_000_000),
            },
        },
        "clock_mhz": _fig("number", 0, 2000, exclusive=True),
        "max_clock_mhz": _fig("number", 0, 2000, exclusive=True),
        "axi_hp": {"type": "object", "required": ["ports", "width_bits"],
                   "form": '{"ports": {"value": <1 to 64>}, "width_bits": {"value": <32, 64, 128, 256 or 512>}}',
                   "properties": {"ports": _fig("integer", 1, 64), "width_bits": {
                       "type": "object", "required": ["value"], "form": '{"value": <32, 64, 128, 256 or 512>}',
                       "properties": {"value": {"enum": [32, 64, 128, 256, 512], "form": "32, 64, 128, 256 or 512"}}}}},
        "ceilings": {"type": "object", "additionalProperties": False,
                     "form": '{"lut": 0.8, ...} (shares of dsp, bram36, uram, lut, ff)',
                     "properties": {k: _SHARE for k in ("dsp", "bram36", "uram", "lut", "ff")}},
        "ddr": {"type": "object", "required": ["width_bits", "mega_transfers"],
                "form": '{"width_bits": {"value": <bits>}, "mega_transfers": {"value": <MT/s>}}',
                "properties": {"width_bits": _fig("integer", 8, 8192),
                               "mega_transfers": _fig("number", 0, 100_000, exclusive=True),
                               "efficiency": {"type": "object", "required": ["value"], "form": '{"value": <share>}',
                                              "properties": {"value": _SHARE}}}},
    },
}


RESOURCES = ("dsp", "bram36", "uram", "lut", "ff")


@dataclass(frozen=True)
class Ceilings:
    """The largest share of each resource a design may use.

    Logic that fills 90-98 % of the LUTs does not route or close timing in practice; the defaults
    leave a fifth of the LUTs and FFs to the router and the board's own logic (PS interconnect,
    resets), and let the hard blocks (DSP, BRAM, URAM) fill completely, as the paper's designs do.
    """

    dsp: float = 1.0
    bram36: float = 1.0
    uram: float = 1.0
    lut: float = 0.8
    ff: float = 0.8

    def __post_init__(self) -> None:
        for name in RESOURCES:
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise FluidError(f"{name} ceiling must be in (0, 1], got {value:g}")

    def limit(self, name: str, available: int) -> int:
        """How many of a board's `available` units of resource `name` a design may use."""
        return int(available * getattr(self, name) + 1e-9)


@dataclass(frozen=True)
class Board:
    """The figures of a board that the models need."""

    name: str
    part: str
    dsp: int
    bram36: int
    uram: int
    lut: int
    ff: int
    clock_mhz: float
    max_clock_mhz: float
    hp_ports: int
    hp_width_bits: int
    ddr_width_bits: int
    ddr_mega_transfers: float
    ddr_efficiency: float
    family: str = ""
    title: str = ""
    ceilings: Ceilings = Ceilings()

    def limit(self, name: str) -> int:
        """Units of resource `name` (dsp, bram36, uram, lut, ff) a design may use: the board's count
        under its ceiling."""
        return self.ceilings.limit(name, getattr(self, name))

    def with_ceilings(self, **shares: float | None) -> Board:
        """The board with some ceilings replaced (None keeps the board's own)."""
        given = {k: v for k, v in shares.items() if v is not None}
        unknown = set(given) - set(RESOURCES)
        if unknown:
            raise FluidError(f"unknown resource ceiling(s): {', '.join(sorted(unknown))}")
        return replace(self, ceilings=replace(self.ceilings, **given))

    def bandwidth_bytes_per_s(self, clock_mhz: float | None = None, ports: int | None = None) -> float:
        """Sustained off-chip bandwidth seen from the PL: the lesser of `ports` AXI HP ports
        (default: all the board's) at the PL clock and the DDR's sustained rate."""
        f = (clock_mhz or self.clock_mhz) * 1e6
        hp = (ports or self.hp_ports) * self.hp_width_bits / 8 * f
        ddr = self.ddr_width_bits / 8 * self.ddr_mega_transfers * 1e6 * self.ddr_efficiency
        return min(hp, ddr)

    def bytes_per_cycle(self, clock_mhz: float | None = None, ports: int | None = None) -> float:
        f = (clock_mhz or self.clock_mhz) * 1e6
        return self.bandwidth_bytes_per_s(clock_mhz, ports) / f

    @property
    def npu_axi_ports(self) -> int:
        """Most AXI masters an NPU for this board has: one per HP port, at most NPU_AXI_PORTS_MAX
        (the DSE may use fewer, `port_choices`)."""
        return min(self.hp_ports, NPU_AXI_PORTS_MAX)

    def port_choices(self) -> list[int]:
        """Every AXI master count P an NPU for this board may be built with, fewest first: each
        port costs LUTs (dse/resource_model.py control_logic) and buys bandwidth up to the DDR's."""
        return list(range(1, self.npu_axi_ports + 1))

    def check_ports(self, ports: int) -> None:
        """Refuse an AXI master count the board cannot wire (1 ..= npu_axi_ports)."""
        if ports not in self.port_choices():
            raise FluidError(f"AXI ports P = {ports}: board {self.name} gives the NPU 1..{self.npu_axi_ports}")

    def bus(self, clock_mhz: float | None = None, ports: int | None = None):
        """The DMA's view of memory through `ports` AXI masters (default: npu_axi_ports): their
        bandwidth (DDR-capped), in beats of one port."""
        from fluidnpu.dse.perf_model import Bus

        n = ports or self.npu_axi_ports
        return Bus.of(self.bytes_per_cycle(clock_mhz, n), self.hp_width_bits / 8, ports=n)

    def check_clock(self, clock_mhz: float) -> None:
        if not 0 < clock_mhz <= self.max_clock_mhz:
            raise FluidError(f"board {self.name}: clock {clock_mhz:g} MHz is outside (0, {self.max_clock_mhz:g}] MHz")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Board:
        d = dict(d)
        d["ceilings"] = Ceilings(**d.get("ceilings", {}))   # bundles written before ceilings: defaults
        return cls(**d)


def board_from_data(data: Any, what: str) -> Board:
    """Validate a board file's parsed JSON and build a Board."""
    check(BOARD_SCHEMA, data, what)
    r = data["resources"]
    clock = float(data["clock_mhz"]["value"])
    max_clock = float(data.get("max_clock_mhz", {}).get("value", clock))
    if clock > max_clock:
        raise FluidError(f"{what}: clock_mhz {clock:g} exceeds max_clock_mhz {max_clock:g}")
    return Board(
        name=data["name"], part=data["part"], family=data.get("family", ""), title=data.get("title", ""),
        dsp=r["dsp"]["value"], bram36=r["bram36"]["value"], uram=r["uram"]["value"],
        lut=r["lut"]["value"], ff=r["ff"]["value"], clock_mhz=clock, max_clock_mhz=max_clock,
        hp_ports=data["axi_hp"]["ports"]["value"], hp_width_bits=data["axi_hp"]["width_bits"]["value"],
        ddr_width_bits=data["ddr"]["width_bits"]["value"],
        ddr_mega_transfers=float(data["ddr"]["mega_transfers"]["value"]),
        ddr_efficiency=float(data["ddr"].get("efficiency", {}).get("value", 1.0)),
        ceilings=Ceilings(**data.get("ceilings", {})),
    )


def builtin_boards() -> list[str]:
    return sorted(p.stem for p in BOARD_DIR.glob("*.json"))


def load_board(name_or_path: str) -> Board:
    """A built-in board by name (zc706, zcu104) or a user board file by path."""
    key = name_or_path.lower()
    if key in builtin_boards():
        path = BOARD_DIR / f"{key}.json"
    else:
        path = Path(name_or_path)
        if not path.suffix == ".json" and not path.exists():
            raise FluidError(f"unknown board {name_or_path!r}; built-in boards: {', '.join(builtin_boards())} "
                             "(or a board .json file)")
    return board_from_data(read_json(path, "board file"), f"board file {path}")


def board_sources(name: str) -> dict[str, str]:
    """Each figure of a built-in board with its source, for `fluidnpu boards`."""
    data = json.loads((BOARD_DIR / f"{name}.json").read_text())
    out: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            if "value" in node and "source" in node:
                out[prefix] = f"{node['value']}  [{node['source']}]"
                return
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else k)

    walk(data, "")
    return out
