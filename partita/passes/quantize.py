"""``quantize``: int8 forms of a float graph's weights, for a smaller model.

Two forms, both with symmetric per-channel scales (``scale = max|w| / 127`` over each
channel, zero point 0, values in [-127, 127]):

- ``weight-only``: every float param of rank >= 2 (and at least ``min_elements`` entries)
  that feeds a matmul, a convolution or an embedding is stored as i8 with one f32 scale per
  output channel, and dequantized where it is read: ``dequantize_linear(q, scale, 0)``. The
  arithmetic stays in float; the weights take a quarter of the bytes (plus the scales).
- ``dynamic``: as weight-only, and in addition each ``matmul(x, W)`` whose weight feeds only
  matmuls as their right operand runs in integers, the activation quantized at run time
  with one scale per tensor from its own range (what ONNX Runtime's dynamic quantization
  and PyTorch's ``quantize_dynamic`` do): ``s_x = max|x| / 127``, ``q_x = quantize_linear(x,
  s_x, 0)``, ``acc = matmul_integer(q_x, q_W)`` (exact i32), ``y = dequantize_linear(acc,
  s_x * s_W)``.

The channel of a weight is its last dim when every use is the right operand of a matmul
(``x @ W``: one scale per output column), else its first (a convolution's output channels,
an embedding's rows, a transposed linear weight ``[out, in]``). Each quantized weight
``name`` becomes two params, ``name.qweight`` (i8) and ``name.scale`` (f32), with their
arrays in ``graph.weights``; the float param leaves the signature.

``quantize(graph, mode)`` rewrites the graph in place and returns a ``QuantizeReport``:
per weight, its bytes before and after and the largest rounding error relative to the
weight's range; the bytes of every param before and after. The accuracy of the result is
the caller's to measure on data (``bench/bench_quantize.py`` does it for the model suite).
Quantize inference graphs: the forms have no gradient (run it after any training).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ir import dtypes as dt
from ..ir.attrs import DenseAttr
from ..ir.builder import Builder
from ..ir.diagnostics import PassError
from ..ir.graph import Graph, Node, Value, input_name
from ..ir.types import TensorType
from .manager import Pass, register_pass

MODES = ("weight-only", "dynamic")
_QMAX = 127
# Ops that read a weight as a weight; a param any other op reads is left in float.
_WEIGHT_USES = {"matmul": 1, "conv2d": 1, "conv3d": 1, "conv_transpose2d": 1, "conv_transpose3d": 1,
                "embedding": 0, "transpose": 0, "reshape": 0}
_FLOATS = (dt.f32, dt.f16, dt.bf16, dt.f64)


@dataclass
class QuantizedWeight:
    name: str
    shape: tuple[int, ...]
    axis: int
    form: str                 # "weight-only" or "dynamic" (its matmuls run in integers)
    bytes_before: int
    bytes_after: int
    max_error: float          # largest |w - dequantized w| / max|w|


@dataclass
class QuantizeReport:
    mode: str
    weights: list[QuantizedWeight] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (param, why it stays float)
    param_bytes_before: int = 0
    param_bytes_after: int = 0

    @property
    def saved(self) -> int:
        """Bytes of params saved."""
        return self.param_bytes_before - self.param_bytes_after

    @property
    def ratio(self) -> float:
        """Param bytes after over before."""
        return self.param_bytes_after / self.param_bytes_before if self.param_bytes_before else 1.0

    def __str__(self) -> str:
        lines = [f"quantize ({self.mode}): {len(self.weights)} weight(s) to int8; params "
                 f"{_mib(self.param_bytes_before)} -> {_mib(self.param_bytes_after)} "
                 f"({self.ratio:.1%}, {_mib(self.saved)} saved)"]
        for w in self.weights:
            lines.append(f"  {w.name} {list(w.shape)} per channel on axis {w.axis}, {w.form}: "
                         f"{w.bytes_before} -> {w.bytes_after} bytes, max error {w.max_error:.2e} of its range")
        for name, why in self.skipped:
            lines.append(f"  {name}: kept in float ({why})")
        return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def quantize_weight(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, f32 scales) of ``w`` with a symmetric scale per index of ``axis``."""
    w32 = np.asarray(w, dtype=np.float32)
    other = tuple(i for i in range(w32.ndim) if i != axis)
    amax = np.max(np.abs(w32), axis=other) if other else np.abs(w32)
    scale = np.where(amax > 0, amax / _QMAX, 1.0).astype(np.float32)
    shape = [1] * w32.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w32 / scale.reshape(shape)), -_QMAX, _QMAX).astype(np.int8)
    return q, scale


def _uses(v: Value) -> list[tuple[Node, int]]:
    return [(n, i) for n in v.users for i, x in enumerate(n.operands) if x is v]


def _candidate(v: Value, min_elements: int) -> str | None:
    """Why the param ``v`` stays in float, or None when it is quantized."""
    if v.type.rank < 2:
        return "rank < 2 (biases and norm weights stay in float)"
    if v.type.numel < min_elements:
        return f"{v.type.numel} elements, under min_elements={min_elements}"
    if v.is_output:
        return "it is a graph output"
    for n, i in _uses(v):
        if _WEIGHT_USES.get(n.op) != i:
            return f"read by {n.op} (operand {i}), which is not a weight use"
    return None


def _only_matmul_rhs(v: Value) -> bool:
    uses = _uses(v)
    return bool(uses) and all(n.op == "matmul" and i == 1 for n, i in uses)


def _integer_uses(v: Value) -> tuple[int, list[tuple[Node, Node | None]]] | None:
    """(channel axis, [(matmul, transpose or None)]) when every use of the 2-D weight ``v`` is
    the right operand of a matmul, directly (``x @ W``, channels on axis 1) or through one
    transpose (``x @ W.T`` as torch's Linear is imported: channels on axis 0); else None."""
    if v.type.rank != 2:
        return None
    if _only_matmul_rhs(v):
        return 1, [(n, None) for n, _ in _uses(v)]
    found: list[tuple[Node, Node | None]] = []
    for t, _ in _uses(v):
        if t.op != "transpose" or list(t.attrs["perm"]) != [1, 0] or not _only_matmul_rhs(t.result):
            return None
        found += [(n, t) for n, _ in _uses(t.result)]
    return (0, found) if found else None


def quantize(graph: Graph, mode: str = "weight-only", min_elements: int = 1024) -> QuantizeReport:
    """Rewrite ``graph``'s weights into int8 forms (in place); see the module docstring."""
    if mode not in MODES:
        raise PassError(f"quantize: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(min_elements, int) or min_elements < 0:
        raise PassError(f"quantize: min_elements must be a non-negative integer, got {min_elements!r}")
    report = QuantizeReport(mode)
    params = [v for v in graph.inputs if v.role == "param"]
    report.param_bytes_before = sum(v.type.nbytes for v in params)
    for v in params:
        name = input_name(v)
        if v.type.dtype not in _FLOATS or not v.has_uses:
            continue
        why = _candidate(v, min_elements)
        if why is None and name not in graph.weights:
            why = "no value in graph.weights"
        if why is not None:
            report.skipped.append((name, why))
            continue
        integer = _integer_uses(v) if mode == "dynamic" else None
        axis = integer[0] if integer is not None else (v.type.rank - 1 if _only_matmul_rhs(v) else 0)
        report.weights.append(_rewrite(graph, v, name, axis, integer[1] if integer is not None else None))
    report.param_bytes_after = sum(v.type.nbytes for v in graph.inputs if v.role == "param")
    return report


def _zeros(b: Builder, shape: tuple[int, ...], dtype: dt.DType) -> Value:
    return b.emit("full", shape=shape, value=0, dtype=dtype)


def _rewrite(graph: Graph, w: Value, name: str, axis: int,
             integer: list[tuple[Node, Node | None]] | None) -> QuantizedWeight:
    arr = np.asarray(graph.weights[name])
    q, scale = quantize_weight(arr, axis)
    qv = graph.add_input(f"{name}.qweight", TensorType(q.shape, dt.i8), "param")
    sv = graph.add_input(f"{name}.scale", TensorType(scale.shape, dt.f32), "param")
    graph.weights[input_name(qv)] = q
    graph.weights[input_name(sv)] = scale
    back = q.astype(np.float32) * scale.reshape([-1 if i == axis else 1 for i in range(q.ndim)])
    rng = float(np.max(np.abs(arr.astype(np.float32)))) or 1.0
    err = float(np.max(np.abs(back - arr.astype(np.float32)))) / rng
    first = min((n for n in w.users), key=_position(graph))
    b = Builder(graph).set_insertion_before(first)
    if integer is not None:
        transposed: dict[Node, Value] = {}
        for mm, t in integer:
            if t is not None and t not in transposed:
                transposed[t] = Builder(graph).set_insertion_before(t).emit("transpose", qv, perm=(1, 0), loc=t.loc)
            _integer_matmul(graph, mm, qv if t is None else transposed[t], sv)
        for t in transposed:
            graph.erase(t)
    else:
        zp = _zeros(b, scale.shape, dt.i8)
        deq = b.emit("dequantize_linear", qv, sv, zp, axis=axis, loc=first.loc)
        if w.type.dtype is not dt.f32:
            deq = b.emit("cast", deq, dtype=w.type.dtype, loc=first.loc)
        graph.replace_all_uses(w, deq)
    graph.remove_input(w)
    del graph.weights[name]
    return QuantizedWeight(name, tuple(arr.shape), axis, "dynamic" if integer is not None else "weight-only",
                           int(arr.nbytes), int(q.nbytes + scale.nbytes), err)


def _position(graph: Graph):
    order = {n: k for k, n in enumerate(graph.nodes)}
    return lambda n: order[n]


def _integer_matmul(graph: Graph, mm: Node, qw: Value, sw: Value) -> None:
    """``x @ W`` as ``dequantize(matmul_integer(quantize(x, s_x), q_W), s_x * s_W)``."""
    x = mm.operands[0]
    b = Builder(graph).set_insertion_before(mm)
    loc = mm.loc
    xf = x if x.type.dtype is dt.f32 else b.emit("cast", x, dtype=dt.f32, loc=loc)
    amax = b.emit("max", b.emit("abs", xf, loc=loc), loc=loc)
    # A zero activation would give scale 0 and 0/0 in the quantize: floor the range.
    tiny = b.emit("constant", value=DenseAttr(np.array(1e-12, np.float32)), loc=loc)
    qmax = b.emit("constant", value=DenseAttr(np.array(_QMAX, np.float32)), loc=loc)
    sx = b.emit("div", b.emit("maximum", amax, tiny, loc=loc), qmax, loc=loc)
    zp8 = _zeros(b, (), dt.i8)
    qx = b.emit("quantize_linear", xf, sx, zp8, loc=loc)
    acc = b.emit("matmul_integer", qx, qw, zp8, zp8, loc=loc)
    n = qw.type.shape[1]
    s = b.emit("mul", sw, sx, loc=loc)
    y = b.emit("dequantize_linear", acc, s, _zeros(b, (n,), dt.i32), axis=acc.type.rank - 1, loc=loc)
    if y.type.dtype is not mm.result.type.dtype:
        y = b.emit("cast", y, dtype=mm.result.type.dtype, loc=loc)
    if mm.result.name is not None:
        y.name = mm.result.name
    graph.replace_all_uses(mm.result, y)
    graph.erase(mm)


@register_pass
class Quantize(Pass):
    """``quantize``: see the module docstring. Options: ``mode`` (weight-only, dynamic),
    ``min-elements``."""

    name = "quantize"

    @dataclass
    class Options:
        mode: str = "weight-only"
        min_elements: int = 1024

    def run(self, graph: Graph) -> Graph:
        report = quantize(graph, self.options.mode, self.options.min_elements)
        self.report = report
        return graph
