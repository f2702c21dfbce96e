"""Staged (multi-entry multi-exit) batching on PyTorch: DVABatch's mechanism.

A model given as a sequence of modules is sliced into N stages of about equal
time by profiling (`slicing`); one `StageExecutor` per stage, each on its own
CUDA stream, passes batches through buffer slots guarded by CUDA events
(`buffers`); a batch table and batch queues carry the meta-operations new,
stretch and split (`batch_table`); `engine.StagedEngine` ties them together.
On CPU the streams and events become no-ops and execution is synchronous,
which is how the correctness suite runs without a GPU.

Host-side only. PyTorch is imported lazily (`torchutil.require_torch`), so
importing this package never needs torch; the board side never imports it.
"""
