"""ONNX's sequence operators: SequenceConstruct, SequenceEmpty, SequenceInsert, SequenceErase,
SequenceAt, SequenceLength, SplitToSequence and ConcatFromSequence.

partita's values are tensors, so a sequence whose structure is static (constant positions,
static split sizes) is unrolled at import time: the importer holds it as a Python list of
Values, and only the tensors read out of it (SequenceAt, ConcatFromSequence) reach the graph.
The input positions that take a sequence are registered with each converter
(``sequence_operands``).
"""

from __future__ import annotations

import numpy as np

from ...ir.attrs import DenseAttr
from ...ir.graph import Value
from .common import OnnxNode, onnx_type_name
from .registry import converter

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


@converter("SequenceConstruct")
def _sequence_construct(n: OnnxNode) -> SeqResult:
    items = [n.input(i) for i in range(len(n.inputs))]
    for t in items[1:]:
        _check_dtype(n, items, t)
    return [items]


@converter("SequenceEmpty")
def _sequence_empty(n: OnnxNode) -> SeqResult:
    # The element type does not matter to an unrolled (empty) list, but it must be one ONNX has.
    code = n.attr("dtype", 1)
    if onnx_type_name(code) == str(code):
        raise n.error(f"attribute 'dtype': {code} is not an ONNX element-type code (TensorProto.DataType)")
    return [[]]


@converter("SequenceInsert", constant_operands=(2,), sequence_operands=(0,))
def _sequence_insert(n: OnnxNode) -> SeqResult:
    items, t = n.seq(0), n.input(1)
    _check_dtype(n, items, t)
    pos = _position(n, 2, len(items), len(items)) if n.has_input(2) else len(items)
    return [items[:pos] + [t] + items[pos:]]


@converter("SequenceErase", constant_operands=(1,), sequence_operands=(0,))
def _sequence_erase(n: OnnxNode) -> SeqResult:
    items = n.seq(0)
    if not items:
        raise n.error("cannot erase from an empty sequence")
    pos = _position(n, 1, len(items), len(items) - 1) if n.has_input(1) else len(items) - 1
    return [items[:pos] + items[pos + 1:]]


@converter("SequenceAt", constant_operands=(1,), sequence_operands=(0,))
def _sequence_at(n: OnnxNode) -> SeqResult:
    items = n.seq(0)
    if not items:
        raise n.error("cannot read a tensor from an empty sequence")
    return [items[_position(n, 1, len(items), len(items) - 1)]]


@converter("SequenceLength", sequence_operands=(0,))
def _sequence_length(n: OnnxNode) -> SeqResult:
    arr = np.array(len(n.seq(0)), dtype=np.int64)
    # The length is static, so it can feed operands that must be constants.
    n.ctx.consts[n.proto.output[0]] = arr
    return [n.emit("constant", value=DenseAttr(arr))]


@converter("SplitToSequence", constant_operands=(1,))
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


@converter("ConcatFromSequence", sequence_operands=(0,))
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
