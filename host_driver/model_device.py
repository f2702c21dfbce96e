"""ModelDevice: the NPU as a bit-accurate numpy model behind the same register window.

The register block follows hw/registers.py rule for rule (reset values,
CFG_*/design hash, FBCB memory through FBCB_ADDR/FBCB_DATA, BACTIVE/BEXIT/
BINCR with their refusals, START/SOFT_RESET/CLEAR_COUNTERS, STATUS, IRQ, the
busy lock, the same ErrorCodes). A START runs the whole subnet at once: each
descriptor is read from the device memory and checked as the sequencer
checks it (a layer beyond the FBCB, an empty dimension, a mode the engine
lacks, BR > Bactive, too few buffer rows for the groups: BAD_DESCRIPTOR;
memory outside the device: AXI_READ/AXI_WRITE), the layer's im2col walk uses
the descriptor's own byte strides, and the arithmetic is hw/reference.py's
(the RTL's golden model), so outputs are bit-exact with the RTL. The cycle
counters come from dse/perf_model.py's `layer_cycles` for the layer's FBCB
<BR, k> at the run's Bactive, priced on the build's m_axi ports (its width and
port count, as the RTL has them); CYC_MAC is the plan's row count and CYC_DMA_STALL the
rest of each layer's cycles beyond the model's fixed per-layer overhead —
estimates, not measurements. `device_cycles` accumulates the modelled time.

`hang` makes START never finish (fault tests): "soft" — SOFT_RESET recovers
it; "hard" — only `reset()` does.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fluidnpu.host_driver.device import Buffer, BumpAllocator, BytesBuffer, Device
from fluidnpu.hw.descriptor import DESC_STRIDE_BYTES, DESC_WORDS, unpack_fields
from fluidnpu.hw.reference import gemm_bias, postprocess
from fluidnpu.hw.regmap import (
    BUSY_LOCKED,
    REG,
    REGISTERS,
    Access,
    ErrorCode,
    NpuParams,
    buffer_window,
    decode_fbcb_entry,
    fbcb_buffered,
    k_dims,
    supported_k_codes,
)

_W = {r.offset >> 2: r for r in REGISTERS}
_MASK32 = 0xFFFFFFFF


# What the cycle model reads of a descriptor (dse.perf_model.descriptor_cycles).
_GEOMETRY_FIELDS = ("npix", "P", "cout", "cin", "in_h", "in_w", "out_h", "out_w", "kh", "kw", "sh", "sw", "ph", "pw")


class _AxiFault(Exception):
    def __init__(self, code: ErrorCode) -> None:
        self.code = code


class ModelDevice(Device):
    """A bit-accurate, fast NPU on the host. `bundle`: a Bundle, its dict, or NpuParams."""

    name = "model"
    poll_interval_s = 0.0

    def __init__(self, bundle: Any, *, mem_bytes: int = 64 << 20, mem_base: int = 0x1000_0000,
                 axi_dw: int | None = None, timing: Any = None, hang: str | None = None,
                 preload_fbcb: bool = True) -> None:
        from fluidnpu.dse.perf_model import DEFAULT_TIMING, EngineTiming
        from fluidnpu.host_driver.driver import _data, bundle_params

        self.params: NpuParams = bundle_params(bundle, axi_dw)
        if timing is None and not isinstance(bundle, NpuParams):
            t = _data(bundle).get("dse", {}).get("timing")
            timing = EngineTiming(**t) if t else None
        self.timing = timing or DEFAULT_TIMING
        self.mem_base = mem_base
        self.memory = bytearray(mem_bytes)
        self._alloc = BumpAllocator(mem_base, mem_bytes, what="ModelDevice memory")
        self.hang = hang
        self._cycle_cache: dict[tuple, int] = {}
        self._walk_cache: dict[tuple, tuple] = {}
        self._stuck = False
        self.device_cycles = 0
        self.runs = 0
        self.last_run_s = 0.0         # host seconds the last START spent computing (the "device time")
        self.accesses = 0             # register reads + writes
        p = self.params
        self.fbcb = list(p.fbcb) if (preload_fbcb and p.fbcb) else [0] * p.fbcb_depth
        self.reset()

    # ---- register window ----------------------------------------------------------------------
    def reset(self) -> None:
        """Hard reset: registers to reset values, run aborted. The FBCB memory keeps its contents
        (as the RTL's memory does)."""
        self.irq_en = self.irq_st = 0
        self.st_done = self.st_error = False
        self.err_code = 0
        self.desc_base = self.desc_count = self.bactive = 0
        self.fbcb_ptr = self.layer_cnt = 0
        self.cyc = {"CYC_BUSY": 0, "CYC_MAC": 0, "CYC_DMA_STALL": 0, "CYC_LAYERS": 0}
        self.busy = False
        self._stuck = False

    @property
    def irq(self) -> bool:
        return bool(self.irq_st & self.irq_en)

    def read32(self, offset: int) -> int:
        self.accesses += 1
        reg = _W.get((offset & 0xFFF) >> 2)
        if reg is None or reg.access is Access.WO:
            return 0
        n = reg.name
        p = self.params
        if n == "ID" or n == "VERSION":
            return reg.reset or 0            # constants: never None
        if n.startswith("CFG_"):
            return p.cfg_values[n] & _MASK32
        if n.startswith("CYC_"):
            return self.cyc[n] & _MASK32
        st = REG["STATUS"]
        return {
            "IRQ_EN": self.irq_en, "IRQ_STATUS": self.irq_st, "DESC_BASE": self.desc_base,
            "DESC_COUNT": self.desc_count, "BACTIVE": self.bactive, "FBCB_ADDR": self.fbcb_ptr,
            "LAYER": self.layer_cnt,
            "STATUS": (int(self.busy) << st.field("BUSY").lsb | int(self.st_done) << st.field("DONE").lsb
                       | int(self.st_error) << st.field("ERROR").lsb | self.err_code << st.field("ERROR_CODE").lsb),
        }[n]

    def _error(self, code: ErrorCode) -> None:
        self.st_error = True
        self.err_code = int(code)
        self.irq_st |= 0b10

    def write32(self, offset: int, value: int) -> None:
        self.accesses += 1
        reg = _W.get((offset & 0xFFF) >> 2)
        if reg is None or reg.access is Access.RO:
            return
        v = value & _MASK32
        n = reg.name
        p = self.params
        if n in BUSY_LOCKED and self.busy:
            self._error(ErrorCode.WRITE_WHILE_BUSY)
            return
        if n == "CTRL":
            if v & 0b100:
                self.cyc = dict.fromkeys(self.cyc, 0)
            if v & 0b010:
                self._soft_reset()
            elif v & 0b001:
                if self.busy:
                    self._error(ErrorCode.START_WHILE_BUSY)
                elif not 1 <= self.bactive <= p.bmax:
                    self._error(ErrorCode.BAD_BACTIVE)
                else:
                    self.st_done = self.st_error = False
                    self.err_code = self.layer_cnt = 0
                    self._run()
        elif n == "IRQ_EN":
            self.irq_en = v & reg.mask
        elif n == "IRQ_STATUS":
            self.irq_st &= ~v & 0b11
        elif n == "DESC_BASE":
            self.desc_base = v
        elif n == "DESC_COUNT":
            self.desc_count = v & reg.mask
        elif n == "BACTIVE":
            self.bactive = v
        elif n == "BEXIT":
            if v > self.bactive:
                self._error(ErrorCode.BAD_BACTIVE_UPDATE)
            else:
                self.bactive -= v
        elif n == "BINCR":
            if self.bactive + v > p.bmax:
                self._error(ErrorCode.BAD_BACTIVE_UPDATE)
            else:
                self.bactive += v
        elif n == "FBCB_ADDR":
            self.fbcb_ptr = v & reg.mask
        elif n == "FBCB_DATA":
            if self.fbcb_ptr >= p.fbcb_depth:
                self._error(ErrorCode.FBCB_INDEX)
            else:
                self.fbcb[self.fbcb_ptr] = v & ((1 << p.fbcb_width) - 1)
                self.fbcb_ptr += 1

    def _soft_reset(self) -> None:
        if self._stuck and self.hang == "hard":
            return      # a wedged NPU: SOFT_RESET does not bring it back
        self.busy = self._stuck = False
        self.st_done = self.st_error = False
        self.err_code = self.layer_cnt = self.irq_st = 0

    # ---- memory -------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Buffer:
        off = self._alloc.alloc(nbytes)
        return BytesBuffer(self.memory, off, nbytes, self.mem_base,
                           on_free=lambda b, off=off: self._alloc.free(off))

    def _span(self, addr: int, n: int, code: ErrorCode) -> int:
        off = addr - self.mem_base
        if off < 0 or off + n > len(self.memory):
            raise _AxiFault(code)
        return off

    # ---- execution ----------------------------------------------------------------------------
    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            self._run_layers()
        finally:
            self.last_run_s = time.perf_counter() - t0

    def _run_layers(self) -> None:
        self.runs += 1
        if self.hang:
            self.busy = self._stuck = True
            return
        b = self.bactive
        code = None
        for i in range(self.desc_count):
            try:
                fields = self._descriptor(self.desc_base + i * DESC_STRIDE_BYTES)
                plan = self._plan(fields, b)
                if plan is None:
                    code = ErrorCode.BAD_DESCRIPTOR
                    break
                self._layer(fields, b)
            except _AxiFault as f:
                code = f.code
                break
            self._count(fields, b, plan)
            self.layer_cnt += 1
            if plan["buffered"] and self._buffer_overflows(fields, b, plan):
                code = ErrorCode.BUFFER_OVERFLOW         # the RTL reports it once the layer has drained
                break
        if code is not None:
            self._error(code)
        else:
            self.st_done = True
            self.irq_st |= 0b01

    def _descriptor(self, addr: int) -> dict:
        off = self._span(addr, DESC_WORDS * 4, ErrorCode.AXI_READ)
        words = list(np.frombuffer(bytes(self.memory[off:off + DESC_WORDS * 4]), dtype="<u4"))
        return unpack_fields([int(w) for w in words])

    def _plan(self, f: dict, b: int) -> dict | None:
        """The sequencer's checks and plan for one layer; None = BAD_DESCRIPTOR."""
        p = self.params
        if (f["layer"] >= p.layers or f["npix"] == 0 or f["cout"] == 0 or f["P"] == 0 or f["cin"] == 0
                or f["kw"] == 0 or f["out_w"] == 0):
            return None
        word = self.fbcb[f["layer"] * p.bmax + b - 1]
        br, k = decode_fbcb_entry(word, p.bmax)
        TR, TP, TC = p.TR, p.TP, p.TC
        if k not in supported_k_codes(TR, TP, TC, p.stackable) or br > b:
            return None
        TRk, TPk, nPE = k_dims(TR, TP, TC, k)
        C = f["cout"]
        BP = -(-b // br)
        g = min(BP, nPE // C, p.banks) if C <= nPE else 1
        if TRk // g == 0:
            return None
        # the entry holds BUFFERED only on an NPU built with the block input buffer (fbcb_width)
        return {"BR": br, "k": k, "TPk": TPk, "nPE": nPE, "BP": BP, "g": g, "buffered": fbcb_buffered(word, p.bmax)}

    def _buffer_overflows(self, f: dict, b: int, plan: dict) -> bool:
        """Whether some block of this buffered layer reads more input than a half of the NPU's block input
        buffer holds (dse/buffer_fit.py's `exact_block_words`: the RTL's blocks and fill regions)."""
        from fluidnpu.dse.buffer_fit import exact_block_words

        p = self.params
        window = buffer_window(p.TP)
        depth = -(-p.input_buffer // window) * window
        geo = (f["out_w"], f["out_h"], f["in_h"], f["sh"], f["kh"], f["ph"], f["in_row_words"])
        return exact_block_words(p.TR, p.TP, p.TC, geo, f["npix"], f["P"], f["cout"], b, plan["BR"], plan["k"],
                                 p.banks) > depth

    def _layer(self, f: dict, b: int) -> None:
        """One layer, bit-exact: im2col by the descriptor's byte strides, hw/reference arithmetic."""
        gather, taps, n_taps, dst, woff, boff = self._layer_plan(f, b)
        mem16 = np.frombuffer(self.memory, dtype="<i2", count=len(self.memory) // 2)
        if taps is None:                                 # every tap inside the image
            cols = mem16[gather].astype(np.int64)
        else:                                            # padding taps read as zero
            cols = np.zeros((b, n_taps), dtype=np.int64)
            cols[:, taps] = mem16[gather]
        C = f["cout"]
        cols = cols.reshape(b * f["npix"], f["P"])
        W = np.frombuffer(self.memory, dtype="<i2", count=f["P"] * C, offset=woff).reshape(f["P"], C)
        bias = np.frombuffer(self.memory, dtype="<i4", count=C, offset=boff)
        mem16[dst] = postprocess(gemm_bias(cols, W, bias), f["shift"], bool(f["relu"])).reshape(dst.shape)

    def _layer_plan(self, f: dict, b: int) -> tuple:
        """The layer's memory walk for a descriptor at Bactive `b`: the int16 indices its im2col reads
        (by the descriptor's byte strides), the valid taps (None: all) of its taps, where its outputs go,
        its weight and bias offsets; every address checked against the device memory (AXI_READ / AXI_WRITE). Cached per
        descriptor and `b`: a serving run walks the same few layers over and over, and building the walk
        costs more than the arithmetic at these sizes."""
        key = (tuple(f.values()), b)
        plan = self._walk_cache.get(key)
        if plan is not None:
            return plan
        oh, ow, kh, kw, cin, C = f["out_h"], f["out_w"], f["kh"], f["kw"], f["cin"], f["cout"]
        if f["npix"] != oh * ow or f["P"] != kh * kw * cin:
            raise _AxiFault(ErrorCode.BAD_DESCRIPTOR)   # an inconsistent descriptor: refuse it too
        oy, ox = np.arange(oh), np.arange(ow)
        ky, kx = np.arange(kh), np.arange(kw)
        row_adv = (ow - 1) * f["x_step"] + f["y_wrap"]
        pix = f["origin"] + oy[:, None] * row_adv + ox[None, :] * f["x_step"]               # (oh, ow)
        tap_adv = cin * 2 + f["kx_delta"]
        tap = ky[:, None] * (kw * tap_adv + f["ky_delta"]) + kx[None, :] * tap_adv          # (kh, kw)
        iy = oy[:, None] * f["sh"] - f["ph"] + ky[None, :]                                  # (oh, kh)
        ix = ox[:, None] * f["sw"] - f["pw"] + kx[None, :]                                  # (ow, kw)
        valid = (((iy >= 0) & (iy < f["in_h"]))[:, None, :, None]
                 & ((ix >= 0) & (ix < f["in_w"]))[None, :, None, :])                        # (oh, ow, kh, kw)
        rel = pix[:, :, None, None] + tap[None, None]                                       # (oh, ow, kh, kw)
        rel = rel[..., None] + np.arange(cin) * 2                                           # (..., cin)
        vmask = np.broadcast_to(valid[..., None], rel.shape)
        samples = f["src_base"] + np.arange(b, dtype=np.int64) * f["src_sample_stride"]
        addrs = samples[:, None] + rel[vmask][None, :]                                      # (b, nvalid)
        if addrs.size:
            self._span(int(addrs.min()), 2, ErrorCode.AXI_READ)
            self._span(int(addrs.max()), 2, ErrorCode.AXI_READ)
        woff = self._span(f["weight_base"], f["P"] * C * 2, ErrorCode.AXI_READ)
        boff = self._span(f["bias_base"], C * 4, ErrorCode.AXI_READ)
        dst = (f["dst_base"] + np.arange(b, dtype=np.int64)[:, None, None] * f["dst_sample_stride"]
               + np.arange(oh * ow)[None, :, None] * f["dst_pix_step"] + np.arange(C)[None, None, :] * 2)
        self._span(int(dst.min()), 2, ErrorCode.AXI_WRITE)
        self._span(int(dst.max()), 2, ErrorCode.AXI_WRITE)
        taps = None if vmask.all() else np.flatnonzero(vmask)
        plan = ((addrs - self.mem_base) >> 1, taps, vmask.size, (dst - self.mem_base) >> 1, woff, boff)
        if len(self._walk_cache) >= 256:
            self._walk_cache.clear()
        self._walk_cache[key] = plan
        return plan

    def layer_model_cycles(self, f: dict, b: int, br: int, k: int, buffered: bool = False) -> int:
        """dse/perf_model.py's cycles for this descriptor's layer (the build's m_axi ports and width;
        `buffered`: its input runs from the block input buffer), cached: a serving run prices the same
        few (layer, b, BR, k) over and over."""
        key = (tuple(f[n] for n in _GEOMETRY_FIELDS), buffered, b, br, k)
        cycles = self._cycle_cache.get(key)
        if cycles is None:
            from types import SimpleNamespace

            from fluidnpu.dse.perf_model import descriptor_cycles

            p = self.params
            geometry = SimpleNamespace(**{n: f[n] for n in _GEOMETRY_FIELDS},
                                       in_pitch=f["in_row_words"] // f["in_w"] if buffered else f["cin"])
            cycles = descriptor_cycles(p.TR, p.TP, p.TC, p.axi_dw / 8, geometry, b, br, k, self.timing,
                                       ports=p.axi_ports, banks=p.banks, buffered=buffered)
            self._cycle_cache[key] = cycles
        return cycles

    def _count(self, f: dict, b: int, plan: dict) -> None:
        cycles = self.layer_model_cycles(f, b, plan["BR"], plan["k"], plan["buffered"])
        R, P, C = f["npix"], f["P"], f["cout"]
        br, BP, g, nPE, TPk = plan["BR"], plan["BP"], plan["g"], plan["nPE"], plan["TPk"]
        n_last = b - (BP - 1) * br
        npass = -(-BP // g)
        h = BP - (npass - 1) * g
        rows_last = (n_last if h == 1 else br) * R
        mac = -(-C // nPE) * -(-P // TPk) * ((npass - 1) * br * R + rows_last)
        mac = min(mac, cycles)
        stall = max(0, cycles - mac - self.timing.layer_overhead)
        self.cyc["CYC_BUSY"] += cycles
        self.cyc["CYC_MAC"] += mac
        self.cyc["CYC_DMA_STALL"] += stall
        self.cyc["CYC_LAYERS"] += 1
        self.device_cycles += cycles

    def close(self) -> None:
        pass
