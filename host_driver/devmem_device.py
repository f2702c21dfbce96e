"""DevMemDevice: the NPU on a Zynq board without PYNQ (ZC706 has no official PYNQ image).

Registers: a Linux UIO device (`uio="/dev/uio0"`, the window size from
/sys/class/uio/uio0/maps/map0/size; the device tree binds the NPU's s_axi to
`generic-uio`) or /dev/mem at the NPU's physical base (`reg_base=0x43C00000`,
as the block design's Address Editor assigned it). Accesses are single
aligned 32-bit loads/stores through a numpy view of the mapping.

Memory the NPU reaches (physically contiguous):

* u-dma-buf (`udmabuf="udmabuf0"`, the default): the kernel module's
  /dev/udmabuf0 is mapped, its bus address and size are read from
  /sys/class/u-dma-buf/udmabuf0/{phys_addr,size}. Opened with O_SYNC (the
  default, `cached=False`) the CPU mapping is uncached and the syncs are
  no-ops; with `cached=True` the driver's syncs write u-dma-buf's
  sync_offset/sync_size/sync_direction and sync_for_device/sync_for_cpu.
* a reserved / CMA region (`dma_region=(phys_addr, size)`, e.g. a
  `reserved-memory` node in the device tree) mapped through /dev/mem (uncached).

Hard reset (`reset=`): "zynq7" pulses FCLK_RESET0_N through the Zynq-7000
SLCR (FPGA_RST_CTRL at 0xF8000240, unlocked with 0xDF0D, relocked with
0x767B; UG585) — wire the NPU's aresetn from FCLK_RESET0_N (through a
Processor System Reset) for it to reach the NPU; a callable is called
instead; None: SOFT_RESET only, and a wedged NPU stays wedged.

Every path (`mem_path`, `sysfs_root`, `dev_root`) can be redirected, which is
how the tests run this class against temp files.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.device import Buffer, BumpAllocator, BytesBuffer, Device
from fluidnpu.hw.regmap import REG, WINDOW_BYTES

PAGE = mmap.PAGESIZE
SLCR_BASE = 0xF800_0000
SLCR_LOCK, SLCR_UNLOCK, FPGA_RST_CTRL = 0x004, 0x008, 0x240
SLCR_LOCK_KEY, SLCR_UNLOCK_KEY = 0x767B, 0xDF0D


class _Mapping:
    """`size` bytes of a file (device) from byte `offset` (any alignment), mapped shared."""

    def __init__(self, path: str | Path, offset: int, size: int, sync: bool = True, what: str = "") -> None:
        flags = os.O_RDWR | (os.O_SYNC if sync else 0)
        try:
            self.fd = os.open(str(path), flags)
        except OSError as exc:
            raise FluidError(f"cannot open {path} for {what or 'mapping'}: {exc.strerror}"
                             + (" (run as root, or give the user access)" if exc.errno in (1, 13) else "")) from None
        start = offset - offset % PAGE
        self.delta = offset - start
        try:
            self.mm = mmap.mmap(self.fd, self.delta + size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                                offset=start)
        except (OSError, ValueError) as exc:
            os.close(self.fd)
            raise FluidError(f"cannot map {size} bytes of {path} at {offset:#x} for {what or 'mapping'}: {exc}") \
                from None
        self.size = size
        self.words = np.frombuffer(self.mm, dtype=np.uint32, count=(self.delta + size) // 4)
        self.bytes = memoryview(self.mm)[self.delta:self.delta + size]

    def read32(self, off: int) -> int:
        return int(self.words[(self.delta + off) >> 2])

    def write32(self, off: int, value: int) -> None:
        self.words[(self.delta + off) >> 2] = value & 0xFFFFFFFF

    def close(self) -> None:
        if self.mm is None:
            return
        self.bytes.release()
        self.words = None  # type: ignore[assignment]  # closed: a read or write after close() fails
        try:
            self.mm.close()
        except BufferError:   # a caller still holds a view; the OS unmaps at exit
            pass
        os.close(self.fd)
        self.mm = None  # type: ignore[assignment]  # closed: close() again returns at once


def _read_sysfs_int(path: Path, what: str) -> int:
    try:
        return int(path.read_text().strip(), 0)
    except OSError as exc:
        raise FluidError(f"cannot read {what} from {path}: {exc.strerror} (is the driver loaded?)") from None
    except ValueError:
        raise FluidError(f"{path}: expected a number for {what}, got {path.read_text().strip()!r}") from None


class UdmaBufBuffer(BytesBuffer):
    """A piece of a u-dma-buf; with a cached mapping, syncs go through the u-dma-buf sysfs files."""

    def __init__(self, dev: DevMemDevice, start: int, nbytes: int) -> None:
        super().__init__(dev._mem.bytes, start, nbytes, dev.dma_phys, on_free=lambda b: dev._alloc.free(start))
        self._dev = dev

    def _sync(self, direction: int, which: str) -> None:
        d = self._dev
        if d._sync_dir is None:
            return
        (d._sync_dir / "sync_offset").write_text(str(self._start))
        (d._sync_dir / "sync_size").write_text(str(self.nbytes))
        (d._sync_dir / "sync_direction").write_text(str(direction))
        (d._sync_dir / which).write_text("1")

    def sync_to_device(self) -> None:
        self._sync(1, "sync_for_device")      # DMA_TO_DEVICE

    def sync_from_device(self) -> None:
        self._sync(2, "sync_for_cpu")         # DMA_FROM_DEVICE


class DevMemDevice(Device):
    """The NPU through UIO or /dev/mem, memory from u-dma-buf or a reserved region (module docstring)."""

    name = "devmem"

    def __init__(self, *, uio: str | None = None, reg_base: int | None = None,
                 udmabuf: str | None = "udmabuf0", dma_region: tuple[int, int] | None = None,
                 cached: bool = False, reset: str | Callable[[], None] | None = "zynq7",
                 mem_path: str = "/dev/mem", sysfs_root: str = "/sys", dev_root: str = "/dev") -> None:
        self.mem_path, self.sysfs, self.devroot = mem_path, Path(sysfs_root), Path(dev_root)
        self._regs = self._mem = None
        try:
            if uio is not None:
                name = Path(uio).name
                size = _read_sysfs_int(self.sysfs / "class/uio" / name / "maps/map0/size", "the UIO window size")
                if size < WINDOW_BYTES:
                    raise FluidError(f"{uio} maps {size} bytes; the NPU's register window is {WINDOW_BYTES}")
                uio_path = uio if os.path.isabs(uio) else str(self.devroot / name)
                self._regs = _Mapping(uio_path, 0, WINDOW_BYTES, what="the NPU registers")
            elif reg_base is not None:
                if reg_base % WINDOW_BYTES:
                    raise FluidError(f"register base {reg_base:#x} is not {WINDOW_BYTES}-byte aligned")
                self._regs = _Mapping(mem_path, reg_base, WINDOW_BYTES, what="the NPU registers")
            else:
                raise FluidError("DevMemDevice needs uio=/dev/uioN or reg_base=<the NPU's physical address>")
            self._sync_dir = None
            if dma_region is not None:
                self.dma_phys, size = dma_region
                self._mem = _Mapping(mem_path, self.dma_phys, size, what="the DMA region")
            elif udmabuf is not None:
                cls_dir = self.sysfs / "class/u-dma-buf" / udmabuf
                self.dma_phys = _read_sysfs_int(cls_dir / "phys_addr", "the u-dma-buf bus address")
                size = _read_sysfs_int(cls_dir / "size", "the u-dma-buf size")
                self._mem = _Mapping(self.devroot / udmabuf, 0, size, sync=not cached, what="the u-dma-buf")
                self._sync_dir = cls_dir if cached else None
            else:
                raise FluidError("DevMemDevice needs udmabuf=<name> or dma_region=(phys_addr, size)")
        except Exception:
            self.close()
            raise
        self._alloc = BumpAllocator(self.dma_phys, size, what=f"DMA memory ({udmabuf or 'reserved region'})")
        self._reset = reset

    def read32(self, offset: int) -> int:
        return self._regs.read32(offset)

    def write32(self, offset: int, value: int) -> None:
        self._regs.write32(offset, value)

    def alloc(self, nbytes: int) -> Buffer:
        off = self._alloc.alloc(nbytes)
        return UdmaBufBuffer(self, off, nbytes)

    def reset(self) -> None:
        if callable(self._reset):
            self._reset()
        elif self._reset == "zynq7":
            slcr = _Mapping(self.mem_path, SLCR_BASE, PAGE, what="the Zynq-7000 SLCR (PL reset)")
            try:
                slcr.write32(SLCR_UNLOCK, SLCR_UNLOCK_KEY)
                old = slcr.read32(FPGA_RST_CTRL)
                slcr.write32(FPGA_RST_CTRL, old | 0x1)      # assert FCLK_RESET0_N
                time.sleep(1e-4)
                slcr.write32(FPGA_RST_CTRL, old & ~0x1)     # release it
                slcr.write32(SLCR_LOCK, SLCR_LOCK_KEY)
            finally:
                slcr.close()
        elif self._reset is None:
            self.write32(REG["CTRL"].offset, REG["CTRL"].field("SOFT_RESET").mask)
        else:
            raise FluidError(f"unknown reset method {self._reset!r} (use 'zynq7', a callable or None)")

    def close(self) -> None:
        for m in (self._regs, self._mem):
            if m is not None:
                m.close()
        self._regs = self._mem = None
