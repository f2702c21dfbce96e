"""cocotb testbenches of the generated Verilog."""
