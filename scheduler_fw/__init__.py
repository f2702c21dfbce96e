"""Scheduling policies (exit-aware preemptive FluidB and baselines); runs on the board's ARM.

Board-side (Python 3.10, numpy and the core dependencies only):
    samples      request queue with sample IDs, reorder buffer
    latency      the Nexits x Bmax look-up table (+ per-layer table) from a design bundle
    backend      the `Backend` interface (run layers i..j on a batch) and the simulated NPU
    policy       the `Policy` interface and its actions
    fluidb       FluidB (§III-B); adaptive: AdaptB and SERIAL; lazybatching: LazyBatching
    serving      the serving loop (virtual or wall clock), invocation counting
    arrivals, metrics, registry, simulation   seeded traces, figures, policies by name, one experiment
Host-side (DSE, plots): designs (DSE cache), experiments, fig7, plots, cli.
"""
