"""DevMemDevice against file-backed fakes: the register window and the DMA memory are mmaps of temp
files, u-dma-buf's and UIO's sysfs files live in a temp dir, /dev/mem is a sparse temp file."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.device import BufferTooSmall
from fluidnpu.host_driver.devmem_device import (
    FPGA_RST_CTRL,
    SLCR_BASE,
    SLCR_LOCK,
    SLCR_LOCK_KEY,
    SLCR_UNLOCK,
    SLCR_UNLOCK_KEY,
    DevMemDevice,
)
from fluidnpu.host_driver.driver import DesignMismatch, NpuDriver, random_fbcb, stub_bundle
from fluidnpu.hw.regmap import REG, REGISTERS, NpuParams, reset_value

BUNDLE = stub_bundle(16, 4, 4, 4, random_fbcb(2, 4, 16, 4, 4, seed=7), axi_dw=64)
PHYS = 0x3F00_0000
DMA_SIZE = 1 << 20
REG_BASE = 0x43C0_0000


def register_image(params: NpuParams, **over: int) -> bytes:
    words = [0] * 1024
    for r in REGISTERS:
        words[r.offset >> 2] = reset_value(r, params) or 0
    for name, v in over.items():
        words[REG[name].offset >> 2] = v
    return struct.pack("<1024I", *words)


@pytest.fixture
def board(tmp_path):
    """A fake /sys and /dev: uio0 (NPU registers) and udmabuf0 (1 MiB at PHYS)."""
    from fluidnpu.host_driver.driver import bundle_params
    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    (sysfs / "class/uio/uio0/maps/map0").mkdir(parents=True)
    (sysfs / "class/uio/uio0/maps/map0/size").write_text("0x00001000\n")
    udir = sysfs / "class/u-dma-buf/udmabuf0"
    udir.mkdir(parents=True)
    (udir / "phys_addr").write_text(f"{PHYS:#x}\n")
    (udir / "size").write_text(f"{DMA_SIZE}\n")
    dev.mkdir()
    (dev / "uio0").write_bytes(register_image(bundle_params(BUNDLE)))
    (dev / "udmabuf0").write_bytes(bytes(DMA_SIZE))
    return tmp_path


def open_dev(board, **kw) -> DevMemDevice:
    kw.setdefault("reset", None)
    return DevMemDevice(uio="uio0", sysfs_root=str(board / "sys"), dev_root=str(board / "dev"), **kw)


def test_driver_opens_the_npu_through_uio_and_writes_land_in_the_window(board):
    with open_dev(board) as dev:
        driver = NpuDriver(dev, BUNDLE, load=False)
        driver.set_bactive(3)
        dev.write32(REG["DESC_BASE"].offset, 0x3F001000)
    regs = (board / "dev/uio0").read_bytes()
    assert struct.unpack_from("<I", regs, REG["BACTIVE"].offset)[0] == 3
    assert struct.unpack_from("<I", regs, REG["DESC_BASE"].offset)[0] == 0x3F001000


def test_a_bitstream_of_another_design_is_refused(board):
    from fluidnpu.host_driver.driver import bundle_params
    p = bundle_params(BUNDLE)
    (board / "dev/uio0").write_bytes(register_image(p, CFG_TC=8, CFG_DESIGN_HASH=0x1234))
    with open_dev(board) as dev:
        with pytest.raises(DesignMismatch, match=r"CFG_TC is 8, the bundle says 4; CFG_DESIGN_HASH is 0x00001234"):
            NpuDriver(dev, BUNDLE)
    (board / "dev/uio0").write_bytes(bytes(4096))
    with open_dev(board) as dev:
        with pytest.raises(DesignMismatch, match="ID reads 0x00000000"):
            NpuDriver(dev, BUNDLE)


def test_udmabuf_buffers_map_to_its_physical_address(board):
    with open_dev(board) as dev:
        a = dev.alloc(1000)
        b = dev.alloc(5000)
        assert a.phys_addr == PHYS and b.phys_addr == PHYS + 4096
        b.write(10, b"hello")
        assert b.read(10, 5) == b"hello"
        with pytest.raises(BufferTooSmall, match="does not fit the 5000-byte buffer"):
            b.write(4999, b"xy")
        with pytest.raises(BufferTooSmall, match="cannot allocate"):
            dev.alloc(DMA_SIZE)
        # a subnet image placed in the u-dma-buf: descriptors and weights land in the file
        import random

        from fluidnpu.host_driver.memory_plan import plan_subnet, subnet_nbytes
        from fluidnpu.sim_tb.npu_cases import make_case
        case = make_case(random.Random(1), bmax=4, TR=16, TP=4, TC=4, nlayers=2, b=2)
        buf = dev.alloc(subnet_nbytes(case.layers, 4))
        image = plan_subnet(case.layers, 4, buffer=buf)
        image.write_input(case.x)
        assert image.desc_base == buf.phys_addr
        assert np.array_equal(image.read_tensor(0, 2), case.x)
    data = (board / "dev/udmabuf0").read_bytes()
    assert data[4096 + 10:4096 + 15] == b"hello"
    off = buf.phys_addr - PHYS
    assert data[off:off + len(image.memory)] == bytes(image.memory)


def test_cached_udmabuf_syncs_through_sysfs(board):
    udir = board / "sys/class/u-dma-buf/udmabuf0"
    with open_dev(board, cached=True) as dev:
        dev.alloc(4096)
        buf = dev.alloc(100)
        buf.sync_to_device()
        assert (udir / "sync_offset").read_text() == "4096" and (udir / "sync_size").read_text() == "100"
        assert (udir / "sync_direction").read_text() == "1" and (udir / "sync_for_device").read_text() == "1"
        buf.sync_from_device()
        assert (udir / "sync_direction").read_text() == "2" and (udir / "sync_for_cpu").read_text() == "1"


def test_missing_drivers_give_clear_errors(board):
    (board / "sys/class/u-dma-buf/udmabuf0/phys_addr").unlink()
    with pytest.raises(FluidError, match=r"u-dma-buf bus address .*\(is the driver loaded\?\)"):
        open_dev(board)
    (board / "sys/class/uio/uio0/maps/map0/size").write_text("0x800")
    with pytest.raises(FluidError, match="maps 2048 bytes"):
        open_dev(board)
    with pytest.raises(FluidError, match="needs uio="):
        DevMemDevice(sysfs_root=str(board / "sys"))
    with pytest.raises(FluidError, match="cannot open"):
        DevMemDevice(reg_base=REG_BASE, mem_path=str(board / "nope"))


def test_dev_mem_registers_reserved_memory_and_zynq7_pl_reset(board):
    """/dev/mem as a sparse file: the NPU window at its physical base, a reserved DMA region, and the
    SLCR PL reset (unlock, assert and release FCLK_RESET0_N, lock)."""
    from fluidnpu.host_driver.driver import bundle_params
    mem = board / "mem"
    with open(mem, "wb") as fh:
        fh.truncate(SLCR_BASE + 0x1000)
        fh.seek(REG_BASE)
        fh.write(register_image(bundle_params(BUNDLE), STATUS=1))       # stuck BUSY
        fh.seek(SLCR_BASE + FPGA_RST_CTRL)
        fh.write(struct.pack("<I", 0xF0))
    dev = DevMemDevice(reg_base=REG_BASE, dma_region=(0x3000_0000, 1 << 16), mem_path=str(mem))
    NpuDriver(dev, BUNDLE, load=False)
    assert dev.alloc(64).phys_addr == 0x3000_0000
    assert dev.wait_done(0.01) is False            # BUSY never clears: a timeout, no hang
    dev.reset()
    dev.close()
    with open(mem, "rb") as fh:
        fh.seek(SLCR_BASE)
        slcr = fh.read(0x1000)
    word = lambda off: struct.unpack_from("<I", slcr, off)[0]  # noqa: E731
    assert word(SLCR_UNLOCK) == SLCR_UNLOCK_KEY and word(SLCR_LOCK) == SLCR_LOCK_KEY
    assert word(FPGA_RST_CTRL) == 0xF0             # reset released, other bits kept
