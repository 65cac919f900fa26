"""ONNX's convolution and pooling operators: Conv, ConvTranspose (1-D, 2-D and 3-D),
MaxPool (with its Indices output), AveragePool, GlobalAveragePool and Col2Im (an index_add into
the padded image).

partita's window ops are 2-D and 3-D and pad both sides equally: a 1-D node runs as 2-D with a
unit height (``lift_1d``), and asymmetric or large pads become an explicit pad first
(``pad_symmetric``).
"""

from __future__ import annotations

import math

import numpy as np

from ...ir.attrs import DenseAttr
from ...ir.graph import Value
from .common import OnnxNode, auto_pad_mode, lift_1d, pad_symmetric, window_params
from .registry import converter


def _conv_weight_rank(n: OnnxNode, w: Value, what: str) -> int:
    if w.type.rank not in (4, 5):
        raise n.error(f"weight {w.type} is not 3-D, 4-D or 5-D; only 1-D, 2-D and 3-D {what} are supported")
    return w.type.rank - 2


@converter("Conv")
@lift_1d
def _conv(n: OnnxNode) -> list[Value | None]:
    x, w = n.input(0), n.input(1)
    nd = _conv_weight_rank(n, w, "convolutions")
    kernel = list(n.attr("kernel_shape", w.type.shape[2:]))
    strides, dil, pads = window_params(n, x, kernel)
    x, padding = pad_symmetric(n, x, pads, 0.0)
    ops = [x, w] + ([n.input(2)] if n.has_input(2) else [])
    return [n.emit(f"conv{nd}d", *ops, stride=strides, padding=padding, dilation=dil,
                   groups=int(n.attr("group", 1)))]


@converter("ConvTranspose")
@lift_1d
def _conv_transpose(n: OnnxNode) -> list[Value | None]:
    x, w = n.input(0), n.input(1)
    nd = _conv_weight_rank(n, w, "transposed convolutions")
    if x.type.rank != nd + 2:
        raise n.error(f"input {x.type} does not match the {nd}-D weight {w.type}")
    kernel = list(n.attr("kernel_shape", w.type.shape[2:]))
    if kernel != list(w.type.shape[2:]):
        raise n.error(f"kernel_shape {kernel} differs from the weight's spatial shape {list(w.type.shape[2:])}")
    strides = list(n.attr("strides", [1] * nd))
    dil = list(n.attr("dilations", [1] * nd))
    outpad = list(n.attr("output_padding", [0] * nd))
    group = int(n.attr("group", 1))
    if not len(strides) == len(dil) == len(outpad) == nd:
        raise n.error(f"strides {strides}, dilations {dil} and output_padding {outpad} must have {nd} entries")
    size = x.type.shape[2:]
    # The untrimmed result of each input position scattering its kernel-weighted values.
    full = [s * (i - 1) + (k - 1) * d + 1 for i, k, s, d in zip(size, kernel, strides, dil)]
    target = n.attr("output_shape")
    if target is not None:
        target = list(target)[-nd:]
    auto = auto_pad_mode(n)
    # As ONNX's reference computes it: output position i is position begin + i of the full
    # result extended by output_padding zeros (begin may be negative: zeros in front).
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = target or [i * s for i, s in zip(size, strides)]
        total = [f + p - o for f, p, o in zip(full, outpad, out)]
        begin = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
    else:
        pads = [0] * (2 * nd) if auto == "VALID" else list(n.attr("pads", [0] * (2 * nd)))
        if len(pads) != 2 * nd:
            raise n.error(f"pads {pads} must have {2 * nd} entries (begin and end of each spatial dim)")
        begin = pads[:nd]
        out = target or [f + p - b - e for f, p, b, e in zip(full, outpad, pads[:nd], pads[nd:])]
    end = [f + p - b - o for f, p, b, o in zip(full, outpad, begin, out)]
    op = f"conv_transpose{nd}d"
    if (all(b == e and b >= 0 for b, e in zip(begin, end))
            and all(p < s or p < d for p, s, d in zip(outpad, strides, dil))):
        ops = [x, w] + ([n.input(2)] if n.has_input(2) else [])
        return [n.emit(op, *ops, stride=strides, padding=begin, output_padding=outpad, dilation=dil, groups=group)]
    # Otherwise take the full result and crop or zero-extend each end; the bias comes last so
    # that the added positions get it too.
    y = n.emit(op, x, w, stride=strides, dilation=dil, groups=group)
    pairs = [0, 0, 0, 0] + [v for b, e in zip(begin, end) for v in (max(-b, 0), max(-e, 0))]
    if any(pairs):
        y = n.emit("pad", y, pads=pairs, value=0.0)
    for d in range(nd):
        start = max(begin[d], 0)
        if start or end[d] > 0:
            y = n.emit("slice", y, axis=2 + d, start=start, end=start + out[d])
    if n.has_input(2):
        b = n.emit("reshape", n.input(2), shape=[1, -1] + [1] * nd)
        y = n.emit("add", y, b)
    return [y]


def _onnx_indices(n: OnnxNode, x: Value, xp: Value, idx: Value, pads: list[int], order: int) -> Value:
    """ONNX's MaxPool Indices from partita's: those index each [N, C] plane of the (maybe
    explicitly padded) pool input row-major; ONNX's index the whole unpadded input, row-major
    (storage_order 0) or with the spatial dims column-major (1)."""
    nd = x.type.rank - 2
    size, psize = x.type.shape[2:], xp.type.shape[2:]
    begin = pads[:nd] if xp is not x else [0] * nd
    if xp is not x or (order and nd > 1):
        # A constant table from each padded-plane position to ONNX's in-plane index.
        real = np.indices(psize).reshape(nd, -1) - np.array(begin).reshape(nd, 1)
        inside = np.all((real >= 0) & (real < np.array(size).reshape(nd, 1)), axis=0)
        clipped = np.clip(real, 0, np.array(size).reshape(nd, 1) - 1)
        flat = np.ravel_multi_index(tuple(clipped), size, order="F" if order else "C")
        table = n.emit("constant", value=DenseAttr(np.where(inside, flat, -1).astype(np.int64).reshape(-1, 1)))
        idx = n.emit("reshape", n.emit("embedding", table, idx), shape=list(idx.type.shape))
    batch, chans = x.type.shape[:2]
    planes = np.arange(batch * chans, dtype=np.int64).reshape((batch, chans) + (1,) * nd) * math.prod(size)
    return n.emit("add", idx, n.emit("constant", value=DenseAttr(planes)))


@converter("MaxPool")
@lift_1d
def _max_pool(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    kernel = list(n.attr("kernel_shape"))
    nd = len(kernel)
    strides, dil, pads = window_params(n, x, kernel)
    xp, padding = pad_symmetric(n, x, pads, -math.inf, kernel)
    attrs = dict(kernel=kernel, stride=strides, padding=padding, dilation=dil, ceil_mode=bool(n.attr("ceil_mode", 0)))
    if not n.used_output(1):
        return [n.emit(f"max_pool{nd}d", xp, **attrs)]
    y, idx = n.emit(f"max_pool{nd}d_with_indices", xp, **attrs)
    return [y, _onnx_indices(n, x, xp, idx, pads, int(n.attr("storage_order", 0)))]


@converter("AveragePool")
@lift_1d
def _avg_pool(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    kernel = list(n.attr("kernel_shape"))
    nd = len(kernel)
    strides, dil, pads = window_params(n, x, kernel)
    include = bool(n.attr("count_include_pad", 0))
    ceil = bool(n.attr("ceil_mode", 0))
    explicit = (any(pads[d] != pads[nd + d] for d in range(nd))
                or any(pads[d] > kernel[d] // 2 for d in range(nd)))
    xp, padding = pad_symmetric(n, x, pads, 0.0, kernel)
    op = f"avg_pool{nd}d"
    y = n.emit(op, xp, kernel=kernel, stride=strides, padding=padding, dilation=dil, ceil_mode=ceil,
               count_include_pad=include or explicit)
    if explicit and not include:
        # The padding is now part of the input, so the pool counted it: divide by the share
        # of each window that lies on real input (the same pool over a 0/1 mask).
        ones = n.emit("full", shape=list(x.type.shape), value=1.0, dtype=x.type.dtype)
        mask, _ = pad_symmetric(n, ones, pads, 0.0, kernel)
        share = n.emit(op, mask, kernel=kernel, stride=strides, padding=padding, dilation=dil, ceil_mode=ceil,
                       count_include_pad=True)
        y = n.emit("div", y, share)
    return [y]


@converter("GlobalAveragePool")
def _global_avg_pool(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    if x.type.rank < 3:
        raise n.error(f"input {x.type} needs rank >= 3 (N, C, spatial...)")
    return [n.emit("mean", x, axes=list(range(2, x.type.rank)), keepdim=True)]


def _col2im_geometry(n: OnnxNode, image: list[int], block: list[int]) -> tuple[list[int], list[int], list[int]]:
    """(strides, dilations, pads) of a Col2Im node, checked against its image and block shapes."""
    nd = len(image)
    strides = [int(v) for v in n.attr("strides", [1] * nd)]
    dil = [int(v) for v in n.attr("dilations", [1] * nd)]
    pads = [int(v) for v in n.attr("pads", [0] * (2 * nd))]
    if len(block) != nd or len(strides) != nd or len(dil) != nd or len(pads) != 2 * nd:
        raise n.error(f"image_shape {image}, block_shape {block}, strides {strides}, dilations {dil} and pads "
                      f"{pads} disagree on the number of spatial dims ({nd}; pads has 2 per dim)")
    if min(strides + dil + block + image) < 1 or min(pads) < 0:
        raise n.error(f"image_shape {image}, block_shape {block}, strides {strides} and dilations {dil} must be "
                      f"positive, pads {pads} non-negative")
    return strides, dil, pads


@converter("Col2Im", constant_operands=(1, 2))
def _col2im(n: OnnxNode) -> list[Value | None]:
    """Col2Im (opset 18), the inverse of im2col (torch's ``F.fold``): column (c, k, l) of the
    input [N, C * prod(block), L] is added to image position l's block origin plus offset k.
    One ``index_add`` into the padded image, flattened, with a constant table of those
    positions (overlapping blocks add up), then the padding is cropped."""
    x = n.input(0)
    image = [int(v) for v in n.const(1, "image_shape").reshape(-1)]
    block = [int(v) for v in n.const(2, "block_shape").reshape(-1)]
    strides, dil, pads = _col2im_geometry(n, image, block)
    nd = len(image)
    padded = [i + pads[d] + pads[nd + d] for d, i in enumerate(image)]
    counts = [(p - (dil[d] * (block[d] - 1) + 1)) // strides[d] + 1 for d, p in enumerate(padded)]
    k = math.prod(block)
    if x.type.rank != 3 or x.type.shape[1] % k or x.type.shape[2] != math.prod(counts) or min(counts) < 1:
        raise n.error(f"input {x.type} must be [N, C * {k}, {math.prod(counts)}] for block_shape {block} over "
                      f"image_shape {image} (blocks per dim {counts})")
    batch, c = x.type.shape[0], x.type.shape[1] // k
    # Each (kernel offset, block) pair's position in the padded image, row-major.
    offset = np.indices(block).reshape(nd, k, 1) * np.array(dil).reshape(nd, 1, 1)
    origin = np.indices(counts).reshape(nd, 1, -1) * np.array(strides).reshape(nd, 1, 1)
    table = np.ravel_multi_index(tuple(offset + origin), padded).reshape(-1).astype(np.int64)
    cols = n.emit("reshape", x, shape=[batch, c, k * x.type.shape[2]])
    zeros = n.emit("full", shape=[batch, c, math.prod(padded)], value=0.0 if x.type.dtype.is_float else 0,
                   dtype=x.type.dtype)
    y = n.emit("index_add", zeros, n.emit("constant", value=DenseAttr(table)), cols, axis=2)
    y = n.emit("reshape", y, shape=[batch, c] + padded)
    for d in range(nd):
        if pads[d] or pads[nd + d]:
            y = n.emit("slice", y, axis=2 + d, start=pads[d], end=pads[d] + image[d])
    return [y]
