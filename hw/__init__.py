"""The NPU in Amaranth (GEMM engine, Fluid Batching control block, Stackable PEs).

Generated from a design bundle; holds the one definition of the register map
that the host driver imports.
"""
