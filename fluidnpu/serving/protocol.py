"""The Open Inference (KServe v2) model of `fluidnpu serve`, independent of the transport.

The input is what an edge device sends, as one `InputContract` states it:
raw images as float32 in the data set's own shape and scale (digits-ee: 8x8x1
pixel values 0-16, `digits_ee.PIXEL_MAX`), a batch of N >= 1 per request;
the server scales them to what the network was trained on (values / 16, as
`digits_ee.load_dataset` does) and quantises them. The model metadata, the
server's decoding, `fluidnpu edge` and docs/serving.md's example all come from
that one contract. Outputs per sample: `class` (INT32), `exit` (INT32, which
exit answered), `logits` (FP32, the exit head's). Both transports call
`check_input` and `outputs`; every malformed request is a `BadRequest` with a
one-line message (HTTP 400, gRPC INVALID_ARGUMENT).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

INPUT = "input"
OUTPUTS = ("class", "exit", "logits")
MAX_SAMPLES_PER_REQUEST = 256
DEADLINE_PARAM = "deadline_ms"

_NP = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
       "UINT8": np.uint8, "INT8": np.int8, "INT16": np.int16, "UINT16": np.uint16}


class BadRequest(ValueError):
    """A request the server cannot run (400 / INVALID_ARGUMENT); the server keeps serving."""


@dataclass(frozen=True)
class InputContract:
    """The served model's one input as a client sends it: name, datatype, per-sample HWC shape, and the
    scale of its values. `pixel_max`: the wire carries raw values in [0, pixel_max] and the network sees
    them divided by it; None: the network's own values, any finite number (models with no weights)."""

    hwc: tuple[int, ...]
    pixel_max: float | None = None
    name: str = INPUT
    datatype: str = "FP32"           # little-endian float32 on the wire (the binary extension, gRPC raw)

    def describe(self) -> str:
        """One line for the metadata and the docs."""
        if self.pixel_max is None:
            return "the network's own input values"
        return f"raw pixel values 0-{self.pixel_max:g}, scaled to [0, 1] in the server"

    def metadata(self) -> dict[str, Any]:
        """The KServe v2 tensor metadata; its `parameters` state the scale (HTTP only: gRPC's
        TensorMetadata has no field for it)."""
        meta: dict[str, Any] = {"name": self.name, "datatype": self.datatype, "shape": [-1, *self.hwc]}
        params: dict[str, Any] = {"description": self.describe()}
        if self.pixel_max is not None:
            params.update(min=0.0, max=float(self.pixel_max))
        meta["parameters"] = params
        return meta

    def to_wire(self, x: np.ndarray) -> np.ndarray:
        """What a client sends for network-scale inputs `x` (the test split `load_dataset` gives)."""
        x = np.asarray(x, dtype=np.float32)
        return np.ascontiguousarray(x if self.pixel_max is None else x * np.float32(self.pixel_max))

    def to_network(self, arr: np.ndarray) -> np.ndarray:
        """The network-scale batch of a checked wire batch, or BadRequest if a value is outside the range."""
        if self.pixel_max is None:
            return arr
        lo, hi = float(arr.min()), float(arr.max())
        if lo < 0 or hi > self.pixel_max:
            raise BadRequest(f"input {self.name!r} holds values in [{lo:g}, {hi:g}]; the model takes "
                             f"{self.describe()}")
        return arr / np.float32(self.pixel_max)


def check_runtime_model(model: str, command: str) -> str:
    """The runtime model `model` names (one it has weights for), or a one-line FluidError naming `command`."""
    from fluidnpu.errors import FluidError
    from fluidnpu.host_driver.serving import MODELS

    key = model.lower().replace("_", "-")
    if key not in MODELS:
        verb = "sends the test split of" if command == "edge" else "serves"
        raise FluidError(f"unknown model {model!r}; `fluidnpu {command}` {verb} {', '.join(MODELS)} (the models "
                         f"with weights; a fleet serves zoo models too: serve --fleet, --sessions)")
    return key


def input_contract(model: str, hwc: Sequence[int]) -> InputContract:
    """The input contract of a served model: digits-ee takes the data set's raw pixels; a model the server
    has no data set for takes the network's values."""
    from fluidnpu import digits_ee as D

    hwc = tuple(int(v) for v in hwc)
    if model == D.NAME:
        return InputContract(hwc, D.PIXEL_MAX)
    return InputContract(hwc)


class ServedModel:
    """Name, version, input shape and metadata of the model the server runs.

    `emulated`: a model the server has no weights for (a fleet's zoo models on emulated boards): its only
    output is `exit`, the exit segment each sample left at, and its metadata says so."""

    def __init__(self, name: str, input_hwc: Sequence[int], n_classes: int, n_exits: int,
                 emulated: bool = False) -> None:
        self.name = name
        self.version = "1"
        self.input_hwc = tuple(int(v) for v in input_hwc)
        self.contract = input_contract(name, self.input_hwc)
        self.n_classes = int(n_classes)
        self.n_exits = int(n_exits)
        self.emulated = emulated
        self.outputs = ("exit",) if emulated else OUTPUTS

    def metadata(self) -> dict[str, Any]:
        outs = {"class": {"name": "class", "datatype": "INT32", "shape": [-1]},
                "exit": {"name": "exit", "datatype": "INT32", "shape": [-1]},
                "logits": {"name": "logits", "datatype": "FP32", "shape": [-1, self.n_classes]}}
        meta: dict[str, Any] = {"name": self.name, "versions": [self.version], "platform": "fluidnpu",
                "inputs": [self.contract.metadata()],
                "outputs": [outs[n] for n in self.outputs]}
        if self.emulated:
            meta["parameters"] = {"emulated": True}
        return meta

    def check_name(self, name: str, version: str | None = None) -> None:
        if name != self.name:
            raise NotFound(f"unknown model {name!r}; this server serves {self.name!r}")
        if version not in (None, "", self.version):
            raise NotFound(f"unknown version {version!r} of {self.name!r}; served: {self.version}")

    def check_input(self, name: str, datatype: str, shape: Sequence[int], data: Any) -> np.ndarray:
        """The (N, H, W, C) float32 batch of one input tensor at the network's scale, or BadRequest."""
        c = self.contract
        if name != c.name:
            raise BadRequest(f"unknown input {name!r}; the model's input is {c.name!r}")
        if datatype != c.datatype:
            raise BadRequest(f"input {c.name!r} must be {c.datatype}, got {datatype}")
        shape = [int(v) for v in shape]
        if len(shape) != 1 + len(c.hwc) or tuple(shape[1:]) != c.hwc or shape[0] < 1:
            raise BadRequest(f"input shape must be [N, {', '.join(map(str, c.hwc))}] with N >= 1, "
                             f"got {shape}")
        if shape[0] > MAX_SAMPLES_PER_REQUEST:
            raise BadRequest(f"at most {MAX_SAMPLES_PER_REQUEST} samples per request, got {shape[0]}")
        if isinstance(data, (bytes, bytearray, memoryview)):
            if len(data) != int(np.prod(shape)) * 4:
                raise BadRequest(f"input {c.name!r} of shape {shape} needs {int(np.prod(shape)) * 4} bytes, "
                                 f"got {len(data)}")
            arr = np.frombuffer(data, dtype="<f4")
        else:
            try:
                arr = np.asarray(data, dtype=np.float32).reshape(-1)
            except (TypeError, ValueError) as exc:
                raise BadRequest(f"input {c.name!r} data is not a list of numbers: {exc}") from None
            if arr.size != int(np.prod(shape)):
                raise BadRequest(f"input {c.name!r} of shape {shape} needs {int(np.prod(shape))} values, "
                                 f"got {arr.size}")
        arr = arr.reshape(shape)
        if not np.isfinite(arr).all():
            raise BadRequest(f"input {c.name!r} holds NaN or Inf")
        return self.contract.to_network(arr)

    def check_outputs(self, names: Sequence[str]) -> list[str]:
        for n in names:
            if n not in self.outputs:
                raise BadRequest(f"unknown output {n!r}; the model's outputs are {', '.join(self.outputs)}"
                                 + (" (emulated: no weights, no class scores)" if self.emulated else ""))
        return list(names) or list(self.outputs)


class NotFound(BadRequest):
    """Unknown model or version (HTTP 404 / gRPC NOT_FOUND)."""


def deadline_s(value: Any, default_s: float) -> float:
    """The request's deadline parameter (ms) in seconds, or the server's SLO."""
    if value is None:
        return default_s
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise BadRequest(f"parameter {DEADLINE_PARAM} must be a number of ms, got {value!r}") from None
    if not v > 0 or not np.isfinite(v):
        raise BadRequest(f"parameter {DEADLINE_PARAM} must be > 0 ms, got {value!r}")
    return v / 1e3


def output_arrays(results: Sequence[Any], n_classes: int) -> dict[str, np.ndarray]:
    """The output tensors of a request's sample results (engine.SampleResult)."""
    logits = np.zeros((len(results), n_classes), np.float32)
    for i, r in enumerate(results):
        if r.logits.size == n_classes:
            logits[i] = r.logits
    return {"class": np.array([r.pred for r in results], np.int32),
            "exit": np.array([r.exit for r in results], np.int32), "logits": logits}


def timing_params(results: Sequence[Any], t_received: float, t_sent: float, deadline: float) -> dict[str, Any]:
    """Per-request timings for the response parameters (ms): the scheduler's latency (admission to
    exit, worst sample), the server's whole handling time, and whether the deadline was missed."""
    sched = max(r.latency_s for r in results)
    total = t_sent - t_received
    return {"queue_to_exit_ms": round(sched * 1e3, 4), "server_ms": round(total * 1e3, 4),
            "overhead_ms": round(max(total - sched, 0.0) * 1e3, 4), "deadline_ms": round(deadline * 1e3, 4),
            "deadline_missed": bool(total > deadline)}
