"""cocotbext-axi memories on the NPU's (or the DMA's) AXI master ports, for cocotb testbenches.

A multi-port master (`m_axi0` .. `m_axi{N-1}`, hw/dma.py `AxiDma`) reaches one
DDR through several HP ports: `axi_rams` puts one `AxiRam` on each port, all
on one memory, and gives every channel of every port its own random pause
generator (a different stall probability per port), so the ports run out of
step, as separate HP ports under load do.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator

from cocotbext.axi import AxiBus, AxiRam

from fluidnpu.hw.regmap import m_axi_name


def master_ports(dut) -> int:
    """How many `m_axi<i>` ports the toplevel has."""
    n = 0
    while hasattr(dut, f"{m_axi_name(n)}__arvalid"):
        n += 1
    if n == 0:
        raise AttributeError("the toplevel has no m_axi0 port")
    return n


def _pause(rng: random.Random, p: float) -> Iterator[bool]:
    while True:
        yield rng.random() < p


def axi_rams(dut, size: int, *, pause: float = 0.0, seed: int = 0) -> list[AxiRam]:
    """One AxiRam per master port, sharing the first one's memory; `pause`: the first port's
    per-channel stall probability (port i stalls with pause * (1 - 0.25 i)); 0 = never."""
    rams: list[AxiRam] = []
    for i in range(master_ports(dut)):
        ram = AxiRam(AxiBus.from_prefix(dut, m_axi_name(i), bus_separator="__"), dut.clk, dut.rst, size=size,
                     mem=rams[0].mem if rams else None)
        ram.read_if.log.setLevel(logging.WARNING)     # it logs every burst otherwise
        ram.write_if.log.setLevel(logging.WARNING)
        if pause:
            p = pause * (1 - 0.25 * (i % 4))
            for k, ch in enumerate((ram.read_if.ar_channel, ram.read_if.r_channel, ram.write_if.aw_channel,
                                    ram.write_if.w_channel, ram.write_if.b_channel)):
                ch.set_pause_generator(_pause(random.Random(seed * 10 + 100 * i + k), p))
        rams.append(ram)
    return rams
