"""Devices that run a design: PYNQ, /dev/mem, RTL simulation, bit-accurate model, CUDA."""
