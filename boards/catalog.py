"""Board catalog: built-in board files and validation of user board files.

A board file is data a user can copy for their own board (see boards/zc706.json):
every figure is {"value": ..., "source": "..."} so its provenance stays with it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
import json
from pathlib import Path
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.schema import check

BOARD_DIR = Path(__file__).resolve().parent
NPU_AXI_PORTS_MAX = 4
"""The NPU RTL has one AXI master per HP port, at most this many (hw/regmap.py NpuParams.axi_ports)."""
FORMAT = "fluidnpu-board"
VERSION = 1


def _fig(kind: str, minimum: float, exclusive: bool = False) -> dict[str, Any]:
    bound = {"exclusiveMinimum": minimum} if exclusive else {"minimum": minimum}
    return {"type": "object", "required": ["value"],
            "properties": {"value": {"type": kind, **bound}, "source": {"type": "string"}}}


BOARD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["format", "version", "name", "part", "resources", "clock_mhz", "axi_hp", "ddr"],
    "properties": {
        "format": {"const": FORMAT},
        "version": {"const": VERSION},
        "name": {"type": "string", "minLength": 1},
        "part": {"type": "string", "minLength": 1},
        "resources": {
            "type": "object",
            "required": ["dsp", "bram36", "uram", "lut", "ff"],
            "properties": {
                "dsp": _fig("integer", 1), "bram36": _fig("integer", 0), "uram": _fig("integer", 0),
                "lut": _fig("integer", 1), "ff": _fig("integer", 1),
            },
        },
        "clock_mhz": _fig("number", 0, exclusive=True),
        "max_clock_mhz": _fig("number", 0, exclusive=True),
        "axi_hp": {"type": "object", "required": ["ports", "width_bits"],
                   "properties": {"ports": _fig("integer", 1), "width_bits": {
                       "type": "object", "required": ["value"],
                       "properties": {"value": {"enum": [32, 64, 128, 256, 512]}}}}},
        "ddr": {"type": "object", "required": ["width_bits", "mega_transfers"],
                "properties": {"width_bits": _fig("integer", 8), "mega_transfers": _fig("number", 0, exclusive=True),
                               "efficiency": {"type": "object", "required": ["value"], "properties": {
                                   "value": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}}}}},
    },
}


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

    def bandwidth_bytes_per_s(self, clock_mhz: float | None = None) -> float:
        """Sustained off-chip bandwidth seen from the PL: the lesser of the AXI HP
        ports at the PL clock and the DDR's sustained rate."""
        f = (clock_mhz or self.clock_mhz) * 1e6
        hp = self.hp_ports * self.hp_width_bits / 8 * f
        ddr = self.ddr_width_bits / 8 * self.ddr_mega_transfers * 1e6 * self.ddr_efficiency
        return min(hp, ddr)

    def bytes_per_cycle(self, clock_mhz: float | None = None) -> float:
        f = (clock_mhz or self.clock_mhz) * 1e6
        return self.bandwidth_bytes_per_s(clock_mhz) / f

    @property
    def npu_axi_ports(self) -> int:
        """AXI masters the NPU built for this board has: one per HP port, at most NPU_AXI_PORTS_MAX."""
        return min(self.hp_ports, NPU_AXI_PORTS_MAX)

    def bus(self, clock_mhz: float | None = None):
        """The DMA's view of memory: all HP ports' bandwidth (DDR-capped), in beats of one port."""
        from fluidnpu.dse.perf_model import Bus

        return Bus.of(self.bytes_per_cycle(clock_mhz), self.hp_width_bits / 8, ports=self.npu_axi_ports)

    def check_clock(self, clock_mhz: float) -> None:
        if not 0 < clock_mhz <= self.max_clock_mhz:
            raise FluidError(f"board {self.name}: clock {clock_mhz:g} MHz is outside (0, {self.max_clock_mhz:g}] MHz")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Board":
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
        if not path.is_file():
            raise FluidError(f"board file {name_or_path} does not exist")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FluidError(f"board file {path}: not valid JSON ({exc})") from None
    return board_from_data(data, f"board file {path}")


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
