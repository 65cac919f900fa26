"""ONNX's neural-network operators composed from partita's core ops: the normalizations
(RMSNormalization, GroupNormalization, LpNormalization, MeanVarianceNormalization), Einsum,
LpPool and GlobalLpPool, the losses (SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss),
RotaryEmbedding and Attention, the recurrent layers (RNN, GRU, LSTM, unrolled over their
static sequence length) and Resize/Upsample; and the normalizations, softmax and dropout of
the core importer (BatchNormalization, InstanceNormalization, LayerNormalization, LRN,
Softmax, LogSoftmax, Dropout).

Each converter builds the op from exact compositions (transpose, reshape, slice, matmul,
reductions, elementwise ops), checks its attributes, and raises naming the node and the fix
for what partita's static graphs cannot express.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ...ir import dtypes as dt
from ...ir.attrs import DenseAttr
from ...ir.graph import Value
from ...ops.quant import QUANT_DTYPES
from .common import OnnxNode, attr_text, lift_1d, onnx_dtype, pad_symmetric, window_params
from .registry import converter


def _axis(n: OnnxNode, x: Value, axis: int, what: str = "axis") -> int:
    r = x.type.rank
    if not -r <= axis < r:
        raise n.error(f"{what} {axis} is outside [-{r}, {r - 1}] for input {x.type}")
    return axis + r if axis < 0 else axis


def _require_float(n: OnnxNode, x: Value, what: str = "the input") -> None:
    if not x.type.dtype.is_float:
        raise n.error(f"{what} {x.type} must be a float tensor")


def _stash(n: OnnxNode, x: Value) -> tuple[Value, dt.DType]:
    """x cast to the node's stash_type (the dtype ONNX computes the statistics in; float32
    by default), and x's own dtype to cast the normalized result back to."""
    stash = onnx_dtype(int(n.attr("stash_type", 1)), f"{n.where}: attribute 'stash_type'")
    if not stash.is_float:
        raise n.error(f"stash_type {stash.name} is not a float type; the statistics are computed in a float type")
    return (x if x.type.dtype is stash else n.emit("cast", x, dtype=stash)), x.type.dtype


def _cast_to(n: OnnxNode, v: Value, d: dt.DType) -> Value:
    return v if v.type.dtype is d else n.emit("cast", v, dtype=d)


# --- normalizations -----------------------------------------------------------------------

@converter("RMSNormalization")
def _rms_norm(n: OnnxNode) -> list[Value | None]:
    x, scale = n.input(0), n.input(1)
    _require_float(n, x)
    axis = _axis(n, x, int(n.attr("axis", -1)))
    norm_shape = list(x.type.shape[axis:])
    eps = float(n.attr("epsilon", 1e-5))
    xs, orig = _stash(n, x)
    axes = list(range(axis, x.type.rank))
    if xs is x and scale.type.dtype is x.type.dtype and list(scale.type.shape) == norm_shape:
        # The statistics are in x's own dtype: one rms_norm with the scale as its weight.
        return [n.emit("rms_norm", x, scale, axes=axes, eps=eps)]
    y = _cast_to(n, n.emit("rms_norm", xs, axes=axes, eps=eps), orig)
    return [n.emit("mul", y, scale)]


@converter("GroupNormalization")
def _group_norm(n: OnnxNode) -> list[Value | None]:
    x, scale, bias = n.input(0), n.input(1), n.input(2)
    _require_float(n, x)
    if x.type.rank < 2:
        raise n.error(f"input {x.type} needs (N, C, ...)")
    groups = int(n.attr("num_groups"))
    shape = list(x.type.shape)
    c = shape[1]
    if groups <= 0 or c % groups:
        raise n.error(f"num_groups {groups} must be positive and divide the {c} channels")
    # Opset 18 took one scale and bias per group, opset 21 one per channel.
    per = groups if n.ctx.opset < 21 else c
    for what, v in (("scale", scale), ("bias", bias)):
        if list(v.type.shape) != [per]:
            raise n.error(f"{what} {v.type} must have shape [{per}] (one per {'group' if per == groups else 'channel'} "
                          f"at opset {n.ctx.opset})")
    xs, orig = _stash(n, x)
    grouped = n.emit("reshape", xs, shape=[shape[0], groups, -1])
    y = n.emit("layer_norm", grouped, axes=[-1], eps=float(n.attr("epsilon", 1e-5)))
    if per == groups:
        y = n.emit("reshape", y, shape=[shape[0], groups, c // groups] + shape[2:])
        y = _cast_to(n, y, orig)
        bshape = [groups, 1] + [1] * (len(shape) - 2)
    else:
        y = _cast_to(n, n.emit("reshape", y, shape=shape), orig)
        bshape = [c] + [1] * (len(shape) - 2)
    y = n.emit("mul", y, n.emit("reshape", scale, shape=bshape))
    y = n.emit("add", y, n.emit("reshape", bias, shape=bshape))
    return [n.emit("reshape", y, shape=shape)]


@converter("LpNormalization")
def _lp_norm(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    _require_float(n, x)
    axis = _axis(n, x, int(n.attr("axis", -1)))
    p = int(n.attr("p", 2))
    if p not in (1, 2):
        raise n.error(f"p {p} must be 1 or 2 (ONNX LpNormalization defines the L1 and L2 norms)")
    if p == 1:
        norm = n.emit("sum", n.emit("abs", x), axes=[axis], keepdim=True)
    else:
        norm = n.emit("sqrt", n.emit("sum", n.emit("mul", x, x), axes=[axis], keepdim=True))
    zero = n.scalar(0, x)
    # A zero norm (an all-zero slice) gives zeros, as ONNX's reference does.
    safe = n.emit("where", n.emit("equal", norm, zero), n.scalar(1, x), norm)
    return [n.emit("where", n.emit("equal", norm, zero), zero, n.emit("div", x, safe))]


@converter("MeanVarianceNormalization")
def _mvn(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    _require_float(n, x)
    axes = [_axis(n, x, int(a), "axes entry") for a in n.attr("axes", [0, 2, 3])]
    mean = n.emit("mean", x, axes=axes, keepdim=True)
    sq_mean = n.emit("mean", n.emit("mul", x, x), axes=axes, keepdim=True)
    # As ONNX's function body: sqrt(E[x^2] - E[x]^2), plus 1e-9 after the square root.
    std = n.emit("sqrt", n.emit("sub", sq_mean, n.emit("mul", mean, mean)))
    return [n.emit("div", n.emit("sub", x, mean), n.emit("add", std, n.scalar(1e-9, x)))]


# --- Einsum -------------------------------------------------------------------------------

def _einsum_terms(n: OnnxNode, eq: str, ins: Sequence[Value]) -> tuple[list[list[str]], list[str]]:
    """The index letters of each operand and of the result, with '...' expanded into one
    made-up label per broadcast dim (right-aligned, as NumPy aligns them)."""
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ins):
        raise n.error(f"equation '{eq}' has {len(terms)} operand term(s) but the node has {len(ins)} input(s)")
    ell = 0
    out_terms: list[list[str]] = []
    for t, v in zip(terms, ins):
        if t.count("...") > 1 or "." in t.replace("...", ""):
            raise n.error(f"term '{t}' of equation '{eq}' is malformed (at most one '...')")
        letters = t.replace("...", "")
        if not all(c.isalpha() for c in letters):
            raise n.error(f"term '{t}' of equation '{eq}' holds a character that is not a letter or '...'")
        k = v.type.rank - len(letters)
        if ("..." in t and k < 0) or ("..." not in t and k != 0):
            raise n.error(f"term '{t}' of equation '{eq}' does not match the rank of input {v.type}")
        ell = max(ell, k if "..." in t else 0)
        out_terms.append([])
    labels = [f"#{i}" for i in range(ell)]
    for j, (t, v) in enumerate(zip(terms, ins)):
        if "..." in t:
            before, after = t.split("...")
            k = v.type.rank - len(before) - len(after)
            out_terms[j] = list(before) + labels[ell - k:] + list(after)
        else:
            out_terms[j] = list(t)
    if arrow:
        if rhs.count("...") > 1:
            raise n.error(f"the result term '{rhs}' of equation '{eq}' holds '...' twice")
        if "..." in rhs:
            before, after = rhs.split("...")
            result = list(before) + labels + list(after)
        else:
            # A result without '...' sums the broadcast dims away.
            result = list(rhs)
        for c in result:
            if not c.startswith("#") and not c.isalpha():
                raise n.error(f"the result term '{rhs}' of equation '{eq}' holds '{c}', not a letter")
            if not any(c in term for term in out_terms):
                raise n.error(f"the result index '{c}' of equation '{eq}' appears in no operand")
        if len(set(result)) != len(result):
            raise n.error(f"the result term '{rhs}' of equation '{eq}' repeats an index")
    else:
        # Implicit form: the broadcast dims, then the letters that appear once, alphabetically.
        counts: dict[str, int] = {}
        for term in out_terms:
            for c in term:
                counts[c] = counts.get(c, 0) + 1
        result = labels + sorted(c for c, k in counts.items() if k == 1 and not c.startswith("#"))
    return out_terms, result


def _einsum_diagonal(n: OnnxNode, x: Value, term: list[str]) -> tuple[Value, list[str]]:
    """x with each repeated index reduced to its diagonal (a strided slice of the two dims
    flattened together: exact)."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        i = term.index(c)
        j = term.index(c, i + 1)
        d = x.type.shape[i]
        if x.type.shape[j] != d:
            raise n.error(f"the repeated index '{c}' spans dims of sizes {d} and {x.type.shape[j]}; they must be equal")
        rest = [k for k in range(len(term)) if k not in (i, j)]
        perm = rest + [i, j]
        if perm != list(range(len(term))):
            x = n.emit("transpose", x, perm=perm)
        lead = [x.type.shape[k] for k in range(len(rest))]
        x = n.emit("reshape", x, shape=lead + [d * d])
        x = n.emit("slice", x, axis=len(lead), start=0, end=d * d, step=d + 1)
        term = [term[k] for k in rest] + [c]
    return x, term


def _einsum_sum(n: OnnxNode, x: Value, term: list[str], keep: set[str]) -> tuple[Value, list[str]]:
    drop = [k for k, c in enumerate(term) if c not in keep]
    if not drop:
        return x, term
    return n.emit("sum", x, axes=drop), [c for c in term if c in keep]


def _permute(n: OnnxNode, x: Value, term: list[str], order: list[str]) -> Value:
    perm = [term.index(c) for c in order]
    return x if perm == list(range(len(perm))) else n.emit("transpose", x, perm=perm)


@converter("Einsum")
def _einsum(n: OnnxNode) -> list[Value | None]:
    eq = attr_text(n.attr("equation"))
    ins = [v for v in n.inputs if v is not None]
    if not ins:
        raise n.error("Einsum needs at least one input")
    for v in ins[1:]:
        if v.type.dtype is not ins[0].type.dtype:
            raise n.error(f"inputs {ins[0].type} and {v.type} must have one element type")
    terms, result = _einsum_terms(n, eq, ins)
    sizes: dict[str, int] = {}
    for v, t in zip(ins, terms):
        for c, d in zip(t, v.type.shape):
            if sizes.get(c, 1) != 1 and d != 1 and sizes[c] != d:
                raise n.error(f"index '{c}' has sizes {sizes[c]} and {d} in equation '{eq}'; they must be equal "
                              "(or 1, to broadcast)")
            sizes[c] = max(sizes.get(c, 1), d) if c in sizes else d
    vals: list[Value] = []
    ts: list[list[str]] = []
    for k, (v, t) in enumerate(zip(ins, terms)):
        v, t = _einsum_diagonal(n, v, list(t))
        others = {c for j, tt in enumerate(terms) if j != k for c in tt}
        v, t = _einsum_sum(n, v, t, set(result) | others)
        vals.append(v)
        ts.append(t)
    x, term = vals[0], ts[0]
    for k in range(1, len(vals)):
        y, yt = vals[k], ts[k]
        later = {c for tt in ts[k + 1:] for c in tt} | set(result)
        # Broadcast a size-1 dim against the other operand's size for the same index.
        x = _widen(n, x, term, sizes, set(yt))
        y = _widen(n, y, yt, sizes, set(term))
        batch = [c for c in term if c in yt and c in later]
        contract = [c for c in term if c in yt and c not in later]
        xo = [c for c in term if c not in yt]
        yo = [c for c in yt if c not in term]
        xp = _permute(n, x, term, batch + xo + contract)
        yp = _permute(n, y, yt, batch + contract + yo)
        bshape = [sizes[c] for c in batch]
        m = math.prod(sizes[c] for c in xo)
        kk = math.prod(sizes[c] for c in contract)
        nn = math.prod(sizes[c] for c in yo)
        xp = n.emit("reshape", xp, shape=bshape + [m, kk])
        yp = n.emit("reshape", yp, shape=bshape + [kk, nn])
        z = n.emit("matmul", xp, yp)
        term = batch + xo + yo
        x = n.emit("reshape", z, shape=[sizes[c] for c in term])
    x, term = _einsum_sum(n, x, term, set(result))
    return [_permute(n, x, term, result)]


def _widen(n: OnnxNode, x: Value, term: list[str], sizes: dict[str, int], other: set[str]) -> Value:
    shape = [sizes[c] if c in other else d for c, d in zip(term, x.type.shape)]
    return x if shape == list(x.type.shape) else n.emit("broadcast_to", x, shape=shape)


# --- LpPool -------------------------------------------------------------------------------

@converter("LpPool")
@lift_1d
def _lp_pool(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    _require_float(n, x)
    kernel = [int(k) for k in n.attr("kernel_shape")]
    nd = len(kernel)
    p = float(n.attr("p", 2))
    if p <= 0:
        raise n.error(f"p {p} must be positive")
    strides, dil, pads = window_params(n, x, kernel)
    ceil = bool(n.attr("ceil_mode", 0))
    powered = n.emit("pow", n.emit("abs", x), n.scalar(p, x))
    if ceil:
        # A ceil-mode window that runs past the end sums only the values it covers: pad the
        # end with zeros so that every window is whole, and pool without ceil mode.
        for d in range(nd):
            size = x.type.shape[2 + d] + pads[d] + pads[nd + d]
            span = (kernel[d] - 1) * dil[d] + 1
            out = -(-(size - span) // strides[d]) + 1
            if (out - 1) * strides[d] >= x.type.shape[2 + d] + pads[d]:
                out -= 1  # the last window must start inside the input or its begin padding
            pads[nd + d] += max((out - 1) * strides[d] + span - size, 0)
    xp, padding = pad_symmetric(n, powered, pads, 0.0, kernel)
    avg = n.emit(f"avg_pool{nd}d", xp, kernel=kernel, stride=strides, padding=padding, dilation=dil,
                 count_include_pad=True)
    total = n.emit("mul", avg, n.scalar(float(math.prod(kernel)), x))
    return [n.emit("pow", total, n.scalar(1.0 / p, x))]


@converter("GlobalLpPool")
def _global_lp_pool(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    _require_float(n, x)
    if x.type.rank < 3:
        raise n.error(f"input {x.type} needs rank >= 3 (N, C, spatial...)")
    p = float(n.attr("p", 2))
    if p <= 0:
        raise n.error(f"p {p} must be positive")
    s = n.emit("sum", n.emit("pow", n.emit("abs", x), n.scalar(p, x)), axes=list(range(2, x.type.rank)),
               keepdim=True)
    return [n.emit("pow", s, n.scalar(1.0 / p, x))]


# --- Resize and Upsample -------------------------------------------------------------------
# Resize is separable: each resized axis is a gather of a few neighbouring input positions
# per output position (the taps), weighted by coefficients that depend only on the static
# sizes and attributes. Both are computed here, as ONNX's reference computes them, and the
# graph gets an index_select of the taps, a multiply by the constant coefficients and a sum
# (nearest mode: one index_select, exact for every dtype).

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _source_coords(mode: str, out: int, size: int, scale: float,
                   roi: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Each output position's coordinate in the input (ONNX's coordinate_transformation_mode),
    and whether it lies outside the input (tf_crop_and_resize only)."""
    y = np.arange(out, dtype=np.float64)
    width = scale * size
    outside = np.zeros(out, bool)
    if mode == "align_corners":
        x = np.zeros(out) if width == 1 else y * (size - 1) / (width - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        x = (np.full(out, (roi[1] - roi[0]) * (size - 1) / 2) if width == 1
             else y * (roi[1] - roi[0]) * (size - 1) / (width - 1))
        x = x + roi[0] * (size - 1)
        outside = (x < 0) | (x > size - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    else:  # half_pixel_symmetric
        offset = size / 2 * (1 - out / width)
        x = offset + (y + 0.5) / scale - 0.5
    return x, outside


def _cubic(ratio: float, a: float) -> list[float]:
    r = ratio
    return [((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
            ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a]


def _cubic_antialias(ratio: float, scale: float, a: float) -> list[float]:
    scale = min(scale, 1.0)

    def k(x: float) -> float:
        x = abs(x)
        if x <= 1:
            return (a + 2) * x ** 3 - (a + 3) * x * x + 1
        return a * x ** 3 - 5 * a * x * x + 8 * a * x - 4 * a if x < 2 else 0.0
    start = int(np.floor(-2 / scale) + 1)
    c = [k(scale * (i - ratio)) for i in range(start, 2 - start)]
    return [v / sum(c) for v in c]


def _linear_antialias(ratio: float, scale: float) -> list[float]:
    scale = min(scale, 1.0)
    start = int(np.floor(-1 / scale) + 1)
    args = (np.arange(start, 2 - start) - ratio) * scale
    c = np.clip(1 - np.abs(args), 0, 1)
    return list(c / c.sum())


def _coefficients(mode: str, ratio: float, scale: float, nearest: str, a: float, antialias: bool) -> list[float]:
    if mode == "nearest":
        if float(ratio).is_integer():
            return [0.0, 1.0]
        up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False,
              "ceil": True}[nearest]
        return [0.0, 1.0] if up else [1.0, 0.0]
    if mode == "linear":
        return _linear_antialias(ratio, scale) if antialias else [1 - ratio, ratio]
    return _cubic_antialias(ratio, scale, a) if antialias else _cubic(ratio, a)


def _taps(x: np.ndarray, size: int, coeffs: np.ndarray, exclude_outside: bool) -> tuple[np.ndarray, np.ndarray]:
    """The input positions (edge-clamped) each output position reads, and their weights."""
    out, taps = coeffs.shape
    pad = int(np.ceil(taps / 2))
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if taps % 2 == 0:
        offset = np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        base = -((taps - 1) // 2)
        offset = np.where(frac <= 0.5, base, base + 1)
    idx = (p + offset)[:, None] + np.arange(taps)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((idx < 0) | (idx >= size), 0.0, coeffs)
        total = coeffs.sum(axis=-1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, size - 1), coeffs


def _resize_axis(n: OnnxNode, x: Value, axis: int, out: int, scale: float, roi: tuple[float, float],
                 opts: dict[str, Any]) -> Value:
    size = x.type.shape[axis]
    if size == 0 or out == 0:
        raise n.error(f"axis {axis} resizes {size} -> {out} elements; empty tensors are not supported")
    src, outside = _source_coords(opts["coord"], out, size, scale, roi)
    whole = np.floor(src)
    ratios = np.where(src == whole, 1.0, src - whole)
    coeffs = np.array([_coefficients(opts["mode"], float(r), scale, opts["nearest"], opts["a"], opts["antialias"])
                       for r in ratios], np.float64)
    idx, coeffs = _taps(src, size, coeffs, opts["exclude_outside"] and opts["mode"] == "cubic")
    shape = list(x.type.shape)
    if opts["mode"] == "nearest":
        pick = idx[np.arange(out), np.argmax(coeffs, axis=1)]
        y = n.emit("index_select", x, n.emit("constant", value=DenseAttr(pick.astype(np.int64))), axis=axis)
    else:
        taps = idx.shape[1]
        flat = n.emit("constant", value=DenseAttr(idx.reshape(-1).astype(np.int64)))
        g = n.emit("index_select", x, flat, axis=axis)
        g = n.emit("reshape", g, shape=shape[:axis] + [out, taps] + shape[axis + 1:])
        w = coeffs.reshape([out, taps] + [1] * (len(shape) - axis - 1)).astype(x.type.dtype.np)
        y = n.emit("sum", n.emit("mul", g, n.emit("constant", value=DenseAttr(w))), axes=[axis + 1])
    if outside.any():
        mask = outside.reshape([out] + [1] * (len(shape) - axis - 1))
        y = n.emit("where", n.emit("constant", value=DenseAttr(mask)), n.scalar(opts["extrapolation"], y), y)
    return y


def _optional_const(n: OnnxNode, i: int, what: str) -> np.ndarray | None:
    """Constant input ``i``, or None when it is absent or empty (opset 11's way to omit it)."""
    if not n.has_input(i):
        return None
    arr = np.asarray(n.const(i, what))
    return None if arr.size == 0 else arr


@converter("Resize", constant_operands=(1, 2, 3))
@converter("Upsample", constant_operands=(1,))
def _resize(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    r = x.type.rank
    upsample = n.proto.op_type == "Upsample"
    if upsample:  # Upsample: (X, scales); Resize (opset >= 11): (X, roi, scales, sizes)
        scales = _optional_const(n, 1, "scales")
        roi_arr, sizes = None, None
    else:
        roi_arr = _optional_const(n, 1, "roi")
        scales = _optional_const(n, 2, "scales")
        sizes = _optional_const(n, 3, "sizes")
    mode = attr_text(n.attr("mode", "nearest"))
    if mode not in ("nearest", "linear", "cubic", "bilinear", "trilinear"):
        raise n.error(f"mode '{mode}' is not one of nearest, linear, cubic")
    if mode in ("bilinear", "trilinear"):
        mode = "linear"  # Upsample-7's names for linear
    default_coord = "asymmetric" if upsample else "half_pixel"
    coord = attr_text(n.attr("coordinate_transformation_mode", default_coord))
    if coord not in _COORD_MODES:
        raise n.error(f"coordinate_transformation_mode '{coord}' is not one of {', '.join(_COORD_MODES)}")
    nearest = attr_text(n.attr("nearest_mode", "floor" if upsample else "round_prefer_floor"))
    if nearest not in _NEAREST_MODES:
        raise n.error(f"nearest_mode '{nearest}' is not one of {', '.join(_NEAREST_MODES)}")
    antialias = bool(n.attr("antialias", 0))
    if antialias and mode == "nearest":
        raise n.error("antialias applies to the linear and cubic modes, not nearest")
    if mode != "nearest" and not x.type.dtype.is_float and x.type.dtype not in QUANT_DTYPES:
        raise n.error(f"{mode} resizing of {x.type} is not supported: the input must be a float tensor or "
                      "i8, u8, i16, u16 (cast it to float first)")
    policy = attr_text(n.attr("keep_aspect_ratio_policy", "stretch"))
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise n.error(f"keep_aspect_ratio_policy '{policy}' is not one of stretch, not_larger, not_smaller")
    axes = [_axis(n, x, int(a), "axes entry") for a in n.attr("axes", list(range(r)))]
    if len(set(axes)) != len(axes):
        raise n.error(f"axes {axes} repeat an axis")
    if (scales is None) == (sizes is None):
        raise n.error("exactly one of scales and sizes must be given (as a constant)")
    given = scales if scales is not None else sizes
    assert given is not None
    if given.ndim != 1 or given.size != len(axes):
        raise n.error(f"{'scales' if scales is not None else 'sizes'} {given.tolist()} must hold one entry per "
                      f"resized axis ({len(axes)})")
    in_shape = list(x.type.shape)
    scale = [1.0] * r
    out = list(in_shape)
    if scales is not None:
        if np.any(scales <= 0):
            raise n.error(f"scales {scales.tolist()} must be positive")
        for a, s in zip(axes, scales.astype(np.float64)):
            # As ONNX's reference: the output size is floor(scale * size), computed in float64.
            scale[a] = float(s)
            out[a] = int(float(s) * in_shape[a])
    else:
        if np.any(sizes < 0):  # type: ignore[operator]
            raise n.error(f"sizes {sizes.tolist()} must be non-negative")  # type: ignore[union-attr]
        for a, s in zip(axes, sizes):  # type: ignore[arg-type]
            out[a] = int(s)
            scale[a] = int(s) / in_shape[a] if in_shape[a] else 1.0
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(scale[a] for a in axes)
            for a in axes:
                scale[a] = s
                out[a] = int(s * in_shape[a] + 0.5)
    roi = [(0.0, 1.0)] * r
    if coord == "tf_crop_and_resize":
        if roi_arr is None:
            raise n.error("coordinate_transformation_mode tf_crop_and_resize needs the roi input (a constant)")
        k = len(axes)
        if roi_arr.size != 2 * k:
            raise n.error(f"roi {roi_arr.tolist()} must hold 2 * {k} entries (starts, then ends, per resized axis)")
        for i, a in enumerate(axes):
            roi[a] = (float(roi_arr[i]), float(roi_arr[k + i]))
    opts = dict(mode=mode, coord=coord, nearest=nearest, antialias=antialias,
                a=float(n.attr("cubic_coeff_a", -0.75)), exclude_outside=bool(n.attr("exclude_outside", 0)),
                extrapolation=float(n.attr("extrapolation_value", 0.0)))
    integer = mode != "nearest" and not x.type.dtype.is_float
    # An integer input interpolates in f32; the result rounds half to even and saturates to
    # the input's dtype (ONNX's saturate_cast), which quantize_linear by a unit scale does.
    y = n.emit("cast", x, dtype=dt.f32) if integer else x
    for a in sorted(axes):
        if math.isclose(scale[a], 1.0) and out[a] == in_shape[a] and roi[a] == (0.0, 1.0):
            continue
        y = _resize_axis(n, y, a, out[a], scale[a], roi[a], opts)
    if integer:
        zero = n.emit("constant", value=DenseAttr(np.zeros((), x.type.dtype.np)))
        y = n.emit("quantize_linear", y, n.scalar(1.0, y), zero)
    return [y]


# --- Attention ----------------------------------------------------------------------------
# ONNX Attention (opsets 23-25) as its reference computes it: q and k each scaled by
# sqrt(scale), an additive bias (0 or -inf) built from attn_mask, is_causal (bottom-right
# aligned: offset by the past length, or per batch by nonpad_kv_seqlen), the sliding window
# and the key padding, a softcap, a softmax whose fully masked rows are 0, and the optional
# qk_matmul_output in each of its four modes. partita's fused attention op has neither the
# softcap nor these outputs, so the node is composed from matmul, exp and reductions.

def _heads(n: OnnxNode, x: Value, heads: int, what: str) -> Value:
    b, t, hidden = x.type.shape
    if heads <= 0 or hidden % heads:
        raise n.error(f"{what} {x.type}: its hidden size {hidden} is not a multiple of the head count {heads}")
    return n.emit("transpose", n.emit("reshape", x, shape=[b, t, heads, hidden // heads]), perm=[0, 2, 1, 3])


def _bias_const(n: OnnxNode, allowed: np.ndarray, like: Value) -> Value:
    return n.emit("constant", value=DenseAttr(np.where(allowed, 0.0, -np.inf).astype(like.type.dtype.np)))


def _where_bias(n: OnnxNode, allowed: Value, like: Value) -> Value:
    return n.emit("where", allowed, n.scalar(0.0, like), n.scalar(-np.inf, like))


def _attention_qkv(n: OnnxNode) -> tuple[Value, Value, Value, bool]:
    """Q, K and V as (batch, heads, seq, head_size), checked, and whether they were given 3-D."""
    q, k, v = n.input(0), n.input(1), n.input(2)
    for what, t in (("Q", q), ("K", k), ("V", v)):
        _require_float(n, t, what)
        if t.type.rank != q.type.rank or t.type.rank not in (3, 4):
            raise n.error(f"Q {q.type}, K {k.type} and V {v.type} must all be 3-D (batch, seq, hidden) or all 4-D "
                          "(batch, heads, seq, head_size)")
    three_d = q.type.rank == 3
    qh, kvh = n.attr("q_num_heads"), n.attr("kv_num_heads")
    if three_d:
        if qh is None or kvh is None:
            raise n.error("3-D inputs need both q_num_heads and kv_num_heads")
        q, k, v = _heads(n, q, int(qh), "Q"), _heads(n, k, int(kvh), "K"), _heads(n, v, int(kvh), "V")
    elif (qh is not None and int(qh) != q.type.shape[1]) or (kvh is not None and int(kvh) != k.type.shape[1]):
        raise n.error(f"q_num_heads {qh} / kv_num_heads {kvh} differ from the head dims of Q {q.type} and K {k.type}")
    return q, k, v, three_d


def _attention_cache(n: OnnxNode, batch: int) -> tuple[Value | None, Value | None, Value | None]:
    """(past_key, past_value, nonpad_kv_seqlen), each None when absent, checked together."""
    past_k = n.input(4) if n.has_input(4) else None
    past_v = n.input(5) if n.has_input(5) else None
    nonpad = n.input(6) if n.has_input(6) else None
    if (past_k is None) != (past_v is None):
        raise n.error("past_key and past_value must be given together")
    if nonpad is not None and past_k is not None:
        raise n.error("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    if nonpad is not None and (nonpad.type.dtype.is_float or nonpad.type.shape != (batch,)):
        raise n.error(f"nonpad_kv_seqlen {nonpad.type} must be an integer tensor of shape [{batch}]")
    return past_k, past_v, nonpad


def _attention_options(n: OnnxNode) -> tuple[bool, int, int, int]:
    """(is_causal, left_window_size, right_window_size, qk_matmul_output_mode), checked."""
    causal = bool(n.attr("is_causal", 0))
    left, right = int(n.attr("left_window_size", -1)), int(n.attr("right_window_size", -1))
    if left < -1 or right < -1:
        raise n.error(f"left_window_size {left} and right_window_size {right} must be -1 (unbounded) or >= 0")
    mode = int(n.attr("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise n.error(f"qk_matmul_output_mode {mode} is not 0, 1, 2 or 3")
    return causal, left, right, mode


def _attention_bias(n: OnnxNode, q: Value, tk: int, offset: int, mask: Value | None, nonpad: Value | None,
                    causal: bool, left: int, right: int) -> tuple[Value, Value | None, Value | None]:
    """The additive bias (0 or -inf) of each query-key pair, with the bool condition of which keys
    each query may attend (the bool attn_mask, is_causal, the window, the key padding; None: all
    of them) and the float attn_mask (None without one), which the bias includes."""
    batch, _, tq, _ = q.type.shape
    per_batch = None
    if nonpad is not None:
        seqlen = _cast_to(n, nonpad, dt.i64)
        per_batch = n.emit("sub", seqlen, n.scalar(tq, seqlen))  # [B]
    ii = np.arange(tq).reshape(tq, 1)
    jj = np.arange(tk).reshape(1, tk)
    allowed: Value | None = None

    def allow(cond: Value | np.ndarray) -> None:
        nonlocal allowed
        v = n.emit("constant", value=DenseAttr(cond)) if isinstance(cond, np.ndarray) else cond
        allowed = v if allowed is None else n.emit("logical_and", allowed, v)

    def frontier_diff() -> Value:
        """(i + offset[b]) - j as [B, 1, Tq, Tk] (the external-cache case)."""
        assert per_batch is not None
        off = n.emit("reshape", per_batch, shape=[batch, 1, 1, 1])
        const = n.emit("constant", value=DenseAttr((ii - jj).astype(np.int64).reshape(1, 1, tq, tk)))
        return n.emit("add", const, off)

    float_mask = None
    if mask is not None:
        if mask.type.dtype is not dt.bool_ and mask.type.dtype is not q.type.dtype:
            raise n.error(f"attn_mask {mask.type} must be bool or of Q's dtype {q.type.dtype.name}")
        pad = tk - mask.type.shape[-1]
        if pad < 0:
            raise n.error(f"attn_mask {mask.type} covers more keys than the {tk} there are")
        if pad:
            fill = (False if mask.type.dtype is dt.bool_ else -np.inf)
            extra = n.emit("full", shape=list(mask.type.shape[:-1]) + [pad], value=fill, dtype=mask.type.dtype)
            mask = n.emit("concat", mask, extra, axis=-1)
        if mask.type.dtype is dt.bool_:
            allow(mask)
        else:
            float_mask = mask
    if causal:
        if per_batch is not None:
            allow(n.emit("greater_equal", frontier_diff(), n.scalar(0, per_batch)))
        else:
            allow(jj <= ii + offset)
    if left >= 0 or right >= 0:
        if per_batch is not None:
            diff = frontier_diff()
            if left >= 0:
                allow(n.emit("less_equal", diff, n.scalar(left, diff)))
            if right >= 0:
                allow(n.emit("greater_equal", diff, n.scalar(-right, diff)))
        else:
            d = ii + offset - jj
            ok = np.ones((tq, tk), bool)
            if left >= 0:
                ok &= d <= left
            if right >= 0:
                ok &= -d <= right
            allow(ok)
    if nonpad is not None:
        keys = n.emit("constant", value=DenseAttr(np.arange(tk, dtype=np.int64).reshape(1, tk)))
        valid = n.emit("less", keys, n.emit("reshape", _cast_to(n, nonpad, dt.i64), shape=[batch, 1]))
        allow(n.emit("reshape", valid, shape=[batch, 1, 1, tk]))
    bias = _bias_const(n, np.ones((tq, tk), bool), q)
    if float_mask is not None:
        bias = n.emit("add", bias, float_mask)
    if allowed is not None:
        bias = n.emit("add", bias, _where_bias(n, allowed, q))
    return bias, allowed, float_mask


def _repeat_kv_heads(n: OnnxNode, k: Value, v: Value, hq: int) -> tuple[Value, Value]:
    """Grouped-query attention: each K/V head serves hq / hk consecutive query heads."""
    hk = k.type.shape[1]
    if hk == hq:
        return k, v
    if hq % hk or v.type.shape[1] != hk:
        raise n.error(f"Q's {hq} heads are not a multiple of K's {hk} (and V's {v.type.shape[1]})")
    rep = hq // hk

    def repeat(t: Value) -> Value:
        b, h, tt, d = t.type.shape
        t = n.emit("broadcast_to", n.emit("unsqueeze", t, axes=[2]), shape=[b, h, rep, tt, d])
        return n.emit("reshape", t, shape=[b, h * rep, tt, d])
    return repeat(k), repeat(v)


def _merge_heads(n: OnnxNode, y: Value) -> Value:
    """(batch, heads, seq, head_size) back to the 3-D (batch, seq, hidden) layout."""
    b, h, t, d = y.type.shape
    return n.emit("reshape", n.emit("transpose", y, perm=[0, 2, 1, 3]), shape=[b, t, h * d])


def _composed_attention(n: OnnxNode, q: Value, k: Value, v: Value, bias: Value, sq: Value,
                        softcap: float | None, mode: int) -> tuple[Value, Value]:
    """Attention composed step by step as ONNX's reference computes it (softcap, softmax
    precision, fully masked rows): (the output, the qk_matmul_output of ``mode``)."""
    scores = n.emit("matmul", n.emit("mul", q, sq), n.emit("transpose", n.emit("mul", k, sq), perm=[0, 1, 3, 2]))
    if softcap is not None:
        c = n.scalar(softcap, scores)
        scores = n.emit("mul", n.emit("tanh", n.emit("div", scores, c)), c)
    biased = n.emit("add", scores, bias)
    qk_out = biased if mode == 2 else scores
    prec = n.attr("softmax_precision")
    x = biased
    if prec is not None:
        pd = onnx_dtype(int(prec), f"{n.where}: attribute 'softmax_precision'")
        if not pd.is_float:
            raise n.error(f"softmax_precision {pd.name} must be a float type")
        x = _cast_to(n, x, pd)
    # Softmax with fully masked (all -inf) rows giving 0, as ONNX's reference.
    ninf = n.scalar(-np.inf, x)
    m = n.emit("max", x, axes=[-1], keepdim=True)
    m = n.emit("where", n.emit("equal", m, ninf), n.scalar(0.0, x), m)
    ex = n.emit("exp", n.emit("sub", x, m))
    tot = n.emit("sum", ex, axes=[-1], keepdim=True)
    tot = n.emit("where", n.emit("equal", tot, n.scalar(0.0, x)), n.scalar(1.0, x), tot)
    p = n.emit("div", ex, tot)
    # A row whose bias is all -inf attends nothing: 0, decided on the bias, not the scores.
    dead = n.emit("equal", n.emit("max", bias, axes=[-1], keepdim=True), n.scalar(-np.inf, bias))
    p = n.emit("where", dead, n.scalar(0.0, p), p)
    if mode == 3:
        qk_out = p
    p = _cast_to(n, p, q.type.dtype)
    return n.emit("matmul", p, v), qk_out


@converter("Attention")
def _attention(n: OnnxNode) -> list[Value | None]:
    """ONNX Attention: the bias from the masks and options, then partita's fused attention op
    where it computes the same, the composed form otherwise."""
    q, k, v, three_d = _attention_qkv(n)
    batch, hq, tq, e = q.type.shape
    mask = n.input(3) if n.has_input(3) else None
    past_k, past_v, nonpad = _attention_cache(n, batch)
    causal, left, right, mode = _attention_options(n)
    softcap = n.attr("softcap")
    scale = n.attr("scale")
    s = float(np.sqrt(1 / np.sqrt(e) if scale is None else float(scale)))
    if past_k is not None and past_v is not None:
        k = n.emit("concat", past_k, k, axis=2)
        v = n.emit("concat", past_v, v, axis=2)
    present_k, present_v = k, v
    offset = past_k.type.shape[2] if past_k is not None else 0
    bias, allowed, float_mask = _attention_bias(n, q, k.type.shape[2], offset, mask, nonpad, causal, left, right)
    k, v = _repeat_kv_heads(n, k, v, hq)
    sq = n.scalar(s, q)
    capped = softcap is not None and float(softcap) > 0
    plain = not (n.used_output(3) or capped or n.attr("softmax_precision") is not None or float_mask is not None)
    if plain and q.type.dtype in (dt.f32, dt.f64):
        # The plain form is partita's fused attention op (PyTorch's SDPA on the torch executor):
        # a bool mask keeps its true scores, and a row it drops entirely gives 0, as ONNX's.
        # (f16/bf16 stay composed: SDPA's reduced-precision CPU kernel rounds differently from
        # ONNX's reference, which computes in the input's dtype step by step.)
        y = n.emit("attention", n.emit("mul", q, sq), n.emit("mul", k, sq), v,
                   *([allowed] if allowed is not None else []), scale=1.0)[0]
        return [_merge_heads(n, y) if three_d else y, present_k, present_v, None]
    y, qk_out = _composed_attention(n, q, k, v, bias, sq, float(softcap) if capped else None, mode)
    return [_merge_heads(n, y) if three_d else y, present_k, present_v, _cast_to(n, qk_out, q.type.dtype)]


# --- RotaryEmbedding ----------------------------------------------------------------------

@converter("RotaryEmbedding")
def _rotary_embedding(n: OnnxNode) -> list[Value | None]:
    x, cos, sin = n.input(0), n.input(1), n.input(2)
    _require_float(n, x)
    orig = list(x.type.shape)
    if x.type.rank == 4:
        x = n.emit("transpose", x, perm=[0, 2, 1, 3])  # [B, S, H, D]
    elif x.type.rank == 3:
        heads = int(n.attr("num_heads", 0))
        b, s, hidden = orig
        if heads <= 0 or hidden % heads:
            raise n.error(f"a 3-D input {x.type} needs num_heads > 0 dividing its hidden size {hidden}")
        x = n.emit("reshape", x, shape=[b, s, heads, hidden // heads])
    else:
        raise n.error(f"input {x.type} must be 4-D (batch, heads, seq, head_size) or 3-D (batch, seq, hidden)")
    b, s, h, d = x.type.shape
    rot = int(n.attr("rotary_embedding_dim", 0)) or d
    if rot > d or rot % 2:
        raise n.error(f"rotary_embedding_dim {rot} must be even and at most the head size {d}")
    half = rot // 2
    if n.has_input(3):
        ids = n.input(3)
        if ids.type.dtype.is_float or list(ids.type.shape) != [b, s]:
            raise n.error(f"position_ids {ids.type} must be an integer tensor of shape [{b}, {s}]")
        flat = n.emit("reshape", ids, shape=[b * s])

        def pick(c: Value) -> Value:
            if c.type.rank != 2:
                raise n.error(f"with position_ids the cos/sin caches must be 2-D (max_pos, dim / 2), got {c.type}")
            return n.emit("reshape", n.emit("index_select", c, flat, axis=0), shape=[b, s, c.type.shape[1]])
        cos, sin = pick(cos), pick(sin)
    for what, c in (("cos_cache", cos), ("sin_cache", sin)):
        if list(c.type.shape) != [b, s, half]:
            raise n.error(f"{what} {c.type} must be [{b}, {s}, {half}] (batch, seq, rotary_embedding_dim / 2), "
                          "or (max_pos, rotary_embedding_dim / 2) with position_ids")
    cos = n.emit("unsqueeze", _cast_to(n, cos, x.type.dtype), axes=[2])
    sin = n.emit("unsqueeze", _cast_to(n, sin, x.type.dtype), axes=[2])
    xr = n.emit("slice", x, axis=3, start=0, end=rot) if rot < d else x
    interleaved = bool(n.attr("interleaved", 0))
    if interleaved:
        x1 = n.emit("slice", xr, axis=3, start=0, end=rot, step=2)
        x2 = n.emit("slice", xr, axis=3, start=1, end=rot, step=2)
    else:
        x1 = n.emit("slice", xr, axis=3, start=0, end=half)
        x2 = n.emit("slice", xr, axis=3, start=half, end=rot)
    real = n.emit("sub", n.emit("mul", cos, x1), n.emit("mul", sin, x2))
    imag = n.emit("add", n.emit("mul", sin, x1), n.emit("mul", cos, x2))
    if interleaved:
        pair = n.emit("concat", n.emit("unsqueeze", real, axes=[4]), n.emit("unsqueeze", imag, axes=[4]), axis=4)
        y = n.emit("reshape", pair, shape=[b, s, h, rot])
    else:
        y = n.emit("concat", real, imag, axis=3)
    if rot < d:
        y = n.emit("concat", y, n.emit("slice", x, axis=3, start=rot, end=d), axis=3)
    if len(orig) == 3:
        return [n.emit("reshape", y, shape=orig)]
    return [n.emit("transpose", y, perm=[0, 2, 1, 3])]


# --- losses -------------------------------------------------------------------------------

def _nll(n: OnnxNode, logp: Value, target: Value, weight: Value | None) -> Value:
    """ONNX NegativeLogLikelihoodLoss of log-probabilities ``logp`` [N, C, d...]: the loss of
    each element is -logp[n, target, d...] * weight[target] (0 where target is ignore_index);
    mean divides the sum by the total weight of the elements not ignored."""
    if logp.type.rank < 2:
        raise n.error(f"input {logp.type} needs (N, C, d1, ...)")
    if target.type.dtype.is_float or target.type.dtype is dt.bool_:
        raise n.error(f"target {target.type} must be an integer tensor of class indices")
    want = [logp.type.shape[0]] + list(logp.type.shape[2:])
    if list(target.type.shape) != want:
        raise n.error(f"target {target.type} must have shape {want} (the input's without its class dim)")
    c = logp.type.shape[1]
    if weight is not None and list(weight.type.shape) != [c]:
        raise n.error(f"weight {weight.type} must have shape [{c}] (one per class)")
    reduction = attr_text(n.attr("reduction", "mean"))
    if reduction not in ("none", "sum", "mean"):
        raise n.error(f"reduction '{reduction}' is not one of none, sum, mean")
    ii = n.attr("ignore_index")
    t = _cast_to(n, target, dt.i64)
    keep = None
    if ii is not None:
        keep = n.emit("not_equal", t, n.scalar(int(ii), t))
        t = n.emit("where", keep, t, n.scalar(0, t))
    picked = n.emit("squeeze", n.emit("gather", logp, n.emit("unsqueeze", t, axes=[1]), axis=1), axes=[1])
    loss = n.emit("neg", picked)
    w = None
    if weight is not None:
        w = n.emit("reshape", n.emit("index_select", weight, n.emit("reshape", t, shape=[-1]), axis=0), shape=want)
    if keep is not None:
        k = n.emit("cast", keep, dtype=logp.type.dtype)
        w = k if w is None else n.emit("mul", w, k)
    if w is not None:
        loss = n.emit("mul", loss, w)
    if reduction == "none":
        return loss
    total = n.emit("sum", loss)
    if reduction == "sum":
        return total
    if w is None:
        return n.emit("div", total, n.scalar(float(math.prod(want)), total))
    return n.emit("div", total, n.emit("sum", w))


@converter("NegativeLogLikelihoodLoss")
def _nll_loss(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    _require_float(n, x)
    return [_nll(n, x, n.input(1), n.input(2) if n.has_input(2) else None)]


@converter("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    _require_float(n, x)
    if x.type.rank < 2:
        raise n.error(f"scores {x.type} need (N, C, d1, ...)")
    logp = n.emit("log_softmax", x, axis=1)
    return [_nll(n, logp, n.input(1), n.input(2) if n.has_input(2) else None), logp]


# --- RNN, GRU, LSTM -----------------------------------------------------------------------
# Unrolled over the static sequence length: the input projections of every step are one
# matmul, each step adds its recurrent matmul and applies the gates. sequence_lens (constant
# or not) becomes a per-step mask: past a sequence's end its state is held and its output 0.

# Activation name -> (default alpha, default beta), as ONNX's RNN activation list defines them.
_ACTIVATIONS: dict[str, tuple[float | None, float | None]] = {
    "relu": (None, None), "tanh": (None, None), "sigmoid": (None, None), "softsign": (None, None),
    "softplus": (None, None), "affine": (1.0, 0.0), "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None),
    "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, None),
}


def _activation(n: OnnxNode, name: str, alpha: float | None, beta: float | None, x: Value) -> Value:
    def c(v: float) -> Value:
        return n.scalar(v, x)
    if name == "relu":
        return n.emit("relu", x)
    if name == "tanh":
        return n.emit("tanh", x)
    if name == "sigmoid":
        return n.emit("sigmoid", x)
    if name == "softsign":
        return n.emit("div", x, n.emit("add", n.emit("abs", x), c(1.0)))
    if name == "softplus":
        return n.emit("log", n.emit("add", n.emit("exp", x), c(1.0)))
    assert alpha is not None
    if name == "affine":
        assert beta is not None
        return n.emit("add", n.emit("mul", x, c(alpha)), c(beta))
    if name == "leakyrelu":
        return n.emit("where", n.emit("less", x, c(0.0)), n.emit("mul", x, c(alpha)), x)
    if name == "thresholdedrelu":
        return n.emit("where", n.emit("greater", x, c(alpha)), x, c(0.0))
    if name == "scaledtanh":
        assert beta is not None
        return n.emit("mul", n.emit("tanh", n.emit("mul", x, c(beta))), c(alpha))
    if name == "hardsigmoid":
        assert beta is not None
        y = n.emit("add", n.emit("mul", x, c(alpha)), c(beta))
        return n.emit("minimum", n.emit("maximum", y, c(0.0)), c(1.0))
    # elu
    neg = n.emit("mul", n.emit("sub", n.emit("exp", x), c(1.0)), c(alpha))
    return n.emit("where", n.emit("less", x, c(0.0)), neg, x)


def _activations(n: OnnxNode, defaults: list[str], dirs: int) -> list[list[Any]]:
    """Per direction, the node's activation functions as callables on a Value."""
    names = [attr_text(a) for a in n.attr("activations", [])] or defaults * dirs
    k = len(defaults)
    if len(names) != k * dirs:
        raise n.error(f"activations {names} must list {k} function(s) per direction ({k * dirs} in all)")
    alphas = list(n.attr("activation_alpha", []))
    betas = list(n.attr("activation_beta", []))
    out: list[list[Any]] = []
    ai = bi = 0
    for d in range(dirs):
        fns = []
        for name in names[d * k:(d + 1) * k]:
            key = name.lower()
            if key not in _ACTIVATIONS:
                raise n.error(f"activation '{name}' is not one of ONNX's RNN activations "
                              f"({', '.join(sorted(_ACTIVATIONS))})")
            da, db = _ACTIVATIONS[key]
            a = b = None
            if da is not None:
                a = float(alphas[ai]) if ai < len(alphas) else da
                ai += 1
            if db is not None:
                b = float(betas[bi]) if bi < len(betas) else db
                bi += 1
            fns.append(lambda x, key=key, a=a, b=b: _activation(n, key, a, b, x))
        out.append(fns)
    return out


def _recurrent(n: OnnxNode, kind: str) -> list[Value | None]:
    x, w, r = n.input(0), n.input(1), n.input(2)
    _require_float(n, x, "X")
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    hidden = int(n.attr("hidden_size", r.type.shape[-1] if r.type.rank == 3 else 0))
    direction = attr_text(n.attr("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise n.error(f"direction '{direction}' is not one of forward, reverse, bidirectional")
    dirs = 2 if direction == "bidirectional" else 1
    layout = int(n.attr("layout", 0))
    if layout not in (0, 1):
        raise n.error(f"layout {layout} is not 0 (seq, batch, ...) or 1 (batch, seq, ...)")
    if x.type.rank != 3:
        raise n.error(f"X {x.type} must be 3-D")
    if layout == 1:
        x = n.emit("transpose", x, perm=[1, 0, 2])
    steps, batch, feat = x.type.shape
    gh = gates * hidden
    for what, v, shape in (("W", w, [dirs, gh, feat]), ("R", r, [dirs, gh, hidden])):
        if list(v.type.shape) != shape:
            raise n.error(f"{what} {v.type} must have shape {shape} (directions, {gates} x hidden_size, ...)")
    clip = n.attr("clip")
    lbr = bool(n.attr("linear_before_reset", 0)) if kind == "GRU" else False
    couple = bool(n.attr("input_forget", 0)) if kind == "LSTM" else False
    defaults = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind]
    acts = _activations(n, defaults, dirs)
    bias = n.input(3) if n.has_input(3) else None
    if bias is not None and list(bias.type.shape) != [dirs, 2 * gh]:
        raise n.error(f"B {bias.type} must have shape [{dirs}, {2 * gh}] (the W biases, then the R biases)")
    lens = n.input(4) if n.has_input(4) else None
    if lens is not None and (lens.type.dtype.is_float or list(lens.type.shape) != [batch]):
        raise n.error(f"sequence_lens {lens.type} must be an integer tensor of shape [{batch}]")
    state_shape = [dirs, batch, hidden]

    def initial(i: int, what: str) -> Value | None:
        if not n.has_input(i):
            return None
        v = n.input(i)
        if layout == 1:
            v = n.emit("transpose", v, perm=[1, 0, 2])
        if list(v.type.shape) != state_shape:
            raise n.error(f"{what} {n.input(i).type} must have shape {state_shape} (in layout {layout}'s order)")
        return v
    h0, c0 = initial(5, "initial_h"), initial(6, "initial_c") if kind == "LSTM" else None
    peep = n.input(7) if kind == "LSTM" and n.has_input(7) else None
    if peep is not None and list(peep.type.shape) != [dirs, 3 * hidden]:
        raise n.error(f"P {peep.type} must have shape [{dirs}, {3 * hidden}] (input, output, forget peepholes)")
    zero_state = n.emit("full", shape=[batch, hidden], value=0.0, dtype=x.type.dtype)
    masks: list[Value] | None = None
    if lens is not None:
        li = _cast_to(n, lens, dt.i64)
        masks = [n.emit("reshape", n.emit("less", n.scalar(t, li), li), shape=[batch, 1]) for t in range(steps)]

    def pick(v: Value, d: int) -> Value:
        return n.emit("squeeze", n.emit("slice", v, axis=0, start=d, end=d + 1), axes=[0])

    def part(v: Value, g: int, axis: int = -1) -> Value:
        return n.emit("slice", v, axis=axis, start=g * hidden, end=(g + 1) * hidden)

    def clipped(v: Value) -> Value:
        if clip is None:
            return v
        return n.emit("minimum", n.emit("maximum", v, n.scalar(-float(clip), v)), n.scalar(float(clip), v))

    ys, hs, cs = [], [], []
    for d in range(dirs):
        wd, rd = pick(w, d), pick(r, d)
        f = acts[d]
        xw = n.emit("matmul", x, n.emit("transpose", wd, perm=[1, 0]))  # [T, B, G*H]
        rt = n.emit("transpose", rd, perm=[1, 0])  # [H, G*H]
        wb = rb = None
        if bias is not None:
            bd = pick(bias, d)
            wb = n.emit("slice", bd, axis=0, start=0, end=gh)
            rb = n.emit("slice", bd, axis=0, start=gh, end=2 * gh)
            xw = n.emit("add", xw, wb)
        h = pick(h0, d) if h0 is not None else zero_state
        c = pick(c0, d) if c0 is not None else zero_state
        pd = pick(peep, d) if peep is not None else None
        reverse = direction == "reverse" or d == 1
        order = range(steps - 1, -1, -1) if reverse else range(steps)
        outs: dict[int, Value] = {}
        for t in order:
            xt = n.emit("squeeze", n.emit("slice", xw, axis=0, start=t, end=t + 1), axes=[0])
            hr = n.emit("matmul", h, rt)
            if rb is not None and not (kind == "GRU" and lbr):
                hr = n.emit("add", hr, rb)
            if kind == "RNN":
                h_new = f[0](clipped(n.emit("add", xt, hr)))
                c_new = c
            elif kind == "GRU":
                if lbr and rb is not None:
                    hr = n.emit("add", hr, rb)
                z = f[0](clipped(n.emit("add", part(xt, 0), part(hr, 0))))
                rr = f[0](clipped(n.emit("add", part(xt, 1), part(hr, 1))))
                if lbr:
                    cand = n.emit("add", part(xt, 2), n.emit("mul", rr, part(hr, 2)))
                else:
                    rh = n.emit("matmul", n.emit("mul", rr, h), part(rt, 2))
                    if rb is not None:
                        rh = n.emit("add", rh, part(rb, 2, 0))
                    cand = n.emit("add", part(xt, 2), rh)
                hh = f[1](clipped(cand))
                one = n.scalar(1.0, z)
                h_new = n.emit("add", n.emit("mul", n.emit("sub", one, z), hh), n.emit("mul", z, h))
                c_new = c
            else:
                pre = n.emit("add", xt, hr)
                gi, go, gf, gc = (part(pre, g) for g in range(4))
                if pd is not None:
                    gi = n.emit("add", gi, n.emit("mul", part(pd, 0, 0), c))
                    gf = n.emit("add", gf, n.emit("mul", part(pd, 2, 0), c))
                i_t = f[0](clipped(gi))
                f_t = n.emit("sub", n.scalar(1.0, i_t), i_t) if couple else f[0](clipped(gf))
                c_new = n.emit("add", n.emit("mul", f_t, c), n.emit("mul", i_t, f[1](clipped(gc))))
                if pd is not None:
                    go = n.emit("add", go, n.emit("mul", part(pd, 1, 0), c_new))
                o_t = f[0](clipped(go))
                h_new = n.emit("mul", o_t, f[2](c_new))
            if masks is not None:
                outs[t] = n.emit("where", masks[t], h_new, zero_state)
                h = n.emit("where", masks[t], h_new, h)
                c = n.emit("where", masks[t], c_new, c)
            else:
                outs[t] = h = h_new
                c = c_new
        ys.append(n.emit("concat", *[n.emit("unsqueeze", outs[t], axes=[0, 1]) for t in range(steps)], axis=0))
        hs.append(n.emit("unsqueeze", h, axes=[0]))
        cs.append(n.emit("unsqueeze", c, axes=[0]))
    y = ys[0] if dirs == 1 else n.emit("concat", *ys, axis=1)  # [T, dirs, B, H]
    yh = hs[0] if dirs == 1 else n.emit("concat", *hs, axis=0)  # [dirs, B, H]
    yc = cs[0] if dirs == 1 else n.emit("concat", *cs, axis=0)
    if layout == 1:
        y = n.emit("transpose", y, perm=[2, 0, 1, 3])
        yh = n.emit("transpose", yh, perm=[1, 0, 2])
        yc = n.emit("transpose", yc, perm=[1, 0, 2])
    return [y, yh, yc] if kind == "LSTM" else [y, yh]


@converter("RNN", "GRU", "LSTM")
def _recurrent_layer(n: OnnxNode) -> list[Value | None]:
    """RNN, GRU and LSTM."""
    return _recurrent(n, n.proto.op_type)


# --- the normalizations, softmax, dropout and LRN of the core importer -----------------------

@converter("BatchNormalization")
def _batch_norm(n: OnnxNode) -> list[Value | None]:
    ins = [n.input(i) for i in range(5)]
    eps = float(n.attr("epsilon", 1e-5))
    stats = [i for i in range(1, n.n_outputs()) if n.used_output(i)]
    # training_mode arrived in opset 14; before it, asking for the statistics meant training.
    training = bool(n.attr("training_mode", 0)) if n.ctx.opset >= 14 else bool(stats)
    if not training:
        if stats:
            raise n.error(f"outputs {stats} (running statistics) exist only with training_mode=1")
        return [n.emit("batch_norm", *ins, eps=eps)]
    return _batch_norm_training(n, ins, eps, float(n.attr("momentum", 0.9)))


def _batch_norm_training(n: OnnxNode, ins: list[Value], eps: float, momentum: float) -> list[Value | None]:
    """ONNX's training form: normalize with the batch mean and biased variance, and blend
    those into the running statistics as ``old * momentum + batch * (1 - momentum)``.

    partita's batch_norm{training} follows PyTorch (momentum weighs the batch, and the
    running variance takes the unbiased estimate), so the statistics are built here and the
    normalization is batch_norm's inference form over them.
    """
    x, scale, bias, run_mean, run_var = ins
    if n.used_output(3) or n.used_output(4):
        # BatchNormalization-9 calls them saved mean and variance, but onnxruntime returns an
        # inverse standard deviation as the second: no one reading is safe to import.
        raise n.error("the saved_mean/saved_var outputs of opset < 14 BatchNormalization are not supported "
                      "(their meaning differs between the spec and runtimes); use opset 14's training_mode")
    if x.type.rank < 2:
        raise n.error(f"input {x.type} needs (N, C, ...)")
    c = x.type.shape[1]
    axes = [0] + list(range(2, x.type.rank))
    per_channel = [1, c] + [1] * (x.type.rank - 2)
    mean = n.emit("mean", x, axes=axes)
    centered = n.emit("sub", x, n.emit("reshape", mean, shape=per_channel))
    var = n.emit("mean", n.emit("mul", centered, centered), axes=axes)
    y = n.emit("batch_norm", x, scale, bias, mean, var, eps=eps)

    def blend(old: Value, batch: Value) -> Value:
        return n.emit("add", n.emit("mul", old, n.scalar(momentum, old)),
                      n.emit("mul", batch, n.scalar(1.0 - momentum, batch)))

    return [y, blend(run_mean, mean), blend(run_var, var)]


@converter("Softmax")
def _softmax(n: OnnxNode) -> list[Value | None]:
    # Opset 13 semantics: a softmax along the single axis (default -1).
    return [n.emit("softmax", n.input(0), axis=int(n.attr("axis", -1)))]


@converter("LogSoftmax")
def _log_softmax(n: OnnxNode) -> list[Value | None]:
    return [n.emit("log_softmax", n.input(0), axis=int(n.attr("axis", -1)))]


@converter("LayerNormalization")
def _layer_norm(n: OnnxNode) -> list[Value | None]:
    stash = onnx_dtype(int(n.attr("stash_type", 1)), f"{n.where}: attribute 'stash_type'")
    if not stash.is_float:
        raise n.error(f"stash_type {stash.name} is not a float type; the statistics are computed in a float type")
    x = n.input(0)
    r = x.type.rank
    axis = int(n.attr("axis", -1))
    if not -r <= axis < r:
        raise n.error(f"axis {axis} is outside [-{r}, {r - 1}] for input {x.type}")
    axis = axis + r if axis < 0 else axis
    norm_shape = list(x.type.shape[axis:])
    ins = [x]
    for i in (1, 2):
        if n.has_input(i):
            v = n.input(i)
            # ONNX lets scale and bias broadcast to the normalized shape; partita wants it exact.
            if list(v.type.shape) != norm_shape:
                v = n.emit("broadcast_to", v, shape=norm_shape)
            ins.append(v)
    if len(ins) == 2 and n.has_input(2):
        raise n.error("a bias without a scale is not supported")
    axes, eps = list(range(axis, r)), float(n.attr("epsilon", 1e-5))
    # ONNX normalizes in stash_type (float32 by default), casts back to x's dtype, then
    # applies the scale and bias in x's dtype.
    xs = x if x.type.dtype is stash else n.emit("cast", x, dtype=stash)
    if xs is x:
        out: list[Value | None] = [n.emit("layer_norm", *ins, axes=axes, eps=eps)]
    else:
        y = n.emit("cast", n.emit("layer_norm", xs, axes=axes, eps=eps), dtype=x.type.dtype)
        for v, op in zip(ins[1:], ("mul", "add")):
            y = n.emit(op, y, v)
        out = [y]
    if n.used_output(1) or n.used_output(2):
        # The saved statistics (in stash_type), kept over the normalized axes as ONNX specifies.
        mean = n.emit("mean", xs, axes=axes, keepdim=True)
        d = n.emit("sub", xs, mean)
        var = n.emit("mean", n.emit("mul", d, d), axes=axes, keepdim=True)
        out += [mean, n.emit("rsqrt", n.emit("add", var, n.scalar(eps, var)))]
    return out


@converter("Dropout", constant_operands=(1, 2))
def _dropout(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    training = False
    if n.has_input(2):
        flag = np.asarray(n.const(2, "training_mode (partita fixes training or inference at import)"))
        training = bool(flag.reshape(-1)[0])
    ratio = 0.5
    if training and n.has_input(1):
        ratio = float(np.asarray(n.const(1, "ratio (the drop probability)")).reshape(-1)[0])
    if not 0.0 <= ratio <= 1.0:
        raise n.error(f"ratio {ratio} is not a drop probability in [0, 1]")
    if not training or ratio == 0.0:
        # Nothing is dropped: the output is the input and the mask is all true.
        out: list[Value | None] = [x]
        if n.used_output(1):
            out.append(n.emit("full", shape=list(x.type.shape), value=True, dtype=dt.bool_))
        return out
    # The mask is a counter-based hash of the element index and the seed (see partita's
    # dropout), not NumPy's or onnxruntime's generator: no importer can reproduce those.
    # Without a seed attribute each node gets its own by position, so masks differ per node
    # yet repeat from run to run.
    seed = int(n.attr("seed", n.index))
    out = [n.emit("dropout", x, p=ratio, train=True, seed=seed)]
    if n.used_output(1):
        # The same seed over ones of the same shape draws the same mask; kept elements come
        # out as 1/(1 - ratio) > 0 (ratio 1 keeps none, and gives zeros).
        ones = n.emit("full", shape=list(x.type.shape), value=1.0, dtype=x.type.dtype)
        kept = n.emit("dropout", ones, p=ratio, train=True, seed=seed)
        out.append(n.emit("greater", kept, n.scalar(0, kept)))
    return out


@converter("LRN")
def _lrn(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    size = int(n.attr("size"))
    alpha, beta, bias = float(n.attr("alpha", 1e-4)), float(n.attr("beta", 0.75)), float(n.attr("bias", 1.0))
    if x.type.rank < 3:
        raise n.error(f"input {x.type} needs a channel axis and at least one spatial axis (N, C, D1, ...)")
    c = x.type.shape[1]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    pads = [0, 0] * x.type.rank
    pads[2], pads[3] = lo, hi
    sq = n.emit("pad", n.emit("mul", x, x), pads=pads)
    # The channel window sum as `size` shifted slices: exact, and no op partita lacks.
    acc = None
    for i in range(size):
        part = n.emit("slice", sq, axis=1, start=i, end=i + c)
        acc = part if acc is None else n.emit("add", acc, part)
    assert acc is not None
    denom = n.emit("add", n.scalar(bias, x), n.emit("mul", acc, n.scalar(alpha / size, x)))
    return [n.emit("div", x, n.emit("pow", denom, n.scalar(beta, x)))]


@converter("InstanceNormalization")
def _instance_norm(n: OnnxNode) -> list[Value | None]:
    x, scale, bias = n.input(0), n.input(1), n.input(2)
    if x.type.rank < 3:
        raise n.error(f"input {x.type} needs (N, C, D1, ...)")
    axes = list(range(2, x.type.rank))
    mean = n.emit("mean", x, axes=axes, keepdim=True)
    centered = n.emit("sub", x, mean)
    var = n.emit("mean", n.emit("mul", centered, centered), axes=axes, keepdim=True)
    eps = n.scalar(float(n.attr("epsilon", 1e-5)), x)
    y = n.emit("div", centered, n.emit("sqrt", n.emit("add", var, eps)))
    per_channel = [x.type.shape[1]] + [1] * (x.type.rank - 2)
    y = n.emit("mul", y, n.emit("reshape", scale, shape=per_channel))
    return [n.emit("add", y, n.emit("reshape", bias, shape=per_channel))]
