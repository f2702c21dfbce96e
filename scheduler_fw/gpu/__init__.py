"""Batching policies for the staged GPU engine (`fluidnpu.host_driver.staged`).

    dva       DVABatch's policies on the multi-entry multi-exit engine: I input
              diversity (cluster by length, batches in parallel), II operator
              diversity (split when T_remain(bs) >= 2 T_remain(bs/2)), III load
              diversity (stretch within T_comp_wait), and an exit-aware split
    baselines ZeroBatch (window 0) and DelayBatch (tuned window), single-entry single-exit
    turbo     TurboTransformers' DP batch scheduler (Alg. 2) with a cached cost
              table, hungry / lazy triggers and the half-SLO guard; naive batching, no batching
    runner    one seeded Poisson load against one policy, in wall-clock time
    cli       `fluidnpu gpu bench`

Host-side only; PyTorch is imported lazily.
"""
