"""A network's first convolution with its kernel rows folded into channels, as the host feeds it.

An image stem (ResNet-50's 7 x 7 stride-2 `conv1` over 3 channels) has kernel rows of kw * cin words
(21): the fetcher reads each as a run of its own, one command a cycle, so a step of the array's
108 words a row costs about six commands against one cycle of compute (docs/dse.md).
The host can hand the NPU the same layer with contiguous windows instead: output row oy's kh input
rows laid side by side as channels,

    folded[oy, x, ky * cin + c] = padded[sh * oy + ky, x, c]        (zero where ky falls in the padding)

and the kernel re-ordered to match, w'[0, kx, ky * cin + c] = w[ky, kx, c]. The NPU then runs a
1 x kw, stride (1, sw) convolution over (out_h, in_w, kh * cin): the same outputs, the same MACs, and
a window is one run of kw * kh * cin words. The price is the input's size, kh / sh times the image's
(3.5 x for ResNet-50), read once, and the host's copy (`fold_input`). docs/interpretations.md,
"The stem's kernel rows folded into channels".

Which layers fold (`folds`): the network's first layer, a convolution over an image (at most four
channels), ungrouped and undilated, with kernel rows that overlap little (stride >= 2, kh >= 2); a
stride-1 stem would copy its input kh times for no fewer commands a row than a stride-2 one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from fluidnpu.errors import FluidError
from fluidnpu.workload import Layer, Workload

if TYPE_CHECKING:
    from fluidnpu.quantize import FloatNetwork

IMAGE_CHANNELS = 4          # at most this many input channels: an image, whose kernel rows are short


def folds(layer: Layer) -> bool:
    """Whether `layer`, as a network's first layer, is fed with its kernel rows folded (module docstring)."""
    (kh, _), (sh, _) = layer.kernel, layer.stride
    return (layer.kind == "conv" and layer.groups == 1 and layer.dilation == (1, 1) and layer.in_ch <= IMAGE_CHANNELS
            and kh >= 2 and sh >= 2)


def fold_rows(layer: Layer) -> Layer:
    """The 1 x kw convolution the NPU runs for `layer` over its folded input (module docstring)."""
    if layer.kind != "conv" or layer.groups != 1 or layer.dilation != (1, 1):
        raise FluidError(f"layer {layer.name!r}: only an ungrouped, undilated convolution folds its kernel rows")
    (_, iw), (kh, kw), (_, sw), (_, pl, _, pr) = layer.in_hw, layer.kernel, layer.stride, layer.pads
    folded = Layer.conv(layer.name, kh * layer.in_ch, layer.out_ch, (layer.out_hw[0], iw), (1, kw), (1, sw),
                        (0, pl, 0, pr))
    if folded.out_hw != layer.out_hw or folded.macs != layer.macs:
        raise FluidError(f"layer {layer.name!r}: its shape is not its convolution's (R, P, C against its kernel, "
                         f"stride and padding), so it does not fold")
    return folded


def fold_input(stem: Layer, x: np.ndarray) -> np.ndarray:
    """Inputs (n, H, W, cin) of `stem` as its folded layer reads them: (n, out_h, W, kh * cin), same dtype."""
    (ih, iw), (kh, _), (sh, _), (pt, _, _, _) = stem.in_hw, stem.kernel, stem.stride, stem.pads
    if x.ndim != 4 or tuple(x.shape[1:]) != (ih, iw, stem.in_ch):
        raise FluidError(f"layer {stem.name!r} folds inputs of shape (n, {ih}, {iw}, {stem.in_ch}), got {x.shape}")
    oh = stem.out_hw[0]
    out = np.zeros((x.shape[0], oh, iw, kh, stem.in_ch), dtype=x.dtype)
    for ky in range(kh):            # output rows oy whose input row sh * oy + ky - pt is in the image
        lo, hi = max(0, -(-(pt - ky) // sh)), min(oh - 1, (ih - 1 + pt - ky) // sh)
        if lo <= hi:
            out[:, lo:hi + 1, :, ky, :] = x[:, sh * lo + ky - pt:sh * hi + ky - pt + 1:sh]
    return out.reshape(x.shape[0], oh, iw, kh * stem.in_ch)


def fold_weights(stem: Layer, w: np.ndarray) -> np.ndarray:
    """`stem`'s weights (P x C, P ordered (ky, kx, cin)) re-ordered for its folded layer: (kx, ky, cin)."""
    (kh, kw), cin = stem.kernel, stem.in_ch
    if w.shape[0] != kh * kw * cin:
        raise FluidError(f"layer {stem.name!r}: weights must have {kh * kw * cin} rows, got {w.shape[0]}")
    return w.reshape(kh, kw, cin, -1).transpose(1, 0, 2, 3).reshape(w.shape)


def fold_stem(workload: Workload) -> Workload:
    """`workload` with its first layer folded where it `folds` (then `Workload.stem` holds the network's own)."""
    first = workload.backbone[0]
    if workload.stem is not None or not folds(first):
        return workload
    return replace(workload, backbone=(fold_rows(first),) + workload.backbone[1:], stem=first)


def fold_network(net: FloatNetwork) -> FloatNetwork:
    """`net` with its workload's stem folded (`fold_stem`): the first layer's weights re-ordered and the host's
    fold of the network input (`fold_input`) as that layer's host operation."""
    from fluidnpu.quantize import FloatNetwork

    workload = fold_stem(net.workload)
    if workload is net.workload:
        return net
    first = net.layers[0]
    if first.pre is not None:
        raise FluidError(f"layer {first.layer.name!r}: a host operation on the network input does not fold")
    layers = (replace(first, layer=workload.backbone[0], weight=fold_weights(workload.stem, first.weight),
                      pre="fold_rows"),) + net.layers[1:]
    return FloatNetwork(workload, layers, net.input_hwc)
