"""Scheduling policies (exit-aware preemptive FluidB and baselines); runs on the board's ARM."""
