"""Import an ONNX model (opset 13 and newer) into a partita Graph.

    g = import_onnx("model.onnx")            # or a ModelProto
    outs = partita.run(g, [x])

Graph inputs that are not initializers become ``input`` values; initializers become
``param`` inputs whose arrays go to ``graph.weights``. Every ONNX node is converted by the
one entry for its op type in ``ONNX_TO_PARTITA``; the partita Builder infers each result
type, and the importer compares it with ONNX's own shape inference wherever that is known.
Semantic choices are described in docs/onnx.md.
"""

from __future__ import annotations

import functools
import math
import os
import re
from typing import Any, Container, Mapping, Sequence

import numpy as np

from ..ir import dtypes as dt
from ..ir.attrs import DenseAttr
from ..ir.builder import Builder
from ..ir.diagnostics import PartitaError
from ..ir.graph import Graph, Node, Value
from ..ir.types import Location, TensorType
from ..ops.registry import TypeRuleError, broadcast_shapes
from .onnx_common import (CONSTANT_OPERANDS, ONNX_DTYPES, ONNX_TO_PARTITA, Converter, OnnxImportError, OnnxNode,
                          auto_pad_mode, axes_operand, binary_converter, cast_attrs, lift_1d, onnx_dtype, onnx_package,
                          onnx_type_name, pad_symmetric, reverse_axis, tensor_array, unary_converter, window_params)

MIN_OPSET = 13


_NAME_BAD = re.compile(r"[^A-Za-z0-9_.]")


def _sanitize(name: str, taken: set[str]) -> str:
    """A .pir-printable input name for an ONNX name (which may hold ':' or '/')."""
    base = _NAME_BAD.sub("_", name) or "v"
    if not (base[0].isalpha() or base[0] == "_"):
        base = "v" + base
    out, k = base, 1
    while out in taken:
        out, k = f"{base}_{k}", k + 1
    taken.add(out)
    return out


def constant_operand_inputs(model: Any) -> list[str]:
    """Names of graph inputs (not initializers) whose values an operand in CONSTANT_OPERANDS
    depends on, directly or through the nodes that compute it (a function body's shape
    arithmetic); the walk skips the inputs whose values are not read (Shape's, Size's,
    CastLike's second).

    A caller that knows their values (a test harness, a specializing runtime) passes them
    as ``static_inputs`` to ``import_onnx``.
    """
    g = model.graph
    inits = {t.name for t in g.initializer}
    graph_inputs = {vi.name for vi in g.input} - inits
    producer = {name: node for node in g.node for name in node.output if name}
    out: list[str] = []
    seen: set[str] = set()
    for node in g.node:
        stack = [node.input[i] for i in CONSTANT_OPERANDS.get(node.op_type, ()) if i < len(node.input)]
        while stack:
            name = stack.pop()
            if not name or name in seen:
                continue
            seen.add(name)
            if name in graph_inputs:
                out.append(name)
            elif name in producer:
                node_in = producer[name]
                free = _VALUE_FREE_INPUTS.get(node_in.op_type, ())
                stack.extend(x for k, x in enumerate(node_in.input) if k not in free)
    return out


# --- converters ---------------------------------------------------------------------------

def _div(n: OnnxNode) -> list[Value | None]:
    x, y = n.input(0), n.input(1)
    if x.type.dtype.is_float:
        return [n.emit("div", x, y)]
    # ONNX integer Div truncates toward zero and keeps the integer type (partita's div is true
    # division). ONNX leaves a zero divisor undefined; int_div raises there, as PyTorch does.
    return [n.emit("int_div", x, y, rounding="trunc")]


def _identity(n: OnnxNode) -> list[Value | None]:
    return [n.input(0)]


def _pow(n: OnnxNode) -> list[Value | None]:
    x, y = n.input(0), n.input(1)
    # ONNX Pow keeps the base's type whatever the exponent's; partita would promote.
    if y.type.dtype is not x.type.dtype:
        y = n.emit("cast", y, dtype=x.type.dtype)
    return [n.emit("pow", x, y)]


def _cast(n: OnnxNode) -> list[Value | None]:
    return [n.emit("cast", n.input(0), dtype=onnx_dtype(n.attr("to"), f"{n.where}: attribute 'to'"), **cast_attrs(n))]


def _constant(n: OnnxNode) -> list[Value | None]:
    keys = [k for k in n.attrs if k in ("value", "value_float", "value_int", "value_floats", "value_ints")]
    if len(keys) != 1:
        raise n.error(f"needs exactly one of value/value_float(s)/value_int(s); has {sorted(n.attrs)}")
    k = keys[0]
    v = n.attrs[k]
    if k == "value":
        arr = n.tensor_attr("value")
    elif k in ("value_float", "value_floats"):
        arr = np.array(v, dtype=np.float32)
    else:
        arr = np.array(v, dtype=np.int64)
    n.ctx.consts[n.proto.output[0]] = arr
    return [n.emit("constant", value=DenseAttr(_np_for_partita(arr, n.where)))]


def _np_for_partita(arr: np.ndarray, what: str) -> np.ndarray:
    try:
        dt.from_numpy(arr.dtype)
    except KeyError:
        raise OnnxImportError(f"{what}: tensor of NumPy dtype {arr.dtype} has no partita dtype") from None
    return arr


def _gemm(n: OnnxNode) -> list[Value | None]:
    a, b = n.input(0), n.input(1)
    if a.type.rank != 2 or b.type.rank != 2:
        raise n.error(f"A {a.type} and B {b.type} must both be 2-D")
    if n.attr("transA", 0):
        a = n.emit("transpose", a, perm=[1, 0])
    if n.attr("transB", 0):
        b = n.emit("transpose", b, perm=[1, 0])
    y = n.emit("matmul", a, b)
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    if alpha != 1.0:
        y = n.emit("mul", y, n.scalar(alpha, y))
    if n.has_input(2) and beta != 0.0:
        c = n.input(2)
        if beta != 1.0:
            c = n.emit("mul", c, n.scalar(beta, c))
        y = n.emit("add", y, c)
    return [y]


def _conv_weight_rank(n: OnnxNode, w: Value, what: str) -> int:
    if w.type.rank not in (4, 5):
        raise n.error(f"weight {w.type} is not 3-D, 4-D or 5-D; only 1-D, 2-D and 3-D {what} are supported")
    return w.type.rank - 2


def _conv(n: OnnxNode) -> list[Value | None]:
    x, w = n.input(0), n.input(1)
    nd = _conv_weight_rank(n, w, "convolutions")
    kernel = list(n.attr("kernel_shape", w.type.shape[2:]))
    strides, dil, pads = window_params(n, x, kernel)
    x, padding = pad_symmetric(n, x, pads, 0.0)
    ops = [x, w] + ([n.input(2)] if n.has_input(2) else [])
    return [n.emit(f"conv{nd}d", *ops, stride=strides, padding=padding, dilation=dil,
                   groups=int(n.attr("group", 1)))]


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


def _global_avg_pool(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    if x.type.rank < 3:
        raise n.error(f"input {x.type} needs rank >= 3 (N, C, spatial...)")
    return [n.emit("mean", x, axes=list(range(2, x.type.rank)), keepdim=True)]


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


def _softmax(n: OnnxNode) -> list[Value | None]:
    # Opset 13 semantics: a softmax along the single axis (default -1).
    return [n.emit("softmax", n.input(0), axis=int(n.attr("axis", -1)))]


def _reshape(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    shape = [int(s) for s in n.const(1, "the target shape")]
    allowzero = bool(n.attr("allowzero", 0))
    if not allowzero:
        if any(s == 0 for s in shape[x.type.rank:]):
            raise n.error(f"shape {shape}: a 0 past the input's rank {x.type.rank} has no dim to copy")
        # 0 copies the input's dim at the same position.
        shape = [x.type.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    if shape.count(-1) > 1:
        raise n.error(f"shape {shape} has more than one -1")
    return [n.emit("reshape", x, shape=shape)]


def _flatten(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    r = x.type.rank
    axis = int(n.attr("axis", 1))
    if not -r <= axis <= r:
        raise n.error(f"axis {axis} is outside [-{r}, {r}] for input {x.type}")
    axis = axis + r if axis < 0 else axis
    outer = int(np.prod(x.type.shape[:axis], dtype=np.int64))
    inner = int(np.prod(x.type.shape[axis:], dtype=np.int64))
    return [n.emit("reshape", x, shape=[outer, inner])]


def _transpose(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    perm = n.attr("perm")
    return [n.emit("transpose", x, perm=list(perm) if perm is not None else list(range(x.type.rank))[::-1])]


def _concat(n: OnnxNode) -> list[Value | None]:
    ins = [v for v in n.inputs if v is not None]
    return [n.emit("concat", *ins, axis=int(n.attr("axis")))]


def _unsqueeze(n: OnnxNode) -> list[Value | None]:
    axes = axes_operand(n, 1, 13)
    if axes is None:
        raise n.error("Unsqueeze needs axes")
    return [n.emit("unsqueeze", n.input(0), axes=axes)]


def _squeeze(n: OnnxNode) -> list[Value | None]:
    return [n.emit("squeeze", n.input(0), axes=axes_operand(n, 1, 13))]


def _split(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    axis = int(n.attr("axis", 0))
    r = x.type.rank
    if not -r <= axis < r:
        raise n.error(f"axis {axis} is outside [-{r}, {r - 1}] for input {x.type}")
    size = x.type.shape[axis + r if axis < 0 else axis]
    if n.has_input(1):  # opset >= 13: sizes as an input
        split = n.const(1, "the split sizes")
        if split.ndim != 1:
            raise n.error(f"the split sizes must be a 1-D tensor, got shape {list(split.shape)}")
        sizes = [int(s) for s in split]
    else:
        parts = int(n.attr("num_outputs", n.n_outputs()))
        if n.ctx.opset >= 18 and "num_outputs" not in n.attrs:
            raise n.error("since opset 18 Split needs either the 'split' input or 'num_outputs'")
        # ONNX: equal chunks of ceil(size / parts), the last one smaller.
        chunk = -(-size // parts)
        sizes = [min(chunk, size - k * chunk) for k in range(parts)]
        if any(s <= 0 for s in sizes):
            raise n.error(f"cannot split dim of size {size} into {parts} non-empty parts")
    if len(sizes) != n.n_outputs():
        raise n.error(f"{len(sizes)} split sizes {sizes} for {n.n_outputs()} outputs")
    out = n.emit("split", x, axis=axis, sizes=sizes)
    return list(out) if isinstance(out, tuple) else [out]


def _gather(n: OnnxNode) -> list[Value | None]:
    x, idx = n.input(0), n.input(1)
    r = x.type.rank
    axis = int(n.attr("axis", 0))
    if not -r <= axis < r:
        raise n.error(f"axis {axis} is outside [-{r}, {r - 1}] for input {x.type}")
    axis = axis + r if axis < 0 else axis
    dim = x.type.shape[axis]
    # ONNX allows negative indices (counted from the end); partita's index_select does not.
    neg = n.emit("less", idx, n.scalar(0, idx))
    idx = n.emit("where", neg, n.emit("add", idx, n.scalar(dim, idx)), idx)
    flat = n.emit("reshape", idx, shape=[idx.type.numel])
    y = n.emit("index_select", x, flat, axis=axis)
    shape = list(x.type.shape[:axis]) + list(idx.type.shape) + list(x.type.shape[axis + 1:])
    return [n.emit("reshape", y, shape=shape)]


def _reduce(op: str, axes_input_since: int) -> Converter:
    def convert(n: OnnxNode) -> list[Value | None]:
        x = n.input(0)
        axes = axes_operand(n, 1, axes_input_since)
        keep = bool(n.attr("keepdims", 1))
        if not axes:
            if n.attr("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.type.rank))
        return [n.emit(op, x, axes=axes, keepdim=keep)]
    return convert


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


def _variadic(op: str) -> Converter:
    """Sum/Max/Min/Mean over any number of broadcasting inputs, folded left to right."""
    def convert(n: OnnxNode) -> list[Value | None]:
        vals = [n.input(i) for i in range(len(n.inputs))]
        acc = vals[0]
        for v in vals[1:]:
            acc = n.emit(op, acc, v)
        return [acc]
    return convert


def _leaky_relu(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    neg = n.emit("mul", x, n.scalar(float(n.attr("alpha", 0.01)), x))
    return [n.emit("where", n.emit("less", x, n.scalar(0, x)), neg, x)]


def _elu_like(n: OnnxNode, alpha: float, gamma: float) -> Value:
    x = n.input(0)
    neg = n.emit("mul", n.emit("sub", n.emit("exp", x), n.scalar(1, x)), n.scalar(alpha, x))
    y = n.emit("where", n.emit("less", x, n.scalar(0, x)), neg, x)
    return y if gamma == 1.0 else n.emit("mul", y, n.scalar(gamma, x))


def _elu(n: OnnxNode) -> list[Value | None]:
    return [_elu_like(n, float(n.attr("alpha", 1.0)), 1.0)]


def _selu(n: OnnxNode) -> list[Value | None]:
    return [_elu_like(n, float(n.attr("alpha", 1.67326319217681884765625)),
                      float(n.attr("gamma", 1.05070102214813232421875)))]


def _prelu(n: OnnxNode) -> list[Value | None]:
    x, slope = n.input(0), n.input(1)
    try:
        broadcast_shapes(tuple(x.type.shape), tuple(slope.type.shape))
    except TypeRuleError:
        # Opset < 7 applied a 1-D slope per channel (axis 1); the version converter keeps
        # such models as they are, so read the slope that way when it cannot broadcast.
        if slope.type.rank == 1 and x.type.rank >= 2 and slope.type.shape[0] == x.type.shape[1]:
            slope = n.emit("reshape", slope, shape=[slope.type.shape[0]] + [1] * (x.type.rank - 2))
    return [n.emit("where", n.emit("less", x, n.scalar(0, x)), n.emit("mul", x, slope), x)]


def _softplus(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    return [n.emit("log", n.emit("add", n.emit("exp", x), n.scalar(1, x)))]


def _softsign(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    return [n.emit("div", x, n.emit("add", n.emit("abs", x), n.scalar(1, x)))]


def _sign(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    zero = n.scalar(0, x)
    pos = n.emit("cast", n.emit("greater", x, zero), dtype=x.type.dtype)
    neg = n.emit("cast", n.emit("less", x, zero), dtype=x.type.dtype)
    return [n.emit("sub", pos, neg)]


def _log_softmax(n: OnnxNode) -> list[Value | None]:
    return [n.emit("log_softmax", n.input(0), axis=int(n.attr("axis", -1)))]


def _clip(n: OnnxNode) -> list[Value | None]:
    y = n.input(0)
    if n.has_input(1):
        y = n.emit("maximum", y, n.input(1))
    if n.has_input(2):
        y = n.emit("minimum", y, n.input(2))
    return [y]


def _constant_of_shape(n: OnnxNode) -> list[Value | None]:
    shape = [int(d) for d in np.asarray(n.const(0, "shape")).reshape(-1)]
    arr = np.zeros(1, np.float32) if n.attr("value") is None else n.tensor_attr("value").reshape(-1)
    if arr.size != 1:
        raise n.error(f"attribute 'value' must hold one element (the fill value); it holds {arr.size}")
    dtype = dt.from_numpy(_np_for_partita(arr, n.where).dtype)
    if int(np.prod(shape)) <= _SMALL_CONST:
        # Small fills can feed operands that must be constants (a Reshape shape, Pad pads).
        n.ctx.consts[n.proto.output[0]] = np.full(shape, arr[0], dtype=arr.dtype)
    return [n.emit("full", shape=shape, value=arr[0].item(), dtype=dtype)]


# Largest constant (in elements) the importer also keeps as a NumPy array for later
# constant-operand reads; weight-sized fills stay only in the graph.
_SMALL_CONST = 1024
# Largest input (in elements) constant propagation evaluates a node on.
_FOLD_INPUT_LIMIT = 1 << 16
# Inputs of which an op reads only the type or shape, never the values: they need not be
# known for the op to fold, nor bound for an operand computed from them.
_VALUE_FREE_INPUTS: dict[str, tuple[int, ...]] = {"CastLike": (1,), "Shape": (0,), "Size": (0,), "EyeLike": (0,)}
# Op types whose result's shape or values depend on data in ways import does not evaluate.
_DATA_DEPENDENT = frozenset({"NonZero", "Unique", "Compress", "NonMaxSuppression", "TopK", "RandomNormal",
                             "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"})


def _shape(n: OnnxNode) -> list[Value | None]:
    # partita shapes are static, so Shape is a constant.
    dims = list(n.input(0).type.shape)
    r = len(dims)
    start, end = int(n.attr("start", 0)), n.attr("end", None)
    arr = np.array(dims[slice(start, r if end is None else int(end))], dtype=np.int64)
    n.ctx.consts[n.proto.output[0]] = arr
    return [n.emit("constant", value=DenseAttr(arr))]


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


def _pad(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    mode = n.attr("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise n.error(f"mode '{mode}' is not supported (constant, reflect, edge and wrap are)")
    r = x.type.rank
    pads = [int(p) for p in np.asarray(n.const(1, "pads")).reshape(-1)]
    axes = list(range(r))
    if n.has_input(3):
        axes = [int(v) for v in np.asarray(n.const(3, "axes")).reshape(-1)]
        if any(not -r <= a < r for a in axes):
            raise n.error(f"axes {axes} are outside [-{r}, {r - 1}] for input {x.type}")
        axes = [a + r if a < 0 else a for a in axes]
    if len(pads) != 2 * len(axes):
        raise n.error(f"pads has {len(pads)} entries; {len(axes)} padded axes need {2 * len(axes)}")
    pairs = [0, 0] * r
    for k, a in enumerate(axes):
        pairs[2 * a], pairs[2 * a + 1] = pads[k], pads[k + len(axes)]
    # Negative pads remove elements. Cropping first and padding what is left is what
    # onnxruntime does, and it matters for edge, reflect and wrap (the new border is copied).
    for axis in range(r):
        cut_before, cut_after = max(-pairs[2 * axis], 0), max(-pairs[2 * axis + 1], 0)
        if cut_before or cut_after:
            dim = x.type.shape[axis]
            if cut_before + cut_after > dim:
                raise n.error(f"negative pads remove {cut_before} + {cut_after} elements from axis {axis}, "
                              f"which has only {dim}")
            x = n.emit("slice", x, axis=axis, start=cut_before, end=dim - cut_after)
    pairs = [max(p, 0) for p in pairs]
    if not any(pairs):
        return [x]
    if mode != "constant":
        return [_pad_by_copies(n, x, pairs, mode)]
    value: Any = 0
    if n.has_input(2):
        value = np.asarray(n.const(2, "constant_value")).reshape(-1)[0].item()
    return [n.emit("pad", x, pads=pairs, value=value)]


def _pad_by_copies(n: OnnxNode, x: Value, pairs: list[int], mode: str) -> Value:
    """Reflect, edge or wrap padding as a concat of slices of the input: exact, and built
    from ops partita has (its pad op fills a constant only)."""
    y = x
    for axis in range(x.type.rank):
        before, after = pairs[2 * axis], pairs[2 * axis + 1]
        if before == 0 and after == 0:
            continue
        dim = y.type.shape[axis]
        if dim == 0:
            raise n.error(f"{mode} padding of axis {axis}, which is empty, has no values to copy")
        if mode == "reflect" and (before >= dim or after >= dim):
            raise n.error(f"reflect pads ({before}, {after}) on axis {axis} must be smaller than its size {dim}")

        def part(start: int, end: int) -> Value:
            return n.emit("slice", y, axis=axis, start=start, end=end)

        if mode == "reflect":
            left = [part(i, i + 1) for i in range(before, 0, -1)]
            right = [part(dim - 2 - i, dim - 1 - i) for i in range(after)]
        elif mode == "edge":
            left, right = [part(0, 1)] * before, [part(dim - 1, dim)] * after
        else:
            # Wrap: the input repeats around the axis as on a torus, so a pad longer than
            # the axis is whole copies plus the part that is left over.
            left = ([part(dim - before % dim, dim)] if before % dim else []) + [y] * (before // dim)
            right = [y] * (after // dim) + ([part(0, after % dim)] if after % dim else [])
        y = n.emit("concat", *left, y, *right, axis=axis)
    return y


def _shrink(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    lambd, bias = float(n.attr("lambd", 0.5)), float(n.attr("bias", 0.0))
    lo = n.emit("less", x, n.scalar(-lambd, x))
    hi = n.emit("greater", x, n.scalar(lambd, x))
    inner = n.emit("where", hi, n.emit("sub", x, n.scalar(bias, x)), n.scalar(0, x))
    return [n.emit("where", lo, n.emit("add", x, n.scalar(bias, x)), inner)]


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


def _expand(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    shape = [int(d) for d in np.asarray(n.const(1, "shape")).reshape(-1)]
    # ONNX Expand broadcasts both ways: a 1 in `shape` keeps the input's dim.
    try:
        out = broadcast_shapes(tuple(x.type.shape), tuple(shape), op="Expand")
    except TypeRuleError:
        raise n.error(f"shape {shape} does not broadcast with input {x.type}") from None
    return [n.emit("broadcast_to", x, shape=list(out))]


def _tile(n: OnnxNode) -> list[Value | None]:
    y = n.input(0)
    reps = [int(r) for r in np.asarray(n.const(1, "repeats")).reshape(-1)]
    if len(reps) != y.type.rank or any(r < 1 for r in reps):
        raise n.error(f"repeats {reps} must hold one count >= 1 per input dim ({y.type})")
    for axis, k in enumerate(reps):
        if k > 1:
            y = n.emit("concat", *([y] * k), axis=axis)
    return [y]


def _slice(n: OnnxNode) -> list[Value | None]:
    y = n.input(0)
    r = y.type.rank
    starts = [int(v) for v in np.asarray(n.const(1, "starts")).reshape(-1)]
    ends = [int(v) for v in np.asarray(n.const(2, "ends")).reshape(-1)]
    axes = list(range(len(starts)))
    if n.has_input(3):
        axes = [int(v) for v in np.asarray(n.const(3, "axes")).reshape(-1)]
    steps = [1] * len(starts)
    if n.has_input(4):
        steps = [int(v) for v in np.asarray(n.const(4, "steps")).reshape(-1)]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise n.error(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} must have one entry per "
                      "sliced axis")
    seen: set[int] = set()
    for a, s, e, st in zip(axes, starts, ends, steps):
        if not -r <= a < r:
            raise n.error(f"axis {a} is outside [-{r}, {r - 1}] for input {y.type}")
        a = a + r if a < 0 else a
        if a in seen:
            raise n.error(f"axis {a} is sliced twice (axes {axes})")
        seen.add(a)
        if st == 0:
            raise n.error(f"step 0 on axis {a}; steps must be non-zero")
        dim = y.type.shape[a]
        # ONNX's effective bounds: negatives count from the end, then clamp to [0, dim] going
        # forward, or to [0, dim - 1] (start) and [-1, dim - 1] (end) going backward. The
        # INT64 sentinels (INT_MAX, INT_MIN) land on the ends of the axis this way.
        s, e = s + dim if s < 0 else s, e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
            if (s, e, st) != (0, dim, 1):
                y = n.emit("slice", y, axis=a, start=s, end=max(e, s), step=st)
            continue
        picked = range(min(max(s, 0), dim - 1), min(max(e, -1), dim - 1), st) if dim else range(0)
        if len(picked) == 0:
            y = n.emit("slice", y, axis=a, start=0, end=0)
            continue
        # partita slices forward only: take the same elements forward, then reverse them.
        lo, hi = picked[-1], picked[0] + 1
        if (lo, hi, -st) != (0, dim, 1):
            y = n.emit("slice", y, axis=a, start=lo, end=hi, step=-st)
        y = reverse_axis(n, y, a)
    return [y]


SEQUENCE_OPERANDS: dict[str, tuple[int, ...]] = {
    "SequenceInsert": (0,), "SequenceErase": (0,), "SequenceAt": (0,), "SequenceLength": (0,),
    "ConcatFromSequence": (0,),
}

SeqResult = list[Value | list[Value] | None]


def _position(n: OnnxNode, i: int, length: int, upper: int) -> int:
    """Constant position input ``i`` normalized into [0, upper] (ONNX counts negatives from the back)."""
    arr = np.asarray(n.const(i, "the position"))
    if arr.size != 1 or arr.dtype.kind not in "iu":
        raise n.error(f"the position must be an integer scalar; got {arr.dtype}{list(arr.shape)}")
    pos = int(arr.reshape(()))
    if not -length <= pos <= upper:
        raise n.error(f"position {pos} is outside [{-length}, {upper}] for a sequence of {length} tensors")
    return pos + length if pos < 0 else pos


def _check_dtype(n: OnnxNode, items: list[Value], t: Value) -> None:
    if items and items[0].type.dtype is not t.type.dtype:
        raise n.error(f"a sequence of {items[0].type.dtype.name} tensors cannot hold a {t.type.dtype.name} "
                      "tensor (ONNX sequences have one element type)")


def _sequence_construct(n: OnnxNode) -> SeqResult:
    items = [n.input(i) for i in range(len(n.inputs))]
    for t in items[1:]:
        _check_dtype(n, items, t)
    return [items]


def _sequence_empty(n: OnnxNode) -> SeqResult:
    # The element type does not matter to an unrolled (empty) list, but it must be one ONNX has.
    code = n.attr("dtype", 1)
    if onnx_type_name(code) == str(code):
        raise n.error(f"attribute 'dtype': {code} is not an ONNX element-type code (TensorProto.DataType)")
    return [[]]


def _sequence_insert(n: OnnxNode) -> SeqResult:
    items, t = n.seq(0), n.input(1)
    _check_dtype(n, items, t)
    pos = _position(n, 2, len(items), len(items)) if n.has_input(2) else len(items)
    return [items[:pos] + [t] + items[pos:]]


def _sequence_erase(n: OnnxNode) -> SeqResult:
    items = n.seq(0)
    if not items:
        raise n.error("cannot erase from an empty sequence")
    pos = _position(n, 1, len(items), len(items) - 1) if n.has_input(1) else len(items) - 1
    return [items[:pos] + items[pos + 1:]]


def _sequence_at(n: OnnxNode) -> SeqResult:
    items = n.seq(0)
    if not items:
        raise n.error("cannot read a tensor from an empty sequence")
    return [items[_position(n, 1, len(items), len(items) - 1)]]


def _sequence_length(n: OnnxNode) -> SeqResult:
    arr = np.array(len(n.seq(0)), dtype=np.int64)
    # The length is static, so it can feed operands that must be constants.
    n.ctx.consts[n.proto.output[0]] = arr
    return [n.emit("constant", value=DenseAttr(arr))]


def _split_to_sequence(n: OnnxNode) -> SeqResult:
    x = n.input(0)
    r = x.type.rank
    axis = int(n.attr("axis", 0))
    if not -r <= axis < r:
        raise n.error(f"axis {axis} is outside [-{r}, {r - 1}] for input {x.type}")
    axis = axis + r if axis < 0 else axis
    size = x.type.shape[axis]
    split = np.asarray(n.const(1, "the split")) if n.has_input(1) else None
    if split is None or split.ndim == 0:
        chunk = 1 if split is None else int(split)
        if chunk <= 0:
            raise n.error(f"a scalar split must be positive; got {chunk}")
        # Chunks of `chunk`, the last one smaller when it does not divide the dim.
        sizes = [min(chunk, size - k) for k in range(0, size, chunk)]
    elif split.ndim == 1:
        sizes = [int(s) for s in split]
        if any(s < 0 for s in sizes) or sum(sizes) != size:
            raise n.error(f"split sizes {sizes} must be non-negative and sum to the axis-{axis} dim {size}")
    else:
        raise n.error(f"the split must be a scalar or 1-D; got shape {list(split.shape)}")
    if not sizes:
        return [[]]
    parts = n.emit("split", x, axis=axis, sizes=sizes) if len(sizes) > 1 else x
    items = list(parts) if isinstance(parts, tuple) else [parts]
    # keepdims applies only to the default split of 1 (ONNX ignores it when split is given).
    if split is None and not int(n.attr("keepdims", 1)):
        items = [n.emit("squeeze", t, axes=[axis]) for t in items]
    return [items]


def _concat_from_sequence(n: OnnxNode) -> SeqResult:
    items = n.seq(0)
    if not items:
        raise n.error("cannot concatenate an empty sequence (the result's shape is unknown)")
    r = items[0].type.rank
    new_axis = bool(n.attr("new_axis", 0))
    axis = int(n.attr("axis"))
    hi = r if new_axis else r - 1
    if not -(hi + 1) <= axis <= hi:
        raise n.error(f"axis {axis} is outside [{-(hi + 1)}, {hi}] for rank-{r} tensors "
                      f"{'with' if new_axis else 'without'} new_axis")
    axis = axis + hi + 1 if axis < 0 else axis
    if new_axis:
        items = [n.emit("unsqueeze", t, axes=[axis]) for t in items]
    return [n.emit("concat", *items, axis=axis) if len(items) > 1 else items[0]]


ONNX_TO_PARTITA.update({
    "Add": binary_converter("add"), "Sub": binary_converter("sub"), "Mul": binary_converter("mul"), "Div": _div,
    "Pow": _pow, "MatMul": binary_converter("matmul"),
    "Equal": binary_converter("equal"), "Less": binary_converter("less"), "Greater": binary_converter("greater"),
    "Relu": unary_converter("relu"), "Sigmoid": unary_converter("sigmoid"), "Tanh": unary_converter("tanh"),
    "Erf": unary_converter("erf"), "Sqrt": unary_converter("sqrt"),
    "Where": lambda n: [n.emit("where", n.input(0), n.input(1), n.input(2))],
    "Identity": _identity, "Cast": _cast, "Constant": _constant,
    "Gemm": _gemm, "Conv": lift_1d(_conv), "ConvTranspose": lift_1d(_conv_transpose),
    "MaxPool": lift_1d(_max_pool), "AveragePool": lift_1d(_avg_pool), "GlobalAveragePool": _global_avg_pool,
    "BatchNormalization": _batch_norm, "Softmax": _softmax, "LayerNormalization": _layer_norm,
    "Dropout": _dropout,
    "Reshape": _reshape, "Flatten": _flatten, "Transpose": _transpose, "Concat": _concat,
    "Split": _split, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Gather": _gather,
    # ReduceSum takes axes as an input from opset 13, ReduceMean only from opset 18.
    "ReduceMean": _reduce("mean", 18), "ReduceSum": _reduce("sum", 13),
    "Neg": unary_converter("neg"), "Exp": unary_converter("exp"), "Log": unary_converter("log"),
    "Abs": unary_converter("abs"),
    "Sum": _variadic("add"), "Max": _variadic("maximum"), "Min": _variadic("minimum"),
    "LeakyRelu": _leaky_relu, "Elu": _elu, "Selu": _selu, "PRelu": _prelu, "Softplus": _softplus,
    "Softsign": _softsign, "Sign": _sign, "LogSoftmax": _log_softmax, "Clip": _clip,
    "ConstantOfShape": _constant_of_shape, "Shape": _shape, "LRN": _lrn, "Pad": _pad,
    "Expand": _expand, "Tile": _tile, "Slice": _slice, "Shrink": _shrink,
    "InstanceNormalization": _instance_norm,
    "SequenceConstruct": _sequence_construct, "SequenceEmpty": _sequence_empty,
    "SequenceInsert": _sequence_insert, "SequenceErase": _sequence_erase, "SequenceAt": _sequence_at,
    "SequenceLength": _sequence_length, "SplitToSequence": _split_to_sequence,
    "ConcatFromSequence": _concat_from_sequence,
})


# --- the importer -------------------------------------------------------------------------

def _load(model: Any) -> tuple[Any, str, str | None]:
    """(ModelProto, the name errors use, the folder external data is read from: None for a
    ModelProto given in memory)."""
    onnx = onnx_package()
    if isinstance(model, onnx.ModelProto):
        if not model.HasField("graph"):
            raise OnnxImportError("<onnx>: the ModelProto has no graph")
        return model, "<onnx>", None
    try:
        path = os.fspath(model)
    except TypeError:
        raise OnnxImportError(f"import_onnx takes a path or an onnx.ModelProto, not {type(model).__name__}") from None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise OnnxImportError(f"{path}: cannot read the ONNX file: {e.strerror}") from None
    if not data:
        raise OnnxImportError(f"{path}: the file is empty, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:
        raise OnnxImportError(f"{path}: not a valid ONNX model (the protobuf does not parse: {e}); "
                              "the file is corrupt or truncated") from None
    if not proto.HasField("graph") or len(proto.opset_import) == 0:
        raise OnnxImportError(f"{path}: not a valid ONNX model (no graph or no opset_import); "
                              "the file is corrupt, truncated or not ONNX")
    return proto, path, os.path.dirname(os.path.abspath(path))


class OnnxOpsetUpgradeWarning(UserWarning):
    """A model of an opset older than MIN_OPSET was upgraded with ``onnx.version_converter``."""


def _foreign_ops(proto: Any) -> dict[str, list[str]]:
    """'domain::OpType' -> the names of the nodes of a domain other than the default one."""
    out: dict[str, list[str]] = {}
    for i, node in enumerate(proto.graph.node):
        if node.domain not in ("", "ai.onnx"):
            out.setdefault(f"{node.domain}::{node.op_type}", []).append(node.name or f"#{i + 1}")
    return out


def _listed(ops: Mapping[str, list[str]]) -> str:
    return "; ".join(f"{op} (nodes: {', '.join(names)})" for op, names in sorted(ops.items()))


def opset_of(proto: Any, where: str) -> int:
    """The default-domain opset version ``proto`` imports; an error naming ``where`` if it imports none,
    several, or one newer than the installed onnx knows."""
    versions = sorted({int(imp.version) for imp in proto.opset_import if imp.domain in ("", "ai.onnx")})
    if not versions:
        foreign = _foreign_ops(proto)
        if foreign:
            domains = sorted({op.split("::")[0] for op in foreign})
            raise OnnxImportError(f"{where}: the model's nodes are all in the domain(s) {', '.join(domains)}, which "
                                  f"partita does not import (it imports the default ai.onnx domain); unsupported "
                                  f"op type(s): {_listed(foreign)}")
        raise OnnxImportError(f"{where}: the model imports no default-domain (ai.onnx) opset")
    if len(versions) > 1:
        raise OnnxImportError(f"{where}: the model imports the default domain (ai.onnx) at several opsets "
                              f"{versions}; a model imports each domain once")
    version = versions[0]
    newest = int(onnx_package().defs.onnx_opset_version())
    if version > newest:
        raise OnnxImportError(f"{where}: the model uses opset {version}, newer than the newest the installed onnx "
                              f"package knows ({newest}), so its operators' definitions are unknown: upgrade "
                              f"onnx, or export the model at opset {newest} or older")
    return version


def convert_to_min_opset(proto: Any, where: str, version: int) -> Any:
    """``proto`` converted to opset MIN_OPSET by ONNX's version converter, with a warning."""
    import warnings

    from onnx import version_converter

    try:
        out = version_converter.convert_version(proto, MIN_OPSET)
    except Exception as e:  # the converter raises bare RuntimeErrors from C++
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OnnxImportError(f"{where}: the model uses opset {version} and ONNX's version converter cannot "
                              f"upgrade it to opset {MIN_OPSET}: {first}; export the model again at opset "
                              f"{MIN_OPSET} or newer") from None
    warnings.warn(f"{where}: the model uses opset {version}; partita upgraded it to opset {MIN_OPSET} with "
                  "onnx.version_converter (save the upgraded model to skip this step next time)",
                  OnnxOpsetUpgradeWarning, stacklevel=3)
    return out


def _tensor_type(vi: Any, what: str, overrides: Mapping[str, Sequence[int]]) -> TensorType:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        if vi.type.HasField("sequence_type"):
            raise OnnxImportError(f"{what} '{vi.name}' is a sequence: sequence-typed graph inputs/outputs "
                                  "are not supported: partita's values are tensors (sequences built inside "
                                  "the graph are unrolled at import time)")
        raise OnnxImportError(f"{what} '{vi.name}' is not a tensor (sequences, maps and optionals "
                              "are not supported)")
    dtype = onnx_dtype(tt.elem_type, f"{what} '{vi.name}'")
    if vi.name in overrides:
        fixed = tuple(int(s) for s in overrides[vi.name])
        if tt.HasField("shape") and len(tt.shape.dim) != len(fixed):
            declared = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
            raise OnnxImportError(f"{what} '{vi.name}' has rank {len(declared)} ({declared}); the shape given for "
                                  f"it, {list(fixed)}, has rank {len(fixed)}")
        return TensorType(fixed, dtype)
    if not tt.HasField("shape"):
        raise OnnxImportError(f"{what} '{vi.name}' has no shape; pass input_shapes={{'{vi.name}': [...]}}")
    shape = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            sym = d.dim_param or "?"
            raise OnnxImportError(f"{what} '{vi.name}' has a symbolic dim '{sym}'; partita shapes are static: "
                                  f"pass input_shapes={{'{vi.name}': [...]}}")
        if d.dim_value < 0:
            raise OnnxImportError(f"{what} '{vi.name}' has a negative dim {d.dim_value}; the model is malformed")
        shape.append(int(d.dim_value))
    return TensorType(tuple(shape), dtype)


def known_shape_and_type(vi: Any) -> tuple[tuple[int, ...] | None, int]:
    """(shape if every dim is known, element type) of a value_info; 0 elem type = unknown."""
    if not vi.type.HasField("tensor_type"):
        return None, 0
    tt = vi.type.tensor_type
    if not tt.HasField("shape") or not all(d.HasField("dim_value") for d in tt.shape.dim):
        return None, tt.elem_type
    return tuple(int(d.dim_value) for d in tt.shape.dim), tt.elem_type


class _Importer:
    def __init__(self, proto: Any, where: str, opset: int, base_dir: str | None = None) -> None:
        self.proto, self.where, self.opset = proto, where, opset
        # The folder external tensor data is read from (None: a ModelProto given in memory).
        self.base_dir = base_dir
        # What defined each ONNX value name, for the error on a second definition.
        self.defined: dict[str, str] = {}
        self.graph = Graph(_NAME_BAD.sub("_", proto.graph.name) or "main")
        self.b = Builder(self.graph)
        self.values: dict[str, Value] = {}
        self.consts: dict[str, np.ndarray] = {}
        # The node that defines each ONNX value name (for why_not_constant).
        self.producers: dict[str, Any] = {}
        # Graph inputs bound to values (static_inputs): constants, not weights.
        self.static_names: set[str] = set()
        # Sequence-typed ONNX values, unrolled: each is a Python list of tensor Values.
        self.seqs: dict[str, list[Value]] = {}

    def run(self, input_shapes: dict[str, Sequence[int]], static: dict[str, np.ndarray]) -> Graph:
        g = self.proto.graph
        unknown: dict[str, list[str]] = {}
        readers: dict[str, Any] = {}  # the first node that reads each name, for the initializers' errors
        for i, node in enumerate(g.node):
            for name in node.input:
                readers.setdefault(name, node)
            if node.domain not in ("", "ai.onnx") or node.op_type not in ONNX_TO_PARTITA:
                op = node.op_type or "(empty op_type)"
                key = op if node.domain in ("", "ai.onnx") else f"{node.domain}::{op}"
                unknown.setdefault(key, []).append(node.name or f"#{i}")
        if unknown:
            listed = "; ".join(f"{op} (nodes: {', '.join(names)})" for op, names in sorted(unknown.items()))
            raise OnnxImportError(f"{self.where}: unsupported ONNX op type(s): {listed}. Supported: "
                                  f"{', '.join(sorted(ONNX_TO_PARTITA))}")
        if not g.output:
            raise OnnxImportError(f"{self.where}: the graph declares no outputs; a model returns at least one value")
        taken: set[str] = set()
        inits: dict[str, np.ndarray] = {}
        for k, t in enumerate(g.initializer):
            self._check_name(t.name, k, inits, "initializer", "defined")
            what = f"{self.where}: initializer '{t.name}'"
            if t.name in readers:
                reader = readers[t.name]
                what += f", read by node '{reader.name or '<unnamed>'}' ({reader.op_type})"
            inits[t.name] = tensor_array(t, what, self.base_dir)
        seen: set[str] = set()
        for k, vi in enumerate(g.input):
            self._check_name(vi.name, k, seen, "graph input", "declared")
            seen.add(vi.name)
        for name in static:
            if name not in seen or name in inits:
                raise OnnxImportError(f"{self.where}: static input '{name}' is not a graph input")
        inits.update(static)
        inputs = [vi.name for vi in g.input if vi.name not in inits]
        shapes: dict[str, list[int]] = {}
        for name, shape in input_shapes.items():
            if name not in inputs:
                known = ", ".join(f"'{x}'" for x in inputs) or "none"
                why = " (it is an initializer, whose data fixes its shape)" if name in inits else ""
                raise OnnxImportError(f"{self.where}: a shape is given for '{name}', which is not an input of the "
                                      f"model{why}; its inputs are: {known}")
            dims: list[Any]
            try:
                dims = list(shape)
            except TypeError:
                dims = [shape]
            if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
                raise OnnxImportError(f"{self.where}: the shape given for input '{name}', {dims}, must be a list "
                                      "of non-negative integer sizes")
            shapes[name] = [int(d) for d in dims]
        for vi in g.input:
            if vi.name in inits:
                continue
            t = _tensor_type(vi, f"{self.where}: graph input", shapes)
            self.values[vi.name] = self.b.input(_sanitize(vi.name, taken), t)
            self.defined[vi.name] = "a graph input"
        for name, init in inits.items():
            arr = _np_for_partita(np.asarray(init), f"{self.where}: initializer '{name}'")
            self.defined[name] = "an initializer" if name not in static else "a static input"
            pname = _sanitize(name, taken)
            if name in static:
                self.static_names.add(pname)
            self.values[name] = self.b.param(pname, TensorType(tuple(arr.shape), dt.from_numpy(arr.dtype)))
            self.graph.weights[pname] = arr
            self.consts[name] = arr
        expected = {vi.name: vi for vi in list(g.value_info) + list(g.output)}
        for i, node in enumerate(g.node):
            self._convert(i, node, expected)
        outs = []
        for vi in g.output:
            if vi.name in self.seqs or vi.type.HasField("sequence_type"):
                raise OnnxImportError(f"{self.where}: graph output '{vi.name}' is a sequence: sequence-typed "
                                      "graph inputs/outputs are not supported: partita's values are tensors "
                                      "(return its elements, or ConcatFromSequence, instead)")
            if vi.name not in self.values:
                raise OnnxImportError(f"{self.where}: graph output '{vi.name}' is produced by no node "
                                      "(the model is malformed or truncated)")
            outs.append(self.values[vi.name])
        self.b.ret(*outs)
        self._erase_unread()
        return self.graph

    def _erase_unread(self) -> None:
        """Erase the ops whose results nothing reads (the constants that fed a Reshape target,
        the shape arithmetic constant propagation replaced), keeping any op with effects."""
        from ..ops.registry import get_op

        for node in list(self.graph.reversed_nodes()):
            if not any(r.has_uses for r in node.results) and not get_op(node.op).effects:
                self.graph.erase(node)

    def _check_name(self, name: str, k: int, seen: Container[str], what: str, verb: str) -> None:
        """Entry ``k`` of the graph's initializers or inputs has a name, not one of ``seen``."""
        if not name:
            raise OnnxImportError(f"{self.where}: {what} #{k + 1} has no name; every {what.split()[-1]} needs one")
        if name in seen:
            raise OnnxImportError(f"{self.where}: {what} '{name}' is {verb} twice; ONNX value names must be unique")

    def _convert(self, i: int, node: Any, expected: dict[str, Any]) -> None:
        loc = Location(self.where, i + 1)
        n = OnnxNode(node, i, [], {}, self, loc)
        for name in node.output:
            if name in self.defined:
                raise n.error(f"output '{name}' is already defined by {self.defined[name]}; ONNX value names "
                              "must be unique (each value is assigned once)")
            if name:
                self.defined[name] = f"node '{node.name or '<unnamed>'}' ({node.op_type}, node {i + 1})"
                self.producers[name] = node
        ins: list[Value | None] = []
        for name in node.input:
            if name == "":
                ins.append(None)
            elif name in self.seqs:
                if node.op_type not in SEQUENCE_OPERANDS or len(ins) not in SEQUENCE_OPERANDS[node.op_type]:
                    raise OnnxImportError(f"{loc}: node '{node.name}' ({node.op_type}) reads sequence '{name}' as "
                                          f"input {len(ins)}; the importer unrolls sequences only into "
                                          f"{', '.join(sorted(SEQUENCE_OPERANDS))} (partita's values are tensors)")
                ins.append(None)  # the converter reads it with n.seq(i)
            elif name in self.values:
                ins.append(self.values[name])
            else:
                raise OnnxImportError(f"{loc}: node '{node.name}' ({node.op_type}) reads '{name}', which no "
                                      "earlier node, input or initializer defines (the graph is not "
                                      "topologically sorted, or the model is malformed or truncated)")
        n.inputs, n.attrs = ins, self._attributes(n)
        before = self.graph.last
        outs = ONNX_TO_PARTITA[node.op_type](n)
        free = _VALUE_FREE_INPUTS.get(node.op_type, ())
        if node.input and all(name == "" or name in self.consts or k in free for k, name in enumerate(node.input)):
            outs = self._fold(n, before, outs)
        for k, name in enumerate(node.output):
            if name == "":
                continue
            if k >= len(outs) or outs[k] is None:
                raise n.error(f"output {k} ('{name}') is not supported by the importer")
            v = outs[k]
            assert v is not None
            if isinstance(v, list):
                self.seqs[name] = v
                continue
            if name in expected:
                shape, elem = known_shape_and_type(expected[name])
                want_dt = ONNX_DTYPES.get(elem) if elem else None
                if (shape is not None and shape != v.type.shape) or (want_dt is not None and want_dt is not v.type.dtype):
                    want = f"{want_dt.name if want_dt else '?'}{list(shape) if shape is not None else '[?]'}"
                    raise n.error(f"output '{name}': partita infers {v.type} but ONNX shape inference says "
                                  f"{want}; the importer maps this op incorrectly or the model is invalid")
            self.values[name] = v


    def why_not_constant(self, name: str) -> str:
        """Why the ONNX value ``name`` has no known array: the chain of nodes back to the graph
        input or the node whose result is computed at run time."""
        chain: list[str] = []
        seen: set[str] = set()
        while name not in seen:
            seen.add(name)
            if name not in self.producers:
                path = f" (through {' <- '.join(chain)})" if chain else ""
                return (f"it depends on graph input '{name}'{path}, whose value is known only at run time; "
                        f"bind it with static_inputs={{'{name}': ...}} if it is fixed")
            node = self.producers[name]
            label = f"node '{node.name or '<unnamed>'}' ({node.op_type})"
            free = _VALUE_FREE_INPUTS.get(node.op_type, ())
            unknown = [x for k, x in enumerate(node.input) if x and x not in self.consts and k not in free]
            if not unknown:
                why = ("its result depends on its inputs' values in a way partita does not evaluate at "
                       "import" if node.op_type in _DATA_DEPENDENT else
                       f"its inputs are constants but it was not evaluated at import (a result larger than "
                       f"{_SMALL_CONST} elements, a float computed from a weight, or an op with effects)")
                path = f" (through {' <- '.join(chain)})" if chain else ""
                return f"it is computed from {label}{path}: {why}"
            chain.append(label)
            name = unknown[0]
        return "it is defined in a cycle (the model is malformed)"

    def _fold(self, n: OnnxNode, before: Node | None, outs: Sequence[Any]) -> Sequence[Any]:
        """Constant propagation: a node whose inputs are all known arrays (initializers,
        Constants, Shape of a static shape, and what earlier folds computed) is evaluated at
        import with the NumPy references of the ops its converter emitted, so a Reshape
        target computed as ``Shape -> Gather -> Concat`` or an Expand shape from ``Where``
        is a constant the converters can read. Small results (at most _SMALL_CONST elements)
        are kept; the emitted ops are then replaced by one constant per output. Weights stay
        parameters: a float result computed from a parameter is not folded."""
        from ..backend.numpy_ref import run_node_reference
        from ..ops.registry import get_op

        emitted = []
        node = before.next if before is not None else self.graph.first
        while node is not None:
            emitted.append(node)
            node = node.next
        if any(get_op(e.op).effects for e in emitted):
            return outs
        env: dict[int, np.ndarray] = {}
        from_param = False
        for name in n.proto.input:
            if name and name in self.consts:
                v = self.values[name]
                if self.consts[name].size > _FOLD_INPUT_LIMIT:
                    return outs
                from_param = from_param or (v.is_input and v.name not in self.static_names)
                env[id(v)] = self.consts[name]
        for e in emitted:
            args = []
            for v in e.operands:
                if id(v) not in env:
                    return outs  # reads a value that is not known (cannot happen for a pure converter)
                args.append(env[id(v)])
            try:
                res = run_node_reference(e, args)
            except Exception:  # noqa: BLE001: not foldable here; the executor reports it at run time
                return outs
            for r, a in zip(e.results, res):
                env[id(r)] = np.asarray(a)
        tensors = [(k, v) for k, v in enumerate(outs) if isinstance(v, Value)]
        if not tensors or any(isinstance(v, list) for v in outs):
            return outs
        if from_param and any(v.type.dtype.is_float for _, v in tensors):
            return outs
        if any(id(v) not in env or env[id(v)].size > _SMALL_CONST for _, v in tensors):
            return outs
        new = list(outs)
        for k, v in tensors:
            if k < len(n.proto.output) and n.proto.output[k]:
                self.consts[n.proto.output[k]] = env[id(v)]
        # The outputs the emitted ops computed become constants (an output that is an input,
        # as Identity's, stays that value); the emitted ops, now unread, are erased.
        made = {id(r) for e in emitted for r in e.results}
        for k, v in tensors:
            if id(v) in made:
                new[k] = n.emit("constant", value=DenseAttr(env[id(v)].astype(v.type.dtype.np, copy=False)))
        for e in reversed(emitted):
            if all(not r.has_uses for r in e.results):
                self.graph.erase(e)
        return new

    def _attributes(self, n: OnnxNode) -> dict[str, Any]:
        """The node's attributes as Python values, each of the type the op's schema (at the
        model's opset) gives it, and every attribute the schema requires present."""
        onnx = onnx_package()
        ap = onnx.AttributeProto
        spec = _schema_attributes(n.proto.op_type, self.opset)

        def kind(code: int) -> str:
            try:
                return str(ap.AttributeType.Name(code))
            except ValueError:
                return f"type code {code}"

        attrs: dict[str, Any] = {}
        for a in n.proto.attribute:
            if a.name in attrs:
                raise n.error(f"attribute '{a.name}' is given twice")
            if a.ref_attr_name:
                raise n.error(f"attribute '{a.name}' refers to '{a.ref_attr_name}', an attribute of an enclosing "
                              "function; only a function body may do that (the model is malformed)")
            want = spec.get(a.name)
            if a.type == ap.UNDEFINED:
                raise n.error(f"attribute '{a.name}' has no type (UNDEFINED); the model is malformed")
            if want is not None and want[0] != a.type:
                raise n.error(f"attribute '{a.name}' is of type {kind(a.type)}, but {n.proto.op_type} "
                              f"(opset {self.opset}) takes {kind(want[0])}")
            attrs[a.name] = onnx.helper.get_attribute_value(a)
        missing = [name for name, (_, required) in spec.items() if required and name not in attrs]
        if missing:
            raise n.error(f"the required attribute(s) {', '.join(repr(m) for m in missing)} are missing")
        return attrs


@functools.cache
def _schema_attributes(op_type: str, opset: int) -> dict[str, tuple[int, bool]]:
    """The attributes the default-domain schema of ``op_type`` at ``opset`` declares (name ->
    its type code and whether it is required), empty for an op without a schema; looked up
    once per op and opset."""
    onnx = onnx_package()
    try:
        attrs = onnx.defs.get_schema(op_type, opset, "").attributes
    except onnx.defs.SchemaError:
        return {}
    return {name: (int(a.type), bool(a.required)) for name, a in attrs.items()}


def _check_text(proto: Any, where: str) -> None:
    """Every name the importer reads must be text: protobuf gives a string field that is not
    valid UTF-8 as bytes. Raise naming the node (or value) that holds one."""
    def bad(v: Any) -> bool:
        return isinstance(v, (bytes, bytearray))

    def show(v: Any) -> str:
        return bytes(v).decode("utf-8", "backslashreplace")

    msg = "is not valid UTF-8 text (the model is corrupt)"
    for op in proto.opset_import:
        if bad(op.domain):
            raise OnnxImportError(f"{where}: opset_import domain '{show(op.domain)}' {msg}")
    g = proto.graph
    if bad(g.name):
        raise OnnxImportError(f"{where}: the graph name '{show(g.name)}' {msg}")
    for what, vis in (("graph input", g.input), ("graph output", g.output), ("value_info", g.value_info),
                      ("initializer", g.initializer)):
        for k, vi in enumerate(vis):
            if bad(vi.name):
                raise OnnxImportError(f"{where}: {what} #{k + 1} has a name '{show(vi.name)}' that {msg}")
    for i, node in enumerate(g.node):
        # The usual case, every field text: one pass over them, no message built.
        texts = [node.name, node.op_type, node.domain, *node.input, *node.output]
        texts += [x for a in node.attribute for x in (a.name, a.ref_attr_name)]
        if all(type(x) is str for x in texts):
            continue
        label = show(node.name) if bad(node.name) else (node.name or "<unnamed>")
        op = show(node.op_type) if bad(node.op_type) else node.op_type
        at = f"{Location(where, i + 1)}: node '{label}' ({op})"
        if bad(node.name) or bad(node.op_type) or bad(node.domain):
            raise OnnxImportError(f"{at}: its name, op_type or domain {msg}")
        for kind, names in (("input", node.input), ("output", node.output)):
            for k, name in enumerate(names):
                if bad(name):
                    raise OnnxImportError(f"{at}: {kind} {k} ('{show(name)}') {msg}")
        for a in node.attribute:
            if bad(a.name) or bad(a.ref_attr_name):
                raise OnnxImportError(f"{at}: an attribute name ('{show(a.name)}') {msg}")


def import_onnx(model: Any, input_shapes: dict[str, Sequence[int]] | None = None,
                static_inputs: dict[str, Any] | None = None) -> Graph:
    """Import an ONNX model (a path or a ``onnx.ModelProto``) as a partita Graph.

    ``input_shapes`` fixes the shape of graph inputs whose ONNX shape is symbolic or
    missing (partita shapes are static). ``static_inputs`` (name -> array) binds graph
    inputs to known values, treated like initializers: this is how a Reshape shape or
    Squeeze axes that arrive as graph inputs get the constant the importer needs. Initializers become ``param`` inputs with their
    arrays in ``graph.weights``. Raises OnnxImportError (a PartitaError) for a corrupt or
    truncated file, an opset older than 13 that ONNX's version converter cannot
    upgrade (the others are upgraded, with an OnnxOpsetUpgradeWarning), unsupported ops (all listed at once), or a
    node whose semantics partita cannot express, naming the node.
    """
    proto, where, base_dir = _read(model)
    return _import_proto(proto, where, base_dir, input_shapes, static_inputs)


def _read(model: Any) -> tuple[Any, str, str | None]:
    """The checked ModelProto at opset MIN_OPSET or newer (older ones upgraded), the name
    errors use, and the folder external data is read from."""
    proto, where, base_dir = _load(model)
    _check_text(proto, where)
    opset = opset_of(proto, where)
    if opset < MIN_OPSET:
        proto = convert_to_min_opset(proto, where, opset)
    return proto, where, base_dir


def _import_proto(proto: Any, where: str, base_dir: str | None, input_shapes: Mapping[str, Sequence[int]] | None,
                  static_inputs: Mapping[str, Any] | None) -> Graph:
    """The Graph of a ModelProto that _read returned."""
    try:
        inferred = onnx_package().shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception as e:
        raise OnnxImportError(f"{where}: ONNX shape inference rejects the model: {e}") from None
    static = {k: np.asarray(v) for k, v in (static_inputs or {}).items()}
    return _Importer(inferred, where, opset_of(proto, where), base_dir).run(dict(input_shapes or {}), static)


class OnnxModel:
    """An ONNX model whose dynamic axes are bound by the inputs it is called with.

    ``load_onnx(path)`` reads and checks the file once; the first call with arrays of given
    shapes imports the graph specialized on those shapes (partita's shapes are static), and
    later calls with the same shapes reuse it. ``input_shapes`` binds some axes up front
    (those inputs' shapes are then fixed). ``graph_for(shapes)`` gives the imported graph.
    """

    def __init__(self, model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None,
                 backend: str = "torch") -> None:
        if backend not in ("numpy", "torch"):
            raise OnnxImportError(f"load_onnx: backend must be 'numpy' or 'torch', got {backend!r}")
        proto, self.where, self._base_dir = _read(model)
        self.proto, self.backend = proto, backend
        self.fixed = {k: [int(d) for d in v] for k, v in (input_shapes or {}).items()}
        inits = {t.name for t in proto.graph.initializer}
        self.input_names = [vi.name for vi in proto.graph.input if vi.name not in inits]
        self._graphs: dict[tuple, Graph] = {}
        if all(known_shape_and_type(vi)[0] is not None or vi.name in self.fixed
               for vi in proto.graph.input if vi.name not in inits):
            self.graph_for({})  # every shape known: import now, so errors surface at load time

    def graph_for(self, shapes: Mapping[str, Sequence[int]]) -> Graph:
        """The graph imported with these input shapes (and those given to load_onnx)."""
        bound = {**{k: tuple(int(d) for d in v) for k, v in shapes.items()},
                 **{k: tuple(v) for k, v in self.fixed.items()}}
        key = tuple(sorted(bound.items()))
        if key not in self._graphs:
            self._graphs[key] = _import_proto(self.proto, self.where, self._base_dir, dict(bound), None)
        return self._graphs[key]

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Run on arrays given in the order of the graph inputs, or by ONNX input name."""
        if args and kwargs:
            raise OnnxImportError(f"{self.where}: give the inputs in order or by name, not both")
        if len(args) > len(self.input_names):
            raise OnnxImportError(f"{self.where}: the model takes {len(self.input_names)} input(s) "
                                  f"({', '.join(self.input_names)}), got {len(args)}")
        feed = dict(zip(self.input_names, args)) if args else dict(kwargs)
        unknown = sorted(set(feed) - set(self.input_names))
        missing = [k for k in self.input_names if k not in feed]
        if unknown or missing:
            raise OnnxImportError(f"{self.where}: inputs {', '.join(self.input_names)} expected; "
                                  + (f"unknown: {', '.join(unknown)}" if unknown else f"missing: {', '.join(missing)}"))
        shapes = {k: tuple(np.shape(np.asarray(v) if not hasattr(v, "shape") else v)) for k, v in feed.items()}
        graph = self.graph_for(shapes)
        values = [feed[k] for k in self.input_names]
        if self.backend == "torch":
            from ..backend.torch_exec import run as run_torch

            return list(run_torch(graph, values))
        from ..backend.numpy_ref import run as run_numpy

        return list(run_numpy(graph, values))


def load_onnx(model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None,
              backend: str = "torch") -> OnnxModel:
    """An ONNX file (or ModelProto) as a callable whose dynamic axes are bound by the first
    inputs of each shape it sees (see OnnxModel)."""
    return OnnxModel(model, input_shapes, backend)


# The quantization operators live in their own module, which adds them to ONNX_TO_PARTITA.
from . import onnx_quant  # noqa: E402,F401
# So do the elementwise math, activation, logic and bitwise operators.
from . import onnx_math  # noqa: E402,F401
# The indexing, reduction and layout operators too (ArgMax, Reduce*, Gather/Scatter*, TopK, ...).
from . import onnx_index  # noqa: E402,F401
# The neural-network operators (normalizations, Einsum, losses, attention, recurrent layers,
# Resize), composed from core ops in their own module.
from . import onnx_nn  # noqa: E402,F401
