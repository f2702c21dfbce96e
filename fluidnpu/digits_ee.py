"""digits-ee: a small real early-exit CNN for scikit-learn's handwritten digits.

Three exits on 8x8x1 images (pixel values 0..PIXEL_MAX scaled to [0, 1]: what
the network is trained on; `fluidnpu serve` takes the raw pixels and scales
them, fluidnpu/serving/protocol.py `InputContract`):

    conv1 3x3 1->8 pad 1, ReLU           8x8x8   -- exit1: fc 512 -> 10
    conv2 3x3 8->16 stride 2 pad 1, ReLU 4x4x16  -- exit2: fc 256 -> 10
    conv3 3x3 16->32 stride 2 pad 1, ReLU 2x2x32
    fc 128 -> 10                                  -- final exit

Every layer is a GEMM the NPU runs (conv through the DMA's im2col; an FC after
a conv reads the conv's HWC output flattened), so the whole network runs on
the NPU with no host operations between layers. The float weights are trained
by `scripts/train_digits_ee.py` (numpy only, deterministic, < 1 min) and
committed as `fluidnpu/data/digits_ee.npz`; the dataset ships inside
scikit-learn (`sklearn.datasets.load_digits`), nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.workload import Exit, Layer, Workload

NAME = "digits-ee"
WEIGHTS = Path(__file__).parent / "data" / "digits_ee.npz"
INPUT_HWC = (8, 8, 1)
PIXEL_MAX = 16.0        # load_digits().images hold integers 0..16
N_CLASSES = 10
SPLIT_SEED = 0          # the train/test split of the 1797 images
N_TEST = 450
DEFAULT_TAU = 0.8       # softmax top-1 threshold, as in the paper
# exit rates at tau = 0.8 in fixed point on the test split (written by the training script, see docs/runtime.md);
# used only when the weights file is missing, e.g. to run the DSE before training
_FALLBACK_RATES = (0.6, 0.3, 0.1)


def backbone() -> tuple[Layer, ...]:
    return (Layer.conv("conv1", 1, 8, 8, 3, 1, 1),
            Layer.conv("conv2", 8, 16, 8, 3, 2, 1),
            Layer.conv("conv3", 16, 32, 4, 3, 2, 1),
            Layer.fc("fc", 128, N_CLASSES))


def heads() -> tuple[tuple[Layer, ...], ...]:
    return ((Layer.fc("exit1.fc", 512, N_CLASSES),), (Layer.fc("exit2.fc", 256, N_CLASSES),))


RELU = {"conv1": True, "conv2": True, "conv3": True, "fc": False, "exit1.fc": False, "exit2.fc": False}


def exit_rates() -> tuple[float, ...]:
    if WEIGHTS.is_file():
        with np.load(WEIGHTS) as z:
            if "exit_rates" in z:
                r = [float(x) for x in z["exit_rates"]]
                r[-1] = 1.0 - sum(r[:-1])
                return tuple(r)
    return _FALLBACK_RATES


def digits_ee(rates: tuple[float, ...] | None = None) -> Workload:
    """The workload (shapes and exits) for the DSE and the scheduler."""
    bb, hd = backbone(), heads()
    rates = rates or exit_rates()
    exits = (Exit("exit1", 0, hd[0], rates[0]), Exit("exit2", 1, hd[1], rates[1]), Exit("final", 3, (), rates[2]))
    return Workload(NAME, bb, exits, input_shape=(1, 1, 8, 8), source="fluidnpu.digits_ee")


def load_dataset() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): images as (n, 8, 8, 1) float32 in [0, 1]; the fixed split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise FluidError("the digits data set ships with scikit-learn: pip install 'fluidnpu[digits]'") from None
    d = load_digits()
    x = (d.images.astype(np.float32) / np.float32(PIXEL_MAX))[..., None]
    y = d.target.astype(np.int64)
    perm = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    test, train = perm[:N_TEST], perm[N_TEST:]
    return x[train], y[train], x[test], y[test]


def load_float_network(path: str | Path | None = None):
    """The trained float network (fluidnpu.quantize.FloatNetwork) from the committed weights."""
    from fluidnpu.quantize import FloatLayer, FloatNetwork

    path = Path(path) if path else WEIGHTS
    if not path.is_file():
        raise FluidError(f"digits-ee weights {path} are missing: run scripts/train_digits_ee.py")
    wl = digits_ee()
    layers = []
    with np.load(path) as z:
        for s in wl.schedule():
            name = s.layer.name
            if f"{name}.w" not in z:
                raise FluidError(f"{path}: no weights for layer {name!r}")
            layers.append(FloatLayer(s.layer, z[f"{name}.w"].astype(np.float64), z[f"{name}.b"].astype(np.float64),
                                     RELU[name]))
    return FloatNetwork(wl, tuple(layers), INPUT_HWC)


# ---------------------------------------------------------------- a design small enough to simulate
SMALL_DSP, SMALL_BRAM36 = 16, 10


def small_board_data(dsp: int = SMALL_DSP, bram36: int = SMALL_BRAM36) -> dict:
    """A board file (as a dict): ZC706's figures with only `dsp` DSPs and `bram36` BRAM36, no URAM."""
    import json

    from fluidnpu.boards.catalog import BOARD_DIR

    data = json.loads((BOARD_DIR / "zc706.json").read_text())
    data["name"] = f"zc706-{dsp}dsp"
    note = "reduced so that the RTL simulation of the NPU stays small (fluidnpu.digits_ee.small_board_data)"
    data["resources"]["dsp"] = {"value": dsp, "source": note}
    data["resources"]["bram36"] = {"value": bram36, "source": note}
    data["resources"]["uram"] = {"value": 0, "source": note}
    return data


def small_board(dsp: int = SMALL_DSP, bram36: int = SMALL_BRAM36):
    """ZC706's figures with only `dsp` DSPs and `bram36` BRAM36: an NPU the RTL simulation can afford."""
    from fluidnpu.boards.catalog import board_from_data

    return board_from_data(small_board_data(dsp, bram36), f"small board ({dsp} DSPs)")


def default_design(bmax: int = 4, dsp: int = SMALL_DSP):
    """The DSE's pick for digits-ee on `small_board(dsp)` (a Bundle; ~0.1 s)."""
    from fluidnpu.bundle import bundle_from_result
    from fluidnpu.dse.search import DSEOptions, explore

    return bundle_from_result(explore(digits_ee(), small_board(dsp), DSEOptions(bmax=bmax)))
