"""Built-in model zoo: published networks lowered to GEMM workloads with exits."""

from __future__ import annotations

from collections.abc import Callable

from fluidnpu.digits_ee import digits_ee
from fluidnpu.errors import FluidError
from fluidnpu.lowering import fold_stem
from fluidnpu.workload import Workload
from fluidnpu.zoo.inceptionv3 import inceptionv3
from fluidnpu.zoo.resnet50 import resnet50

MODELS: dict[str, Callable[[], Workload]] = {
    "resnet50": resnet50,
    "inceptionv3": inceptionv3,
    "digits-ee": digits_ee,
}


def zoo_model(name: str) -> Workload:
    """Build a zoo workload by name (case-insensitive, '-' and '_' ignored), its stem folded where it folds
    (fluidnpu/lowering.py)."""
    key = name.lower().replace("-", "").replace("_", "")
    models = {k.replace("-", "").replace("_", ""): v for k, v in MODELS.items()}
    if key not in models:
        raise FluidError(f"unknown model {name!r}; built-in models: {', '.join(MODELS)} (or a .onnx file)")
    return fold_stem(models[key]())
