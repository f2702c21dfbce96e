"""The NPU driver: one implementation of the register protocol, over any `Device`.

Everything it writes comes from hw/regmap.py (offsets, fields, FBCB encoding,
error codes) and hw/descriptor.py via host_driver/memory_plan.py (the
descriptor table), never re-typed here. On open it checks that the device is
the NPU the design bundle describes (ID, map version, CFG_* build
parameters, design hash); `load_fbcb` programs the bundle's Fluid Batching
Control Block; `set_bactive`/`exit`/`backfill` track Bactive through
BACTIVE/BEXIT/BINCR; `run_subnet` starts a placed subnet and returns the
cycle counters.

Faults end in one clear exception: `DesignMismatch` (wrong bitstream or
bundle), `NpuTimeout` (the NPU never finished: soft reset, then hard reset,
then the driver restores the FBCB and Bactive), `NpuError` (STATUS.ERROR with
its ErrorCode message), `BufferTooSmall` (host_driver/device.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.device import Buffer, BufferTooSmall, Device
from fluidnpu.host_driver.memory_plan import LayerParams, SubnetImage, plan_subnet, subnet_nbytes
from fluidnpu.hw.regmap import ID_VALUE, REG, VERSION_MAJOR, ErrorCode, NpuParams, fbcb_table, supported_k_codes

_STATUS = REG["STATUS"]
_BUSY = _STATUS.field("BUSY")
_DONE = _STATUS.field("DONE")
_ERROR = _STATUS.field("ERROR")
_CODE = _STATUS.field("ERROR_CODE")
_CTRL = REG["CTRL"]
START = _CTRL.field("START").mask
SOFT_RESET = _CTRL.field("SOFT_RESET").mask
CLEAR_COUNTERS = _CTRL.field("CLEAR_COUNTERS").mask
CFG_REGS = ("CFG_TR", "CFG_TP", "CFG_TC", "CFG_BMAX", "CFG_LAYERS", "CFG_AXI_DW", "CFG_DESIGN_HASH")
COUNTERS = {"busy": "CYC_BUSY", "mac": "CYC_MAC", "dma_stall": "CYC_DMA_STALL", "layers": "CYC_LAYERS"}


class DesignMismatch(FluidError):
    """The device is not the NPU the design bundle describes (another bitstream, .hwh or bundle)."""


class NpuTimeout(FluidError):
    """The NPU did not finish in time; the driver has reset it."""


class NpuError(FluidError):
    """The NPU reported STATUS.ERROR; `.code` is the hw/regmap.py ErrorCode."""

    def __init__(self, code: int, context: str = "") -> None:
        self.code: ErrorCode | int             # a code the register map does not define stays an int
        try:
            self.code = ErrorCode(code)
            text = f"{self.code.name}: {self.code.message}"
        except ValueError:
            self.code = code
            text = f"unknown error code {code}"
        self.context = context
        super().__init__(f"NPU error {text}" + (f" ({context})" if context else ""))

    def __reduce__(self):
        return (NpuError, (int(self.code), self.context))


def describe_status(word: int) -> str:
    parts = [n for n, f in (("BUSY", _BUSY), ("DONE", _DONE), ("ERROR", _ERROR)) if f.get(word)]
    code = _CODE.get(word)
    if code:
        try:
            parts.append(ErrorCode(code).name)
        except ValueError:
            parts.append(f"code {code}")
    return f"{word:#x} ({' '.join(parts) or 'idle'})"


# ---- bundles ----------------------------------------------------------------------------------

def stub_bundle(TR: int, TP: int, TC: int, bmax: int, entries: Sequence[Sequence[Sequence[int]]], *,
                axi_dw: int = 64, timing: Mapping[str, Any] | None = None) -> dict:
    """The part of a design bundle the driver and devices read: design, Bmax, FBCB, AXI width.

    For tests and small engines the DSE would never pick; a real `Bundle`
    (or its JSON dict) works everywhere this does.
    """
    rows = [[[int(br), int(k)] for br, k in row] for row in entries]
    data: dict = {"design": {"TR": TR, "TP": TP, "TC": TC}, "bmax": bmax,
                  "fbcb": {"entries": rows}, "board": {"name": "stub", "hp_width_bits": axi_dw}}
    if timing is not None:
        data["dse"] = {"timing": dict(timing)}
    return data


def random_fbcb(layers: int, bmax: int, TR: int, TP: int, TC: int, seed: int = 0) -> list:
    """A valid random FBCB table (BR <= b, only modes the engine has) for tests and benchmarks."""
    rng = random.Random(seed)
    codes = [int(c) for c in supported_k_codes(TR, TP, TC)]
    return [[[rng.randint(1, b), rng.choice(codes)] for b in range(1, bmax + 1)] for _ in range(layers)]


def _data(bundle: Any) -> Mapping[str, Any]:
    data = getattr(bundle, "data", bundle)
    if not isinstance(data, Mapping):
        raise FluidError(f"expected a design bundle (Bundle or dict), got {type(bundle).__name__}")
    return data


def bundle_params(bundle: Any, axi_dw: int | None = None) -> NpuParams:
    """NpuParams of a Bundle, its dict, or NpuParams itself."""
    if isinstance(bundle, NpuParams):
        return bundle
    try:
        return NpuParams.from_bundle(_data(bundle), axi_dw=axi_dw)
    except (KeyError, TypeError) as exc:
        raise FluidError(f"design bundle lacks {exc} (need design, bmax, fbcb.entries, board.hp_width_bits)") \
            from None


# ---- the driver -------------------------------------------------------------------------------

class NpuDriver:
    """Drives one NPU `device` built from design `bundle` (a Bundle, its JSON dict, or `stub_bundle`).

    `verify=True` checks ID, VERSION and CFG_* against the bundle on open and
    raises DesignMismatch naming every difference; `load=True` programs the
    bundle's FBCB. `axi_dw` overrides the bundle board's HP width (the
    bitstream's m_axi width) when they differ on purpose.
    """

    def __init__(self, device: Device, bundle: Any, *, verify: bool = True, load: bool = True,
                 axi_dw: int | None = None, soft_reset_grace_s: float = 0.05) -> None:
        self.device = device
        self.bundle = bundle
        self.params = bundle_params(bundle, axi_dw)
        self.soft_reset_grace_s = soft_reset_grace_s
        self._bactive: int | None = None
        self._fbcb_loaded = False
        self._fbcb_words: tuple[int, ...] | None = None     # what load_fbcb wrote last (a hard reset restores it)
        self.last_host_s = 0.0     # host-side time of the last run_subnet, device wait excluded
        self.last_wait_s = 0.0
        if verify:
            self.verify()
        if load:
            self.load_fbcb()

    # -- registers
    def reg(self, name: str, value: int | None = None) -> int:
        return self.device.reg(name, value)

    def status(self) -> int:
        return self.device.read32(_STATUS.offset)

    def _raise_if_error(self, context: str) -> None:
        st = self.status()
        if _ERROR.get(st):
            raise NpuError(_CODE.get(st), context)

    # -- checks
    def verify(self) -> None:
        """Refuse a device that is not this bundle's NPU, naming what differs."""
        ident = self.reg("ID")
        if ident != ID_VALUE:
            raise DesignMismatch(f"no fluidnpu NPU in this register window: ID reads {ident:#010x}, expected "
                                 f"{ID_VALUE:#010x} ('FNPU'); wrong base address or bitstream not loaded")
        major = REG["VERSION"].field("MAJOR").get(self.reg("VERSION"))
        if major != VERSION_MAJOR:
            raise DesignMismatch(f"register map version {major}.x on the device, this driver knows "
                                 f"{VERSION_MAJOR}.x; rebuild the bitstream or update fluidnpu")
        want = self.params.cfg_values
        diffs = []
        for name in CFG_REGS:
            got = self.reg(name)
            if got != want[name]:
                fmt = (lambda v: f"{v:#010x}") if name == "CFG_DESIGN_HASH" else str
                diffs.append(f"{name} is {fmt(got)}, the bundle says {fmt(want[name])}")
        if diffs:
            origin = getattr(self.bundle, "origin", None)
            raise DesignMismatch(f"the bitstream does not match the design bundle{' ' + origin if origin else ''}: "
                                 + "; ".join(diffs) + " (rebuild the bitstream from this bundle, or load the "
                                 "bundle it was built from)")

    # -- FBCB and Bactive
    def load_fbcb(self, words: Sequence[int] | None = None) -> None:
        """Write the whole FBCB (default: the bundle's table; all zero for bare NpuParams) through
        FBCB_ADDR/FBCB_DATA."""
        if words is None:
            words = self.params.fbcb or (
                (0,) * self.params.fbcb_depth if isinstance(self.bundle, NpuParams)
                else tuple(fbcb_table(_data(self.bundle))))
        if len(words) != self.params.fbcb_depth:
            raise FluidError(f"FBCB table has {len(words)} entries, the NPU holds L*Bmax = {self.params.fbcb_depth}")
        if _BUSY.get(self.status()):
            raise FluidError("cannot load the FBCB while the NPU is busy")
        self.reg("FBCB_ADDR", 0)
        off = REG["FBCB_DATA"].offset
        for w in words:
            self.device.write32(off, w)
        end = self.reg("FBCB_ADDR")
        if end != len(words):
            self._raise_if_error("loading the FBCB")
            raise FluidError(f"FBCB load stopped at entry {end} of {len(words)}")
        self._fbcb_loaded = True
        self._fbcb_words = tuple(words)

    @property
    def bactive(self) -> int:
        return self.reg("BACTIVE")

    def set_bactive(self, b: int) -> None:
        """BACTIVE = b (1 <= b <= Bmax: checked here; the NPU checks it again at START)."""
        if not 1 <= b <= self.params.bmax:
            raise FluidError(f"Bactive must be in 1..Bmax={self.params.bmax}, got {b}")
        self.reg("BACTIVE", b)
        self._bactive = b

    def exit(self, n: int) -> int:
        """BEXIT: n samples left at an exit; returns the new Bactive (NpuError if refused)."""
        return self._update("BEXIT", n, -1)

    def backfill(self, n: int) -> int:
        """BINCR: n samples merged into the batch; returns the new Bactive (NpuError if refused)."""
        return self._update("BINCR", n, +1)

    def _update(self, name: str, n: int, sign: int) -> int:
        if n < 0:
            raise FluidError(f"{name} takes a sample count >= 0, got {n}")
        before = self.bactive
        self.reg(name, n)
        after = self.bactive
        if after != before + sign * n:
            st = self.status()
            code = _CODE.get(st) if _ERROR.get(st) else ErrorCode.BAD_BACTIVE_UPDATE
            raise NpuError(code, f"{name} {n} with BACTIVE {before}, Bmax {self.params.bmax}")
        self._bactive = after
        return after

    # -- memory
    def place(self, layers: Sequence[LayerParams], bmax: int | None = None) -> SubnetImage:
        """Allocate a device buffer for a subnet, plan it there and upload it (weights, descriptors)."""
        bmax = bmax or self.params.bmax
        buf = self.device.alloc(subnet_nbytes(list(layers), bmax))
        return plan_subnet(list(layers), bmax, buffer=buf)

    def _check_image(self, image: SubnetImage) -> None:
        buf: Buffer | None = image.buffer
        if buf is None:
            raise FluidError("the subnet image is not placed in a device buffer: plan it with "
                             "plan_subnet(..., buffer=device.alloc(subnet_nbytes(...))) or driver.place(...)")
        if buf.freed:
            raise FluidError("the subnet image's buffer was freed")
        if len(image.memory) > buf.nbytes:
            raise BufferTooSmall(f"subnet image of {len(image.memory)} bytes does not fit its "
                                 f"{buf.nbytes}-byte buffer")
        if image.desc_count > self.params.layers:
            raise FluidError(f"subnet of {image.desc_count} layers; the NPU's FBCB holds {self.params.layers}")

    # -- running
    def start(self, image: SubnetImage, b: int | None = None) -> None:
        """The programming sequence of a run, and nothing after it: load the FBCB if it is not,
        BACTIVE (`b` sets it), DESC_BASE/DESC_COUNT, clear IRQ_STATUS and the counters, START.
        `run_subnet` waits for the run; testbenches that interrupt one call this alone."""
        self._check_image(image)
        if not self._fbcb_loaded:
            self.load_fbcb()
        if b is not None:
            self.set_bactive(b)
        dev = self.device
        dev.write32(REG["DESC_BASE"].offset, image.desc_base)
        dev.write32(REG["DESC_COUNT"].offset, image.desc_count)
        dev.write32(REG["IRQ_STATUS"].offset, 0b11)
        dev.write32(_CTRL.offset, CLEAR_COUNTERS)
        dev.write32(_CTRL.offset, START)

    def run_subnet(self, image: SubnetImage, timeout_s: float = 1.0, b: int | None = None) -> dict:
        """START the image's descriptor table at Bactive (`b` sets it first) and wait for DONE.

        Returns the counters {"busy", "mac", "dma_stall", "layers"} (cycles, layers) of this run.
        Raises NpuTimeout (after soft and hard reset), NpuError (STATUS.ERROR) or FluidError.
        """
        t0 = time.perf_counter()
        self.start(image, b)
        dev = self.device
        t1 = time.perf_counter()
        done = dev.wait_done(timeout_s)
        t2 = time.perf_counter()
        if not done:
            self._recover(image, timeout_s)
        st = self.status()
        if _ERROR.get(st):
            raise NpuError(_CODE.get(st), f"subnet at {image.desc_base:#x}, {image.desc_count} layers, "
                                          f"after layer {self.reg('LAYER')}")
        if not _DONE.get(st):
            raise NpuError(ErrorCode.NONE, f"the NPU went idle without DONE, STATUS {describe_status(st)}")
        counters = {k: self.reg(r) for k, r in COUNTERS.items()}
        self.last_wait_s = t2 - t1
        self.last_host_s = (t1 - t0) + (time.perf_counter() - t2)
        return counters

    def _recover(self, image: SubnetImage, timeout_s: float) -> None:
        """Timeout: SOFT_RESET, then a hard reset, restore FBCB and Bactive, raise NpuTimeout."""
        layer = self.reg("LAYER")
        self.device.write32(_CTRL.offset, SOFT_RESET)
        # the device's own wait: a simulator counts the grace in simulated cycles, so a loaded host
        # cannot run it out before the first STATUS read comes back
        soft_ok = self.device.wait_done(self.soft_reset_grace_s)
        self.hard_reset()
        raise NpuTimeout(f"the NPU did not finish the subnet at {image.desc_base:#x} ({image.desc_count} layers, "
                         f"{layer} done) within {timeout_s:g} s; SOFT_RESET "
                         f"{'brought it back to idle' if soft_ok else 'left it BUSY'}, then a hard reset; "
                         "FBCB and Bactive restored, the outputs of this run are invalid")

    def hard_reset(self) -> None:
        """Reset the device, check it is idle, reload the FBCB it held (the table loaded last) and restore Bactive."""
        self.device.reset()
        self._fbcb_loaded = False
        st = self.status()
        if _BUSY.get(st):
            raise NpuTimeout(f"the NPU is still BUSY after a hard reset (STATUS {describe_status(st)}); "
                             "reload the bitstream")
        self.load_fbcb(self._fbcb_words)
        if self._bactive is not None:
            self.reg("BACTIVE", self._bactive)

    def counters(self) -> dict:
        return {k: self.reg(r) for k, r in COUNTERS.items()}

    def close(self) -> None:
        self.device.close()

    def __enter__(self) -> NpuDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
