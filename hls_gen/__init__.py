"""Vendor build flow: Vivado/HLS project generation for a design bundle."""
