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

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..ir import dtypes as dt
from ..ir.attrs import DenseAttr
from ..ir.builder import Builder
from ..ir.diagnostics import PartitaError
from ..ir.graph import Graph, Value
from ..ir.types import Location, TensorType
from ..ops.registry import TypeRuleError, broadcast_shapes
from . import FrontendError

MIN_OPSET = 13


class OnnxImportError(FrontendError):
    """An ONNX model partita cannot import: the message names the file, node and fix."""


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as e:  # pragma: no cover - environment dependent
        raise OnnxImportError("import_onnx needs the 'onnx' package: pip install onnx") from e
    return onnx


# ONNX TensorProto element types partita has a dtype for.
_ONNX_DTYPES: dict[int, dt.DType] = {
    1: dt.f32, 2: dt.u8, 3: dt.i8, 5: dt.i16, 6: dt.i32, 7: dt.i64, 9: dt.bool_, 10: dt.f16,
    11: dt.f64, 16: dt.bf16,
}


def _dtype(elem_type: int, what: str) -> dt.DType:
    try:
        return _ONNX_DTYPES[elem_type]
    except KeyError:
        name = _onnx().TensorProto.DataType.Name(elem_type) if elem_type else "UNDEFINED"
        raise OnnxImportError(f"{what}: element type {name} has no partita dtype "
                              f"(supported: {', '.join(d.name for d in _ONNX_DTYPES.values())})") from None


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


@dataclass
class OnnxNode:
    """What a converter sees of one ONNX node: its inputs as partita values (None for an
    omitted optional input), its attributes as Python values, and where it came from."""

    proto: Any
    index: int
    inputs: list[Value | None]
    attrs: dict[str, Any]
    ctx: "_Importer"
    loc: Location = field(default_factory=lambda: Location("<onnx>", 0))

    @property
    def where(self) -> str:
        """The location, name and op type, as error messages print them."""
        return f"{self.loc}: node '{self.proto.name or '<unnamed>'}' ({self.proto.op_type})"

    def error(self, msg: str) -> OnnxImportError:
        """An OnnxImportError for this node (the caller raises it)."""
        return OnnxImportError(f"{self.where}: {msg}")

    def attr(self, name: str, default: Any = None) -> Any:
        """The ONNX attribute ``name`` as a Python value, or ``default``."""
        return self.attrs.get(name, default)

    def input(self, i: int) -> Value:
        """The partita value of input ``i``; an error if the input is absent."""
        if i >= len(self.inputs) or self.inputs[i] is None:
            raise self.error(f"input {i} is required but missing")
        v = self.inputs[i]
        assert v is not None
        return v

    def has_input(self, i: int) -> bool:
        """Whether optional input ``i`` is given."""
        return i < len(self.inputs) and self.inputs[i] is not None

    def const(self, i: int, what: str) -> np.ndarray:
        """The array of input ``i``, which must be an initializer or a Constant's output."""
        name = self.proto.input[i]
        arr = self.ctx.consts.get(name)
        if arr is None:
            raise self.error(f"{what} (input {i}, '{name}') must be a constant initializer or the output "
                             "of a Constant node; it is computed at run time, which partita's static "
                             "shapes cannot express (fold it to a constant before exporting)")
        return arr

    def emit(self, op: str, *operands: Value, **attrs: Any) -> Any:
        """Emit a partita op at this node's location; a type-rule error names the node."""
        try:
            return self.ctx.b.emit(op, *operands, loc=self.loc, **attrs)
        except OnnxImportError:
            raise
        except PartitaError as e:
            raise self.error(str(e)) from e

    def scalar(self, value: float, like: Value) -> Value:
        """A rank-0 constant of ``like``'s dtype."""
        return self.emit("constant", value=DenseAttr(np.array(value, dtype=like.type.dtype.np)))

    def n_outputs(self) -> int:
        """How many outputs the ONNX node declares (omitted optional ones included)."""
        return len(self.proto.output)

    def used_output(self, i: int) -> bool:
        """Whether output ``i`` is requested (declared with a non-empty name)."""
        return i < len(self.proto.output) and self.proto.output[i] != ""


Converter = Callable[[OnnxNode], Sequence[Value | None]]

# Operand positions whose values must be known at import time (they set shapes or axes).
CONSTANT_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Split": (1,), "Squeeze": (1,), "Unsqueeze": (1,),
    "ReduceSum": (1,), "ReduceMean": (1,), "Dropout": (2,),
    "ConstantOfShape": (0,), "Pad": (1, 2, 3), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4),
}


def constant_operand_inputs(model: Any) -> list[str]:
    """Names of graph inputs (not initializers) feeding an operand in CONSTANT_OPERANDS.

    A caller that knows their values (a test harness, a specializing runtime) passes them
    as ``static_inputs`` to ``import_onnx``.
    """
    g = model.graph
    inits = {t.name for t in g.initializer}
    graph_inputs = {vi.name for vi in g.input} - inits
    out: list[str] = []
    for node in g.node:
        for i in CONSTANT_OPERANDS.get(node.op_type, ()):
            if i < len(node.input) and node.input[i] in graph_inputs and node.input[i] not in out:
                out.append(node.input[i])
    return out


# --- converters ---------------------------------------------------------------------------

def _unary(op: str) -> Converter:
    return lambda n: [n.emit(op, n.input(0))]


def _binary(op: str) -> Converter:
    # partita's binary ops broadcast as NumPy does, which is ONNX's multidirectional rule.
    return lambda n: [n.emit(op, n.input(0), n.input(1))]


def _div(n: OnnxNode) -> list[Value | None]:
    x, y = n.input(0), n.input(1)
    if x.type.dtype.is_float:
        return [n.emit("div", x, y)]
    # ONNX integer Div truncates toward zero and keeps the integer type; partita's div is true
    # division. f64 holds every integer below 2**53 exactly, and the cast back truncates.
    q = n.emit("div", n.emit("cast", x, dtype=dt.f64), n.emit("cast", y, dtype=dt.f64))
    return [n.emit("cast", q, dtype=x.type.dtype)]


def _identity(n: OnnxNode) -> list[Value | None]:
    return [n.input(0)]


def _pow(n: OnnxNode) -> list[Value | None]:
    x, y = n.input(0), n.input(1)
    # ONNX Pow keeps the base's type whatever the exponent's; partita would promote.
    if y.type.dtype is not x.type.dtype:
        y = n.emit("cast", y, dtype=x.type.dtype)
    return [n.emit("pow", x, y)]


def _cast(n: OnnxNode) -> list[Value | None]:
    return [n.emit("cast", n.input(0), dtype=_dtype(n.attr("to"), n.where))]


def _constant(n: OnnxNode) -> list[Value | None]:
    onnx = _onnx()
    keys = [k for k in n.attrs if k in ("value", "value_float", "value_int", "value_floats", "value_ints")]
    if len(keys) != 1:
        raise n.error(f"needs exactly one of value/value_float(s)/value_int(s); has {sorted(n.attrs)}")
    k = keys[0]
    v = n.attrs[k]
    if k == "value":
        arr = onnx.numpy_helper.to_array(v)
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


def _spatial(n: OnnxNode, x: Value, kernel: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """(strides, dilations, pads [begin..., end...]) of a 2-D window op, auto_pad resolved."""
    if x.type.rank != 4:
        raise n.error(f"input {x.type} is not 3-D or 4-D (N, C, L) / (N, C, H, W); only 1-D and 2-D "
                      "convolution and pooling are supported")
    strides = list(n.attr("strides", [1, 1]))
    dil = list(n.attr("dilations", [1, 1]))
    auto = n.attr("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        pads = list(n.attr("pads", [0, 0, 0, 0]))
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for d in range(2):
            size = x.type.shape[2 + d]
            out = math.ceil(size / strides[d])
            total = max((out - 1) * strides[d] + (kernel[d] - 1) * dil[d] + 1 - size, 0)
            small, big = total // 2, total - total // 2
            # SAME_UPPER puts the odd extra pad at the end, SAME_LOWER at the beginning.
            begin.append(small if auto == "SAME_UPPER" else big)
            end.append(big if auto == "SAME_UPPER" else small)
        pads = begin + end
    else:
        raise n.error(f"auto_pad '{auto}' is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    if len(strides) != 2 or len(dil) != 2 or len(pads) != 4:
        raise n.error(f"strides {strides}, dilations {dil}, pads {pads} do not describe a 2-D window")
    return strides, dil, pads


def _symmetric(n: OnnxNode, x: Value, pads: list[int], fill: float,
               kernel: Sequence[int] | None = None) -> tuple[Value, list[int]]:
    """partita's window ops pad both sides equally (and pools at most half the window): pad x
    explicitly with ``fill`` when ONNX's pads are asymmetric or larger."""
    small = kernel is None or all(pads[d] <= kernel[d] // 2 for d in range(2))
    if pads[0] == pads[2] and pads[1] == pads[3] and small:
        return x, [pads[0], pads[1]]
    x = n.emit("pad", x, pads=[0, 0, 0, 0, pads[0], pads[2], pads[1], pads[3]], value=fill)
    return x, [0, 0]


def _lift_1d(convert: Converter) -> Converter:
    """Run a 2-D window converter on a 1-D (N, C, L) node as (N, C, 1, L), then drop the
    added dim: partita has 2-D convolution and pooling only."""
    def window_attr(v: Any, fill: int) -> Any:
        return [fill] + list(v)

    def lifted(n: OnnxNode) -> Sequence[Value | None]:
        if not n.has_input(0) or n.input(0).type.rank != 3:
            return convert(n)
        attrs = dict(n.attrs)
        for key, fill in (("kernel_shape", 1), ("strides", 1), ("dilations", 1)):
            if key in attrs:
                attrs[key] = window_attr(attrs[key], fill)
        if "pads" in attrs:
            p = list(attrs["pads"])
            attrs["pads"] = [0, p[0], 0, p[1]]
        ins: list[Value | None] = [n.emit("unsqueeze", n.input(0), axes=[2])]
        for i in range(1, len(n.inputs)):
            v = n.inputs[i]
            # The conv weight (O, I/g, K) gets the same unit height.
            ins.append(n.emit("unsqueeze", v, axes=[2]) if (v is not None and i == 1 and v.type.rank == 3) else v)
        outs = convert(OnnxNode(n.proto, n.index, ins, attrs, n.ctx, n.loc))
        return [n.emit("squeeze", v, axes=[2]) if v is not None else None for v in outs]
    return lifted


def _conv(n: OnnxNode) -> list[Value | None]:
    x, w = n.input(0), n.input(1)
    if w.type.rank != 4:
        raise n.error(f"weight {w.type} is not 3-D or 4-D; only 1-D and 2-D convolution are supported")
    kernel = list(n.attr("kernel_shape", w.type.shape[2:]))
    strides, dil, pads = _spatial(n, x, kernel)
    x, pad2 = _symmetric(n, x, pads, 0.0)
    ops = [x, w] + ([n.input(2)] if n.has_input(2) else [])
    return [n.emit("conv2d", *ops, stride=strides, padding=pad2, dilation=dil, groups=int(n.attr("group", 1)))]


def _max_pool(n: OnnxNode) -> list[Value | None]:
    if n.used_output(1):
        raise n.error("the Indices output of MaxPool is not supported")
    x = n.input(0)
    if n.attr("storage_order", 0):
        raise n.error("storage_order=1 (column-major indices) is not supported")
    kernel = list(n.attr("kernel_shape"))
    strides, dil, pads = _spatial(n, x, kernel)
    x, pad2 = _symmetric(n, x, pads, -math.inf, kernel)
    return [n.emit("max_pool2d", x, kernel=kernel, stride=strides, padding=pad2, dilation=dil,
                   ceil_mode=bool(n.attr("ceil_mode", 0)))]


def _avg_pool(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    kernel = list(n.attr("kernel_shape"))
    strides, dil, pads = _spatial(n, x, kernel)
    if dil != [1, 1]:
        raise n.error(f"dilations {dil} are not supported for AveragePool")
    include = bool(n.attr("count_include_pad", 0))
    ceil = bool(n.attr("ceil_mode", 0))
    explicit = (pads[0] != pads[2] or pads[1] != pads[3]) or any(pads[d] > kernel[d] // 2 for d in range(2))
    xp, pad2 = _symmetric(n, x, pads, 0.0, kernel)
    y = n.emit("avg_pool2d", xp, kernel=kernel, stride=strides, padding=pad2, ceil_mode=ceil,
               count_include_pad=include or explicit)
    if explicit and not include:
        # The padding is now part of the input, so the pool counted it: divide by the share
        # of each window that lies on real input (the same pool over a 0/1 mask).
        ones = n.emit("full", shape=list(x.type.shape), value=1.0, dtype=x.type.dtype)
        mask, _ = _symmetric(n, ones, pads, 0.0, kernel)
        share = n.emit("avg_pool2d", mask, kernel=kernel, stride=strides, padding=pad2, ceil_mode=ceil,
                       count_include_pad=True)
        y = n.emit("div", y, share)
    return [y]


def _global_avg_pool(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    if x.type.rank < 3:
        raise n.error(f"input {x.type} needs rank >= 3 (N, C, spatial...)")
    return [n.emit("mean", x, axes=list(range(2, x.type.rank)), keepdim=True)]


def _batch_norm(n: OnnxNode) -> list[Value | None]:
    if n.attr("training_mode", 0) or any(n.used_output(i) for i in (1, 2)):
        raise n.error("training-mode BatchNormalization (running mean/var outputs) is not supported; "
                      "export the model in eval mode")
    ins = [n.input(i) for i in range(5)]
    return [n.emit("batch_norm", *ins, eps=float(n.attr("epsilon", 1e-5)))]


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


def _axes_operand(n: OnnxNode, i: int, attr_since: int) -> list[int] | None:
    """Axes given as input ``i`` (opset >= attr_since) or as the 'axes' attribute (older)."""
    if n.ctx.opset >= attr_since:
        if "axes" in n.attrs:
            raise n.error(f"'axes' is an input since opset {attr_since}, not an attribute")
        return [int(a) for a in n.const(i, "axes")] if n.has_input(i) else None
    axes = n.attr("axes")
    return list(axes) if axes is not None else None


def _unsqueeze(n: OnnxNode) -> list[Value | None]:
    axes = _axes_operand(n, 1, 13)
    if axes is None:
        raise n.error("Unsqueeze needs axes")
    return [n.emit("unsqueeze", n.input(0), axes=axes)]


def _squeeze(n: OnnxNode) -> list[Value | None]:
    return [n.emit("squeeze", n.input(0), axes=_axes_operand(n, 1, 13))]


def _split(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    axis = int(n.attr("axis", 0))
    r = x.type.rank
    if not -r <= axis < r:
        raise n.error(f"axis {axis} is outside [-{r}, {r - 1}] for input {x.type}")
    size = x.type.shape[axis + r if axis < 0 else axis]
    if n.has_input(1):  # opset >= 13: sizes as an input
        sizes = [int(s) for s in n.const(1, "the split sizes")]
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
        axes = _axes_operand(n, 1, axes_input_since)
        keep = bool(n.attr("keepdims", 1))
        if not axes:
            if n.attr("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.type.rank))
        return [n.emit(op, x, axes=axes, keepdim=keep)]
    return convert


def _layer_norm(n: OnnxNode) -> list[Value | None]:
    if n.attr("stash_type", 1) != 1:
        raise n.error("stash_type other than 1 (float32) is not supported")
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
    out: list[Value | None] = [n.emit("layer_norm", *ins, axes=axes, eps=eps)]
    if n.used_output(1) or n.used_output(2):
        # The saved statistics, kept over the normalized axes as ONNX specifies.
        mean = n.emit("mean", x, axes=axes, keepdim=True)
        d = n.emit("sub", x, mean)
        var = n.emit("mean", n.emit("mul", d, d), axes=axes, keepdim=True)
        out += [mean, n.emit("rsqrt", n.emit("add", var, n.scalar(eps, var)))]
    return out


def _dropout(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    if n.has_input(2) and bool(np.asarray(n.const(2, "training_mode")).item()):
        raise n.error("training_mode=true Dropout is not supported; import for inference")
    out: list[Value | None] = [x]
    if n.used_output(1):
        # Inference dropout keeps every element: the mask is all true.
        out.append(n.emit("full", shape=list(x.type.shape), value=True, dtype=dt.bool_))
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
    value = n.attr("value")
    arr = np.zeros(1, np.float32) if value is None else _onnx().numpy_helper.to_array(value).reshape(-1)
    dtype = dt.from_numpy(_np_for_partita(arr, n.where).dtype)
    if int(np.prod(shape)) <= _SMALL_CONST:
        # Small fills can feed operands that must be constants (a Reshape shape, Pad pads).
        n.ctx.consts[n.proto.output[0]] = np.full(shape, arr[0], dtype=arr.dtype)
    return [n.emit("full", shape=shape, value=arr[0].item(), dtype=dtype)]


# Largest constant (in elements) the importer also keeps as a NumPy array for later
# constant-operand reads; weight-sized fills stay only in the graph.
_SMALL_CONST = 1024


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
    if mode not in ("constant", "reflect", "edge"):
        raise n.error(f"mode '{mode}' is not supported (constant, reflect and edge are)")
    r = x.type.rank
    pads = [int(p) for p in np.asarray(n.const(1, "pads")).reshape(-1)]
    axes = list(range(r))
    if n.has_input(3):
        axes = [a + r if a < 0 else a for a in (int(v) for v in np.asarray(n.const(3, "axes")).reshape(-1))]
    if len(pads) != 2 * len(axes):
        raise n.error(f"pads has {len(pads)} entries; {len(axes)} padded axes need {2 * len(axes)}")
    if any(p < 0 for p in pads):
        raise n.error(f"negative pads {pads} (cropping) are not supported")
    pairs = [0, 0] * r
    for k, a in enumerate(axes):
        pairs[2 * a], pairs[2 * a + 1] = pads[k], pads[k + len(axes)]
    if mode != "constant":
        return [_pad_by_copies(n, x, pairs, mode)]
    value: Any = 0
    if n.has_input(2):
        value = np.asarray(n.const(2, "constant_value")).reshape(-1)[0].item()
    return [n.emit("pad", x, pads=pairs, value=value)]


def _pad_by_copies(n: OnnxNode, x: Value, pairs: list[int], mode: str) -> Value:
    """Reflect or edge padding as a concat of one-wide slices of the input: exact, and
    built from ops partita has (its pad op fills a constant only)."""
    y = x
    for axis in range(x.type.rank):
        before, after = pairs[2 * axis], pairs[2 * axis + 1]
        if before == 0 and after == 0:
            continue
        dim = y.type.shape[axis]
        if mode == "reflect" and (before >= dim or after >= dim):
            raise n.error(f"reflect pads ({before}, {after}) on axis {axis} must be smaller than its size {dim}")

        def one(i: int) -> Value:
            return n.emit("slice", y, axis=axis, start=i, end=i + 1)

        if mode == "reflect":
            left = [one(i) for i in range(before, 0, -1)]
            right = [one(dim - 2 - i) for i in range(after)]
        else:
            left, right = [one(0)] * before, [one(dim - 1)] * after
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
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st < 1:
            raise n.error(f"step {st} is not supported; partita slices with positive steps")
        a = a + r if a < 0 else a
        dim = y.type.shape[a]
        # ONNX clamps like Python for positive steps; bound the huge INT64 sentinels first.
        s, e = max(min(s, dim), -dim - 1), max(min(e, dim), -dim - 1)
        y = n.emit("slice", y, axis=a, start=s, end=e, step=st)
    return [y]


ONNX_TO_PARTITA: dict[str, Converter] = {
    "Add": _binary("add"), "Sub": _binary("sub"), "Mul": _binary("mul"), "Div": _div,
    "Pow": _pow, "MatMul": _binary("matmul"),
    "Equal": _binary("equal"), "Less": _binary("less"), "Greater": _binary("greater"),
    "Relu": _unary("relu"), "Sigmoid": _unary("sigmoid"), "Tanh": _unary("tanh"),
    "Erf": _unary("erf"), "Sqrt": _unary("sqrt"),
    "Where": lambda n: [n.emit("where", n.input(0), n.input(1), n.input(2))],
    "Identity": _identity, "Cast": _cast, "Constant": _constant,
    "Gemm": _gemm, "Conv": _lift_1d(_conv),
    "MaxPool": _lift_1d(_max_pool), "AveragePool": _lift_1d(_avg_pool), "GlobalAveragePool": _global_avg_pool,
    "BatchNormalization": _batch_norm, "Softmax": _softmax, "LayerNormalization": _layer_norm,
    "Dropout": _dropout,
    "Reshape": _reshape, "Flatten": _flatten, "Transpose": _transpose, "Concat": _concat,
    "Split": _split, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Gather": _gather,
    # ReduceSum takes axes as an input from opset 13, ReduceMean only from opset 18.
    "ReduceMean": _reduce("mean", 18), "ReduceSum": _reduce("sum", 13),
    "Neg": _unary("neg"), "Exp": _unary("exp"), "Log": _unary("log"), "Abs": _unary("abs"),
    "Sum": _variadic("add"), "Max": _variadic("maximum"), "Min": _variadic("minimum"),
    "LeakyRelu": _leaky_relu, "Elu": _elu, "Selu": _selu, "PRelu": _prelu, "Softplus": _softplus,
    "Softsign": _softsign, "Sign": _sign, "LogSoftmax": _log_softmax, "Clip": _clip,
    "ConstantOfShape": _constant_of_shape, "Shape": _shape, "LRN": _lrn, "Pad": _pad,
    "Expand": _expand, "Tile": _tile, "Slice": _slice, "Shrink": _shrink,
    "InstanceNormalization": _instance_norm,
}


# --- the importer -------------------------------------------------------------------------

def _load(model: Any) -> tuple[Any, str]:
    onnx = _onnx()
    if isinstance(model, onnx.ModelProto):
        return model, "<onnx>"
    path = os.fspath(model)
    try:
        data = open(path, "rb").read()
    except OSError as e:
        raise OnnxImportError(f"{path}: cannot read the ONNX file: {e.strerror}") from None
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:
        raise OnnxImportError(f"{path}: not a valid ONNX model (the protobuf does not parse: {e}); "
                              "the file is corrupt or truncated") from None
    if not proto.HasField("graph") or len(proto.opset_import) == 0:
        raise OnnxImportError(f"{path}: not a valid ONNX model (no graph or no opset_import); "
                              "the file is corrupt, truncated or not ONNX")
    return proto, path


def _opset(proto: Any, where: str) -> int:
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            if imp.version < MIN_OPSET:
                raise OnnxImportError(
                    f"{where}: the model uses opset {imp.version}; partita imports opset {MIN_OPSET} and "
                    f"newer (upgrade it: onnx.version_converter.convert_version(model, {MIN_OPSET}))")
            return int(imp.version)
    raise OnnxImportError(f"{where}: the model imports no default-domain (ai.onnx) opset")


def _tensor_type(vi: Any, what: str, overrides: dict[str, Sequence[int]]) -> TensorType:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise OnnxImportError(f"{what} '{vi.name}' is not a tensor (sequences, maps and optionals "
                              "are not supported)")
    dtype = _dtype(tt.elem_type, f"{what} '{vi.name}'")
    if vi.name in overrides:
        return TensorType(tuple(int(s) for s in overrides[vi.name]), dtype)
    if not tt.HasField("shape"):
        raise OnnxImportError(f"{what} '{vi.name}' has no shape; pass input_shapes={{'{vi.name}': [...]}}")
    shape = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            sym = d.dim_param or "?"
            raise OnnxImportError(f"{what} '{vi.name}' has a symbolic dim '{sym}'; partita shapes are static: "
                                  f"pass input_shapes={{'{vi.name}': [...]}}")
        shape.append(int(d.dim_value))
    return TensorType(tuple(shape), dtype)


def _known(vi: Any) -> tuple[tuple[int, ...] | None, int]:
    """(shape if every dim is known, element type) of a value_info; 0 elem type = unknown."""
    if not vi.type.HasField("tensor_type"):
        return None, 0
    tt = vi.type.tensor_type
    if not tt.HasField("shape") or not all(d.HasField("dim_value") for d in tt.shape.dim):
        return None, tt.elem_type
    return tuple(int(d.dim_value) for d in tt.shape.dim), tt.elem_type


class _Importer:
    def __init__(self, proto: Any, where: str, opset: int) -> None:
        self.proto, self.where, self.opset = proto, where, opset
        self.graph = Graph(_NAME_BAD.sub("_", proto.graph.name) or "main")
        self.b = Builder(self.graph)
        self.values: dict[str, Value] = {}
        self.consts: dict[str, np.ndarray] = {}

    def run(self, input_shapes: dict[str, Sequence[int]], static: dict[str, np.ndarray]) -> Graph:
        onnx = _onnx()
        g = self.proto.graph
        unknown: dict[str, list[str]] = {}
        for i, node in enumerate(g.node):
            if node.domain not in ("", "ai.onnx") or node.op_type not in ONNX_TO_PARTITA:
                key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
                unknown.setdefault(key, []).append(node.name or f"#{i}")
        if unknown:
            listed = "; ".join(f"{op} (nodes: {', '.join(names)})" for op, names in sorted(unknown.items()))
            raise OnnxImportError(f"{self.where}: unsupported ONNX op type(s): {listed}. Supported: "
                                  f"{', '.join(sorted(ONNX_TO_PARTITA))}")
        taken: set[str] = set()
        inits = {t.name: onnx.numpy_helper.to_array(t) for t in g.initializer}
        for name in static:
            if name not in {vi.name for vi in g.input} or name in inits:
                raise OnnxImportError(f"{self.where}: static input '{name}' is not a graph input")
        inits.update(static)
        for vi in g.input:
            if vi.name in inits:
                continue
            t = _tensor_type(vi, f"{self.where}: graph input", input_shapes)
            self.values[vi.name] = self.b.input(_sanitize(vi.name, taken), t)
        for name, init in inits.items():
            arr = _np_for_partita(np.asarray(init), f"{self.where}: initializer '{name}'")
            pname = _sanitize(name, taken)
            self.values[name] = self.b.param(pname, TensorType(tuple(arr.shape), dt.from_numpy(arr.dtype)))
            self.graph.weights[pname] = arr
            self.consts[name] = arr
        expected = {vi.name: vi for vi in list(g.value_info) + list(g.output)}
        for i, node in enumerate(g.node):
            self._convert(i, node, expected)
        outs = []
        for vi in g.output:
            if vi.name not in self.values:
                raise OnnxImportError(f"{self.where}: graph output '{vi.name}' is produced by no node "
                                      "(the model is malformed or truncated)")
            outs.append(self.values[vi.name])
        self.b.ret(*outs)
        return self.graph

    def _convert(self, i: int, node: Any, expected: dict[str, Any]) -> None:
        onnx = _onnx()
        loc = Location(self.where, i + 1)
        ins: list[Value | None] = []
        for name in node.input:
            if name == "":
                ins.append(None)
            elif name in self.values:
                ins.append(self.values[name])
            else:
                raise OnnxImportError(f"{loc}: node '{node.name}' ({node.op_type}) reads '{name}', which no "
                                      "earlier node, input or initializer defines (the graph is not "
                                      "topologically sorted, or the model is malformed or truncated)")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        n = OnnxNode(node, i, ins, attrs, self, loc)
        outs = ONNX_TO_PARTITA[node.op_type](n)
        for k, name in enumerate(node.output):
            if name == "":
                continue
            if k >= len(outs) or outs[k] is None:
                raise n.error(f"output {k} ('{name}') is not supported by the importer")
            v = outs[k]
            assert v is not None
            if name in expected:
                shape, elem = _known(expected[name])
                want_dt = _ONNX_DTYPES.get(elem) if elem else None
                if (shape is not None and shape != v.type.shape) or (want_dt is not None and want_dt is not v.type.dtype):
                    want = f"{want_dt.name if want_dt else '?'}{list(shape) if shape is not None else '[?]'}"
                    raise n.error(f"output '{name}': partita infers {v.type} but ONNX shape inference says "
                                  f"{want}; the importer maps this op incorrectly or the model is invalid")
            self.values[name] = v


def import_onnx(model: Any, input_shapes: dict[str, Sequence[int]] | None = None,
                static_inputs: dict[str, Any] | None = None) -> Graph:
    """Import an ONNX model (a path or a ``onnx.ModelProto``) as a partita Graph.

    ``input_shapes`` fixes the shape of graph inputs whose ONNX shape is symbolic or
    missing (partita shapes are static). ``static_inputs`` (name -> array) binds graph
    inputs to known values, treated like initializers: this is how a Reshape shape or
    Squeeze axes that arrive as graph inputs get the constant the importer needs. Initializers become ``param`` inputs with their
    arrays in ``graph.weights``. Raises OnnxImportError (a PartitaError) for a corrupt or
    truncated file, an opset older than 13, unsupported ops (all listed at once), or a
    node whose semantics partita cannot express, naming the node.
    """
    onnx = _onnx()
    proto, where = _load(model)
    opset = _opset(proto, where)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception as e:
        raise OnnxImportError(f"{where}: ONNX shape inference rejects the model: {e}") from None
    static = {k: np.asarray(v) for k, v in (static_inputs or {}).items()}
    return _Importer(inferred, where, opset).run(dict(input_shapes or {}), static)
