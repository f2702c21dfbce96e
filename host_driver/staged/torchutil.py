"""Lazy PyTorch import, device resolution, and CUDA stream/event shims that are
no-ops on CPU."""

from __future__ import annotations

from typing import Any

from fluidnpu.errors import FluidError


def require_torch():
    """The torch module, or a one-line FluidError saying how to install it."""
    try:
        import torch
    except ModuleNotFoundError:
        raise FluidError("PyTorch is not installed: pip install 'fluidnpu[gpu]' (torch==2.13.0)") from None
    return torch


def resolve_device(device: str):
    """A torch.device for 'cpu' or 'cuda[:N]'; FluidError if CUDA is asked for and absent."""
    torch = require_torch()
    d = str(device).strip().lower()
    if d == "cpu":
        return torch.device("cpu")
    if d.startswith("cuda"):
        if not torch.cuda.is_available():
            raise FluidError(f"--device {device}: no CUDA GPU is available (torch {torch.__version__})")
        return torch.device(d)
    raise FluidError(f"unknown device {device!r}: use cpu or cuda")


def device_name(device) -> str:
    torch = require_torch()
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads)"


class _NullEvent:
    """A CUDA event stand-in on CPU: work is synchronous, so it is always complete."""

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class StreamShim:
    """One executor's stream: a real torch.cuda.Stream on CUDA, nothing on CPU."""

    def __init__(self, device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            torch = require_torch()
            self.stream = torch.cuda.Stream(device=device)
        else:
            self.stream = None

    def new_event(self):
        if self.cuda:
            torch = require_torch()
            return torch.cuda.Event(enable_timing=False, blocking=False)
        return _NullEvent()

    def record(self):
        """An event recorded on this stream now (after everything enqueued so far)."""
        ev = self.new_event()
        ev.record(self.stream) if self.cuda else None
        return ev

    def wait(self, event) -> None:
        """Make this stream wait for `event` on the device (cudaStreamWaitEvent; no host sync)."""
        if self.cuda and event is not None and not isinstance(event, _NullEvent):
            self.stream.wait_event(event)

    def context(self):
        if self.cuda:
            torch = require_torch()
            return torch.cuda.stream(self.stream)
        import contextlib

        return contextlib.nullcontext()

    def keep_alive(self, tensors) -> None:
        """Tell the caching allocator these tensors are used on this stream too (record_stream)."""
        if self.cuda:
            for t in tensors:
                t.record_stream(self.stream)


def to_host_async(t, stream: StreamShim):
    """A host copy of `t` that does not block the host.

    On CUDA: a non-blocking copy into freshly allocated pinned (page-locked) memory, enqueued on
    `stream`; it is valid once an event recorded on the stream after this call has completed. On
    CPU: `t` itself (the work already ran synchronously)."""
    if getattr(stream, "cuda", False):
        torch = require_torch()
        dst = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        dst.copy_(t, non_blocking=True)
        return dst
    return t.detach()


def synchronize(device) -> None:
    if device.type == "cuda":
        require_torch().cuda.synchronize(device)
