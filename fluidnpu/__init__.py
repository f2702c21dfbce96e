"""fluidnpu: FPGA NPU hardware/software co-design for serving early-exit DNNs.

Data flows one way: workload -> DSE -> design bundle -> hw / hls_gen /
scheduler tables -> host_driver -> scheduler -> user.
"""

__version__ = "0.1.0"
