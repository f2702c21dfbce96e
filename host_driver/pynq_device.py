"""PynqDevice: the NPU on a PYNQ image (ZCU104, any board with an official or community PYNQ image).

`pynq` is imported here and nowhere else in fluidnpu, and only when a
PynqDevice is made, so the rest of the toolkit runs without it. The NPU's
register window is a `DefaultIP` subclass bound to the NPU's VLNV
(hw/regmap.py `VLNV`), so `pynq.Overlay` instantiates it for the NPU's block
design cell; buffers come from `pynq.allocate` (physically contiguous, CMA),
and the driver calls their explicit cache syncs (`sync_to_device` after the
host writes, `sync_from_device` before it reads what the NPU wrote: HP ports
are not cache coherent).

Before the overlay is used, `check_hwh` parses the bitstream's .hwh (the
block design's hardware handoff, XML): the NPU cell must be there with the
VLNV's major version this driver speaks, a register range of at least the
4 KiB window, and — when the IP carries a DESIGN_HASH parameter — the design
hash of the bundle. The design hash and CFG_* registers themselves are
checked by NpuDriver on open.

Hard reset: re-download the bitstream (`Overlay.download()`, which
reprograms the PL and so resets the NPU), or a `reset_fn` you give (e.g. a
GPIO or a PS PL-reset pin your block design wires to aresetn).
"""

from __future__ import annotations

import importlib
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.device import Buffer, Device
from fluidnpu.hw.regmap import VERSION_MAJOR, VLNV, WINDOW_BYTES

_VLNV_BASE = VLNV.rpartition(":")[0]           # vendor:library:name


@dataclass(frozen=True)
class HwhCell:
    """An NPU cell found in a .hwh: instance name, VLNV, register base and size, IP parameters."""

    name: str
    vlnv: str
    base: int | None
    size: int | None
    parameters: dict


def _int(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    return int(text, 0)


def parse_hwh(path: str | Path) -> list[HwhCell]:
    """Every cell of the NPU's vendor:library:name in a .hwh, with its s_axi address range."""
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise FluidError(f"cannot read the hardware handoff {path}: {exc}") from None
    ranges: dict[str, tuple[int | None, int | None]] = {}
    for mr in root.iter("MEMRANGE"):
        inst = mr.get("INSTANCE")
        if inst and mr.get("MEMTYPE", "REGISTER") == "REGISTER":
            lo, hi = _int(mr.get("BASEVALUE")), _int(mr.get("HIGHVALUE"))
            ranges.setdefault(inst, (lo, None if lo is None or hi is None else hi - lo + 1))
    cells = []
    for mod in root.iter("MODULE"):
        vlnv = mod.get("VLNV", "")
        if vlnv.rpartition(":")[0] != _VLNV_BASE:
            continue
        name = mod.get("INSTANCE") or mod.get("FULLNAME", "").lstrip("/")
        params = {p.get("NAME"): p.get("VALUE") for p in mod.iter("PARAMETER") if p.get("NAME")}
        base, size = ranges.get(name, (None, None))
        if base is None:
            base = _int(params.get("C_BASEADDR") or params.get("C_S_AXI_BASEADDR"))
            high = _int(params.get("C_HIGHADDR") or params.get("C_S_AXI_HIGHADDR"))
            size = None if base is None or high is None else high - base + 1
        cells.append(HwhCell(name, vlnv, base, size, params))
    return cells


def check_hwh(path: str | Path, bundle: Any = None, name: str | None = None) -> HwhCell:
    """The NPU cell of a .hwh, checked against this driver (VLNV major, window) and `bundle` (hash)."""
    cells = parse_hwh(path)
    if name is not None:
        cells = [c for c in cells if c.name == name]
    if not cells:
        raise FluidError(f"{path}: no fluidnpu NPU (VLNV {_VLNV_BASE}:*) in this block design"
                         + (f" named {name!r}" if name else "") + "; wrong .hwh, or the NPU IP is not in it")
    if len(cells) > 1:
        raise FluidError(f"{path}: several NPU cells ({', '.join(c.name for c in cells)}); pass the one to use")
    cell = cells[0]
    version = cell.vlnv.rpartition(":")[2]
    if version.split(".")[0] != str(VERSION_MAJOR):
        raise FluidError(f"{path}: NPU {cell.name} is IP version {version} ({cell.vlnv}); this driver speaks "
                         f"register map {VERSION_MAJOR}.x ({VLNV})")
    if cell.base is None:
        raise FluidError(f"{path}: NPU {cell.name} has no address in the block design (assign its s_axi "
                         "in the Address Editor)")
    if cell.size is not None and cell.size < WINDOW_BYTES:
        raise FluidError(f"{path}: NPU {cell.name}'s register range is {cell.size} bytes; it needs "
                         f"{WINDOW_BYTES}")
    want_hash = None
    if bundle is not None:
        from fluidnpu.host_driver.driver import bundle_params
        want_hash = bundle_params(bundle).design_hash
    got_hash = cell.parameters.get("DESIGN_HASH")
    if want_hash is not None and got_hash not in (None, ""):
        if int(got_hash, 0) != want_hash:
            from fluidnpu.host_driver.driver import DesignMismatch
            raise DesignMismatch(f"{path}: NPU {cell.name} was built from design hash {int(got_hash, 0):#010x}, "
                                 f"the bundle's is {want_hash:#010x}")
    return cell


_IP_CLASS: dict[int, type] = {}


def npu_ip_class(pynq: Any) -> type:
    """The DefaultIP subclass bound to the NPU's VLNV (made once per pynq module, before an Overlay)."""
    key = id(pynq)
    if key not in _IP_CLASS:
        class FluidNpuIP(pynq.DefaultIP):
            """The fluidnpu NPU's AXI4-Lite register window (docs/register-map.md)."""

            bindto = [VLNV]

            def __init__(self, description: dict) -> None:
                super().__init__(description=description)

        _IP_CLASS[key] = FluidNpuIP
    return _IP_CLASS[key]


class PynqBufferWrap(Buffer):
    """A `pynq.allocate` buffer (uint8) as a Buffer: explicit cache syncs, freebuffer() on free."""

    def __init__(self, pbuf: Any) -> None:
        self._buf = pbuf
        self.nbytes = int(pbuf.nbytes)
        addr = getattr(pbuf, "device_address", None)
        self.phys_addr = int(addr if addr is not None else pbuf.physical_address)

    def _write(self, offset: int, data: bytes) -> None:
        self._buf[offset:offset + len(data)] = np.frombuffer(bytes(data), dtype=np.uint8)

    def _read(self, offset: int, n: int) -> bytes:
        return self._buf[offset:offset + n].tobytes()

    def sync_to_device(self) -> None:
        self._buf.sync_to_device()

    def sync_from_device(self) -> None:
        self._buf.sync_from_device()

    def _free(self) -> None:
        self._buf.freebuffer()


class PynqDevice(Device):
    """The NPU of a loaded PYNQ overlay.

    `PynqDevice("npu.bit", bundle=b)` loads the bitstream (its .hwh beside it
    is checked first), finds the NPU cell by VLNV and maps its registers.
    `overlay=` reuses an Overlay you loaded; `ip_name=` picks a cell when there
    are several; `reset_fn()` is the hard reset (default: re-download).
    """

    name = "pynq"

    def __init__(self, bitfile: str | None = None, *, bundle: Any = None, overlay: Any = None,
                 ip_name: str | None = None, download: bool = True, check: bool = True,
                 reset_fn: Callable[[], None] | None = None) -> None:
        pynq = importlib.import_module("pynq")
        self._pynq = pynq
        ip_cls = npu_ip_class(pynq)      # registered before the Overlay binds drivers
        if overlay is None:
            if bitfile is None:
                raise FluidError("PynqDevice needs a bitstream path or a loaded overlay")
            hwh = Path(bitfile).with_suffix(".hwh")
            if check:
                if not hwh.exists():
                    raise FluidError(f"{hwh} not found beside {bitfile}: PYNQ needs the .hwh the bitstream "
                                     "was built with")
                self.cell = check_hwh(hwh, bundle, ip_name)
                ip_name = ip_name or self.cell.name
            overlay = pynq.Overlay(str(bitfile), download=download)
        self.overlay = overlay
        self.ip_name, self.ip = self._find_ip(overlay, ip_name, ip_cls)
        desc = overlay.ip_dict[self.ip_name]
        if int(desc.get("addr_range", WINDOW_BYTES)) < WINDOW_BYTES:
            raise FluidError(f"overlay cell {self.ip_name} maps {desc.get('addr_range')} bytes; the NPU needs "
                             f"{WINDOW_BYTES}")
        self.mmio = self.ip.mmio
        self._reset_fn = reset_fn
        self._buffers: list[PynqBufferWrap] = []

    @staticmethod
    def _find_ip(overlay: Any, ip_name: str | None, ip_cls: type) -> tuple[str, Any]:
        names = [n for n, d in overlay.ip_dict.items()
                 if str(d.get("type", "")).rpartition(":")[0] == _VLNV_BASE and (ip_name is None or n == ip_name)]
        if not names:
            found = ", ".join(f"{n} ({d.get('type')})" for n, d in overlay.ip_dict.items()) or "nothing"
            raise FluidError(f"the overlay has no fluidnpu NPU (VLNV {VLNV}"
                             + (f", name {ip_name!r}" if ip_name else "") + f"); it has {found}")
        if len(names) > 1:
            raise FluidError(f"the overlay has several NPUs ({', '.join(names)}); pass ip_name")
        name = names[0]
        ip = overlay
        for part in name.split("/"):          # a cell inside a hierarchy is overlay.hier.cell
            ip = getattr(ip, part)
        if not isinstance(ip, ip_cls):
            raise FluidError(f"overlay cell {name} is bound to {type(ip).__name__}, not the fluidnpu driver; "
                             "import fluidnpu.host_driver.pynq_device before loading the Overlay")
        return name, ip

    def read32(self, offset: int) -> int:
        return int(self.mmio.read(offset)) & 0xFFFFFFFF

    def write32(self, offset: int, value: int) -> None:
        self.mmio.write(offset, int(value) & 0xFFFFFFFF)

    def alloc(self, nbytes: int) -> Buffer:
        try:
            pbuf = self._pynq.allocate(shape=(nbytes,), dtype=np.uint8)
        except Exception as exc:  # noqa: BLE001 - pynq raises RuntimeError/MemoryError by version
            raise FluidError(f"pynq.allocate of {nbytes} bytes failed ({exc}); the CMA pool may be too small "
                             "(cma= on the kernel command line)") from None
        buf = PynqBufferWrap(pbuf)
        self._buffers.append(buf)
        return buf

    def reset(self) -> None:
        if self._reset_fn is not None:
            self._reset_fn()
        else:
            self.overlay.download()

    def close(self) -> None:
        for b in self._buffers:
            b.free()
        self._buffers.clear()
