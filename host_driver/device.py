"""The one device interface every transport implements (PYNQ, /dev/mem, RTL simulation, model).

A `Device` is the NPU's AXI4-Lite register window (`read32`/`write32` at byte
offsets of hw/regmap.py), memory the NPU's `m_axi` master can reach
(`alloc` -> `Buffer`, physically contiguous, addressed by `phys_addr`), a hard
reset, and `wait_done`. `NpuDriver` (host_driver/driver.py) is written against
this interface only, so the same driver code runs on a board, in the RTL
simulation and on the bit-accurate model.

Pure Python + numpy: it runs on a Zynq's ARM cores with Python 3.10.
"""

from __future__ import annotations

import abc
import time

from fluidnpu.errors import FluidError
from fluidnpu.hw.regmap import REG

STATUS = REG["STATUS"]
_BUSY = STATUS.field("BUSY").mask


class BufferTooSmall(FluidError):
    """A tensor, image or read does not fit the device buffer it was given."""


class Buffer(abc.ABC):
    """Physically contiguous memory the NPU can reach: `nbytes` bytes at bus address `phys_addr`.

    `write`/`read` move bytes between the host and the buffer (through the
    CPU's mapping); on devices whose CPU caches are not coherent with the
    NPU's port (PYNQ's `allocate` on an HP port), call `sync_to_device()`
    after writing and `sync_from_device()` before reading what the NPU wrote.
    On the other devices the syncs are no-ops.
    """

    phys_addr: int
    nbytes: int

    def _check(self, offset: int, n: int, what: str) -> None:
        if self.freed:
            raise FluidError(f"buffer at {self.phys_addr:#x} was freed")
        if offset < 0 or n < 0 or offset + n > self.nbytes:
            raise BufferTooSmall(f"{what} of {n} bytes at offset {offset:#x} does not fit the "
                                 f"{self.nbytes}-byte buffer at {self.phys_addr:#x}")

    freed: bool = False

    def write(self, offset: int, data: bytes) -> None:
        """Copy `data` into the buffer at byte `offset`."""
        data = bytes(data) if not isinstance(data, (bytes, bytearray, memoryview)) else data
        self._check(offset, len(data), "write")
        self._write(offset, data)

    def read(self, offset: int, n: int) -> bytes:
        """`n` bytes from byte `offset`."""
        self._check(offset, n, "read")
        return self._read(offset, n)

    def sync_to_device(self) -> None:  # noqa: B027 (a no-op where memory is coherent, not abstract)
        """Flush CPU caches so the NPU sees what the host wrote (no-op where coherent)."""

    def sync_from_device(self) -> None:  # noqa: B027 (a no-op where memory is coherent, not abstract)
        """Invalidate CPU caches so the host sees what the NPU wrote (no-op where coherent)."""

    def free(self) -> None:
        """Give the memory back; the buffer is unusable afterwards."""
        if not self.freed:
            self._free()
        self.freed = True

    def _free(self) -> None:  # noqa: B027 (a buffer with nothing to release keeps the default)
        pass

    @abc.abstractmethod
    def _write(self, offset: int, data: bytes) -> None: ...

    @abc.abstractmethod
    def _read(self, offset: int, n: int) -> bytes: ...

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.nbytes} B at {self.phys_addr:#x}>"


class BytesBuffer(Buffer):
    """A buffer that is a window [start, start + nbytes) of a bytearray-like memory whose byte 0 sits at
    bus address `mem_base` (the model's memory, a mmap of /dev/mem or of a u-dma-buf)."""

    def __init__(self, memory, start: int, nbytes: int, mem_base: int = 0, on_free=None) -> None:
        self._mem = memory
        self._start = start
        self.nbytes = nbytes
        self.phys_addr = mem_base + start
        self._on_free = on_free

    def _write(self, offset: int, data: bytes) -> None:
        o = self._start + offset
        self._mem[o:o + len(data)] = data

    def _read(self, offset: int, n: int) -> bytes:
        o = self._start + offset
        return bytes(self._mem[o:o + n])

    def _free(self) -> None:
        if self._on_free is not None:
            self._on_free(self)


class BumpAllocator:
    """First-fit allocator over one contiguous region (bus addresses [base, base + size)), 4 KiB aligned."""

    def __init__(self, base: int, size: int, align: int = 4096, what: str = "device memory") -> None:
        self.base, self.size, self.align, self.what = base, size, align, what
        self._used: dict[int, int] = {}   # offset -> length

    def alloc(self, nbytes: int) -> int:
        """Offset (from `base`) of a fresh block of `nbytes`; FluidError when none is free."""
        if nbytes <= 0:
            raise FluidError(f"cannot allocate {nbytes} bytes")
        need = -(-nbytes // self.align) * self.align
        pos = 0
        for off in sorted(self._used):
            if off - pos >= need:
                break
            pos = off + -(-self._used[off] // self.align) * self.align
        if pos + need > self.size:
            free = self.size - sum(-(-n // self.align) * self.align for n in self._used.values())
            raise BufferTooSmall(f"{self.what}: cannot allocate {nbytes} bytes ({free} of {self.size} bytes free "
                                 "in pieces); free buffers or give the device more memory")
        self._used[pos] = nbytes
        return pos

    def free(self, offset: int) -> None:
        self._used.pop(offset, None)


class Device(abc.ABC):
    """The NPU behind one transport. Subclasses: ModelDevice, RtlSimDevice, PynqDevice, DevMemDevice.

    * `read32(offset)` / `write32(offset, value)`: the AXI4-Lite register window (byte offsets,
      hw/regmap.py); values are unsigned 32-bit.
    * `alloc(nbytes)` -> `Buffer`: physically contiguous memory the NPU can reach.
    * `reset()`: hard reset of the NPU (registers back to reset values; what the FBCB memory keeps
      depends on the device, so the driver reloads it).
    * `wait_done(timeout_s)` -> True once STATUS.BUSY is 0, False when `timeout_s` passed first.
    * `close()`; devices are context managers.
    """

    name = "device"
    poll_interval_s = 20e-6

    @abc.abstractmethod
    def read32(self, offset: int) -> int: ...

    @abc.abstractmethod
    def write32(self, offset: int, value: int) -> None: ...

    @abc.abstractmethod
    def alloc(self, nbytes: int) -> Buffer: ...

    @abc.abstractmethod
    def reset(self) -> None: ...

    def wait_done(self, timeout_s: float) -> bool:
        """Poll STATUS until BUSY is 0 (True) or `timeout_s` seconds have passed (False)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.read32(STATUS.offset) & _BUSY:
                return True
            if time.monotonic() >= deadline:
                return False
            if self.poll_interval_s:
                time.sleep(self.poll_interval_s)

    def close(self) -> None:  # noqa: B027 (a device with no transport keeps the default)
        """Release the transport (unmap, close files); idempotent."""

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # convenience for drivers and tests
    def reg(self, name: str, value: int | None = None) -> int:
        """Read register `name`, or write `value` to it (returns the value)."""
        off = REG[name].offset
        if value is None:
            return self.read32(off)
        self.write32(off, value & 0xFFFFFFFF)
        return value
