"""Built-in model zoo: published networks lowered to GEMM workloads with exits."""

from __future__ import annotations

from typing import Callable

from fluidnpu.errors import FluidError
from fluidnpu.workload import Workload
from fluidnpu.zoo.inceptionv3 import inceptionv3
from fluidnpu.zoo.resnet50 import resnet50

MODELS: dict[str, Callable[[], Workload]] = {
    "resnet50": resnet50,
    "inceptionv3": inceptionv3,
}


def zoo_model(name: str) -> Workload:
    """Build a zoo workload by name (case-insensitive, '-' and '_' ignored)."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in MODELS:
        raise FluidError(f"unknown model {name!r}; built-in models: {', '.join(MODELS)} (or a .onnx file)")
    return MODELS[key]()
