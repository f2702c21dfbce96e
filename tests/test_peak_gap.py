"""benchmarks/peak_gap.py's line-buffer budget: the input words a block of output pixels touches."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from fluidnpu.workload import Layer


def _peak_gap():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "peak_gap.py"
    spec = importlib.util.spec_from_file_location("peak_gap", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_block_input_words_counts_the_input_rows_a_block_touches():
    """A 3 x 3, pad 1 convolution of an 8 x 8 x 2 input: a block of two output rows touches three input
    rows at the top edge and four inside (the most: 4 x 8 x 2 = 64 words); a block of 80 pixels over two
    samples touches all 8 rows of the first and 3 of the second (176); stride 2 doubles the rows a
    block's output rows cover (an 8-pixel block of a 4 x 4 output: rows 1..5, 5 x 8 x 2 = 80)."""
    block_input_words = _peak_gap().block_input_words
    layer = Layer.conv("c", 2, 4, 8, 3, padding=1)
    assert block_input_words(layer, 1, 16) == 64
    assert block_input_words(layer, 2, 80) == 8 * 8 * 2 + 3 * 8 * 2
    assert block_input_words(layer, 2, 64) == 8 * 8 * 2                     # one sample a block
    strided = Layer.conv("s", 2, 4, 8, 3, stride=2, padding=1)
    assert strided.out_hw == (4, 4) and block_input_words(strided, 1, 8) == 5 * 8 * 2
