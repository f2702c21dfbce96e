"""AXI4 and AXI4-Lite interface signatures, with AMBA's member names.

Member names are the AMBA signal names in lower case, so the generated
Verilog reads `m_axi__arvalid` (Amaranth joins hierarchy with `__`) and the
Vivado wrapper and cocotbext-axi (`bus_separator="__"`) find them by name.
Signatures are written from the master's point of view: `Out` is driven by
the master. A slave uses `.flip()`.
"""

from __future__ import annotations

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from fluidnpu.hw.regmap import M_AXI_PREFIX, m_axi_name  # noqa: F401  (re-exported for the RTL)

AXI_RESP_OKAY = 0b00
AXI_BURST_INCR = 0b01


def axi_lite_signature(addr_width: int = 32, data_width: int = 32) -> wiring.Signature:
    """AXI4-Lite, master view."""
    return wiring.Signature({
        "awaddr": Out(addr_width), "awprot": Out(3), "awvalid": Out(1), "awready": In(1),
        "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wvalid": Out(1), "wready": In(1),
        "bresp": In(2), "bvalid": In(1), "bready": Out(1),
        "araddr": Out(addr_width), "arprot": Out(3), "arvalid": Out(1), "arready": In(1),
        "rdata": In(data_width), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
    })


def axi4_signature(addr_width: int = 32, data_width: int = 64, id_width: int = 1) -> wiring.Signature:
    """AXI4 (full), master view; fixed ID 0, INCR bursts, no locking or QoS use."""
    return wiring.Signature({
        "awid": Out(id_width), "awaddr": Out(addr_width), "awlen": Out(8), "awsize": Out(3),
        "awburst": Out(2), "awlock": Out(1), "awcache": Out(4), "awprot": Out(3),
        "awvalid": Out(1), "awready": In(1),
        "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wlast": Out(1),
        "wvalid": Out(1), "wready": In(1),
        "bid": In(id_width), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
        "arid": Out(id_width), "araddr": Out(addr_width), "arlen": Out(8), "arsize": Out(3),
        "arburst": Out(2), "arlock": Out(1), "arcache": Out(4), "arprot": Out(3),
        "arvalid": Out(1), "arready": In(1),
        "rid": In(id_width), "rdata": In(data_width), "rresp": In(2), "rlast": In(1),
        "rvalid": In(1), "rready": Out(1),
    })


