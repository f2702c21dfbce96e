"""Host driver: one driver for the NPU's register map and descriptors, over interchangeable devices.

The register map (hw/regmap.py) and descriptor format (hw/descriptor.py) are
imported, never re-typed. Pure Python + numpy (Python >= 3.10): it runs on a
Zynq's ARM cores. See docs/deploy.md for boards.

Stable API (runtime code builds on exactly this)
------------------------------------------------

Devices — `host_driver.device.Device` (abstract):

* `read32(offset) -> int`, `write32(offset, value)`: the AXI4-Lite register window, byte offsets.
* `alloc(nbytes) -> Buffer`: physically contiguous memory the NPU's m_axi reaches.
  `Buffer`: `.phys_addr`, `.nbytes`, `write(offset, data)`, `read(offset, n) -> bytes`,
  `sync_to_device()`, `sync_from_device()`, `free()`; context manager. Out-of-range access
  raises `BufferTooSmall`.
* `reset()`: hard reset of the NPU. `wait_done(timeout_s) -> bool`: True once STATUS.BUSY = 0.
* `close()`; devices are context managers. `reg(name[, value])` reads/writes a register by name.

Implementations:

* `model_device.ModelDevice(bundle | NpuParams, mem_bytes=64 MiB, hang=None)`: bit-accurate numpy
  execution (hw/reference.py arithmetic, descriptor strides walked as the RTL walks them), the
  register block's rules and error codes, counters from dse/perf_model.py. Completes at START.
  `hang="soft"|"hard"` injects a run that never finishes.
* `rtl_sim_device.RtlSimDevice` via `run_with_rtl(bundle, fn, *args, driver=True)`: builds the
  NPU's Verilog, runs `fn(NpuDriver(device, bundle), *args)` inside a cocotb + Verilator
  simulation (cocotb.task.bridge/resume), returns fn's result (pickled back).
* `pynq_device.PynqDevice(bitfile, bundle=..., overlay=None, ip_name=None, reset_fn=None)`:
  pynq.Overlay + a DefaultIP subclass bound to hw/regmap.VLNV, pynq.allocate buffers with explicit
  cache syncs; `check_hwh(path, bundle)` checks the .hwh (VLNV, address range, design hash).
  pynq is imported only there.
* `devmem_device.DevMemDevice(uio="/dev/uio0" | reg_base=..., udmabuf="udmabuf0" |
  dma_region=(phys, size), cached=False, reset="zynq7" | callable | None)`: UIO or /dev/mem,
  u-dma-buf or a reserved region; for Zynq boards without PYNQ (ZC706).

Driver — `driver.NpuDriver(device, bundle, verify=True, load=True)`; `bundle` is a `Bundle`, its
JSON dict, or `driver.stub_bundle(TR, TP, TC, bmax, entries, axi_dw=64)`:

* on open: `verify()` — ID, VERSION major, CFG_TR/TP/TC/BMAX/LAYERS/AXI_DW and CFG_DESIGN_HASH
  against the bundle; `DesignMismatch` names every difference. Then `load_fbcb()`.
* `load_fbcb(words=None)`: the bundle's FBCB (hw/regmap.fbcb_table) via FBCB_ADDR/FBCB_DATA.
* `set_bactive(b)`, `exit(n)` (BEXIT), `backfill(n)` (BINCR) -> new Bactive; `.bactive`.
  A refused update raises `NpuError` (BAD_BACTIVE_UPDATE).
* `place(layers, bmax=None) -> SubnetImage`: allocate, plan (memory_plan.plan_subnet) and upload.
* `run_subnet(image, timeout_s=1.0, b=None) -> {"busy", "mac", "dma_stall", "layers"}`: DESC_BASE,
  DESC_COUNT, clear counters, START, wait. Timeout: SOFT_RESET, then hard reset, FBCB and Bactive
  restored, `NpuTimeout`. STATUS.ERROR: `NpuError` (`.code` an hw/regmap.ErrorCode, its message).
  `last_host_s` / `last_wait_s`: host-side and waiting time of the last launch.
* `hard_reset()`, `counters()`, `status()`, `close()`; context manager.

Memory — `memory_plan`: `LayerParams(geometry, weights, bias)`, `subnet_nbytes(layers, bmax)`,
`plan_subnet(layers, bmax, buffer=device_buffer)` -> `SubnetImage` (bound to the buffer:
`write_input(x, slots)`, `write_tensor(i, x, slots)`, `read_tensor(i, n, slots)`, `upload()`,
`download()`; `tensors[0]` is the input, `tensors[i+1]` layer i's output, Bmax sample slots each).

Errors (all `fluidnpu.errors.FluidError`): `DesignMismatch`, `NpuTimeout`, `NpuError`,
`BufferTooSmall`.

`scenario.py` holds the end-to-end scenarios the tests and benchmarks run on every device.
"""
