"""What the staged engine runs: a model as a sequence of modules plus how its
per-query inputs are batched.

State convention: between modules a batch is a *state*, a tuple of tensors that
all have the batch on dimension 0 (a plain CNN: ``(x,)``; the BERT-like
encoder: ``(hidden, mask)``; the UNet-like network: ``(x, skip1, skip2, ...)``).
A module gets ``state[0]`` when the state has one tensor and the whole tuple
otherwise, and returns a tensor or a tuple.

`StateOps` merges states of several batches into one (stretch) and takes row
ranges out of one (split). The default ops need equal shapes beyond dim 0;
`SeqStateOps` pads or trims a sequence dimension so that queries padded to
different lengths can be merged, and split-off short queries drop padding.

`ModelSpec.reference(payload)` runs one query alone through the unsliced
model: the result every staged schedule must reproduce.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fluidnpu.errors import FluidError
from fluidnpu.host_driver.staged.torchutil import require_torch

State = tuple


def as_state(x: Any) -> State:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def call_module(module, state: State) -> State:
    return as_state(module(state[0]) if len(state) == 1 else module(state))


class StateOps:
    """Batch-dimension operations on states whose tensors have fixed shapes beyond dim 0."""

    def rows(self, state: State) -> int:
        return int(state[0].shape[0])

    def take(self, state: State, lo: int, hi: int) -> State:
        return tuple(t[lo:hi] for t in state)

    def select(self, state: State, idx) -> State:
        """Rows `idx` (a device index tensor) of the state."""
        return tuple(t.index_select(0, idx) for t in state)

    def merge(self, states: Sequence[State]) -> State:
        if len(states) == 1:
            return states[0]
        torch = require_torch()
        return tuple(torch.cat([s[i] for s in states], 0) for i in range(len(states[0])))


class SeqStateOps(StateOps):
    """States whose tensors may carry a padded sequence on dim 1, with a boolean
    key-padding mask (True = real token) at position `mask_index`.

    merge pads every tensor's dim 1 to the longest (zeros; mask False); the
    engine trims dim 1 to the longest query of each batch it runs (so a batch
    split off by length drops the others' padding). Exact for a
    model whose padded positions are masked out of attention and whose other
    operations are position-wise (as in BERT)."""

    def __init__(self, mask_index: int = 1) -> None:
        self.mask_index = mask_index

    def trim(self, state: State, n: int) -> State:
        """Drop padding beyond position n (the longest query in the batch, known on the host,
        so no device-to-host read is needed)."""
        if int(state[self.mask_index].shape[1]) <= n:
            return state
        return tuple(t[:, :n] if t.dim() >= 2 else t for t in state)

    def merge(self, states: Sequence[State]) -> State:
        if len(states) == 1:
            return states[0]
        torch = require_torch()
        length = max(int(s[self.mask_index].shape[1]) for s in states)
        out = []
        for i in range(len(states[0])):
            parts = []
            for s in states:
                t = s[i]
                if t.dim() >= 2 and t.shape[1] < length:
                    pad = list(t.shape)
                    pad[1] = length - t.shape[1]
                    t = torch.cat([t, t.new_zeros(pad)], 1)
                parts.append(t)
            out.append(torch.cat(parts, 0))
        return tuple(out)


@dataclass
class ExitHead:
    """An early exit after module `after`: queries whose softmax confidence from
    `head(state)` reaches `threshold` leave with the head's logits."""

    after: int
    head: Any
    threshold: float


@dataclass
class ModelSpec:
    """A model as a sequence of modules, with batching of its per-query payloads.

    collate(payloads, device) -> state: the input state of a batch.
    length(payload) -> int: a query's input size (sequence length), for
    input-diversity clustering; max_length: the longest input the model accepts.
    output(state) -> tensor with one row per query (default state[0]).
    example(bs) -> list of payloads used for profiling.
    """

    name: str
    modules: list
    collate: Callable[[Sequence[Any], Any], State]
    example: Callable[[int], list]
    ops: StateOps = field(default_factory=StateOps)
    length: Callable[[Any], int] | None = None
    max_length: int | None = None
    exits: list[ExitHead] = field(default_factory=list)
    output: Callable[[State], Any] = lambda state: state[0]
    sample: Callable[[Any, int], list] | None = None   # (numpy Generator, n) -> payloads

    def __post_init__(self) -> None:
        self.modules = as_module_list(self.modules)
        for e in self.exits:
            if not 0 <= e.after < len(self.modules) - 1:
                raise FluidError(f"exit after module {e.after} is not inside the model's {len(self.modules)} modules")

    @property
    def exit_after(self) -> dict[int, ExitHead]:
        return {e.after: e for e in self.exits}

    def check_payload(self, payload: Any) -> None:
        if self.max_length is not None and self.length is not None:
            n = self.length(payload)
            if n > self.max_length:
                raise FluidError(f"{self.name}: a query of length {n} is longer than the model's maximum "
                                 f"{self.max_length}")
            if n < 1:
                raise FluidError(f"{self.name}: a query of length {n} is empty")

    def to(self, device) -> ModelSpec:
        for m in self.modules:
            m.to(device)
            m.eval()
        for e in self.exits:
            e.head.to(device)
            e.head.eval()
        return self

    def reference(self, payload: Any, device) -> tuple[Any, int | None]:
        """(output row, exit index (position in `exits`) or None) of one query run alone through the
        unsliced model."""
        torch = require_torch()
        self.check_payload(payload)
        exits = self.exit_after
        ordinal = {e.after: k for k, e in enumerate(self.exits)}
        with torch.inference_mode():
            state = self.collate([payload], device)
            for i, m in enumerate(self.modules):
                state = call_module(m, state)
                if i in exits:
                    logits = exits[i].head(state[0] if len(state) == 1 else state)
                    conf = torch.softmax(logits.float(), -1).amax(-1)
                    if bool(conf[0] >= exits[i].threshold):
                        return logits[0].detach().cpu(), ordinal[i]
            return self.output(state)[0].detach().cpu(), None


def as_module_list(model: Any) -> list:
    """The modules of an nn.Sequential, nn.ModuleList, or a list/tuple of modules."""
    torch = require_torch()
    nn = torch.nn
    if isinstance(model, (nn.Sequential, nn.ModuleList)):
        mods = list(model)
    elif isinstance(model, (list, tuple)):
        mods = list(model)
    else:
        raise FluidError(f"a {type(model).__name__} cannot be sliced: give the model as a sequence of modules "
                         "(nn.Sequential, nn.ModuleList or a list)")
    if not mods:
        raise FluidError("the model has no modules to slice")
    for i, m in enumerate(mods):
        if not callable(m):
            raise FluidError(f"the model cannot be sliced: element {i} ({type(m).__name__}) is not a module")
    return mods
