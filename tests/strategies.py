"""Hypothesis strategies for random valid graphs, and helpers to run and compare them.

Shared by test suites (passes, parser, verifier, backends). Import it as ``strategies``
(each suite's conftest puts ``tests/`` on ``sys.path``)::

    from strategies import graphs, random_inputs, assert_same_outputs

    @given(graphs())
    def test_something(g): ...

``graphs()`` draws a verified graph built with ``Builder`` from elementwise ops with
broadcasting, splat constants (``full`` and splat ``constant``, with 0 and 1 among their
values, so that simplification rules fire), dense constants, ``cast`` and ``where``, and,
when they are registered in ``OPS``, ``reshape``, ``transpose``, ``sum``, ``matmul``,
``broadcast_to``, ``slice`` and ``concat``. Op kinds that are not registered are skipped,
so the strategy works at every stage of the op library.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from hypothesis import strategies as st

import partita  # noqa: F401  (registers every op)
from partita.ir import Builder, Graph, PartitaError, TensorType, verify
from partita.ir.attrs import DenseAttr
from partita.ir.dtypes import DTYPES, f32
from partita.ir.graph import Value
from partita.ops.registry import OPS

__all__ = ["graphs", "random_inputs", "assert_same_outputs", "run_reference", "BINARY", "UNARY"]

BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "equal", "not_equal", "less",
          "greater_equal", "logical_and", "logical_or")
UNARY = ("neg", "abs", "relu", "exp", "tanh", "sigmoid", "sqrt", "log", "logical_not")
# Binary ops that have an identity the canonicalizer knows: paired with a splat constant.
_WITH_CONSTANT = ("add", "sub", "mul", "div", "pow")
_SPLAT_VALUES = (0, 1, 1, 0, -1, 2, 0.5)
_INPUT_DTYPES = ("f32", "f32", "f32", "f32", "i32", "i64", "bool", "f64", "f16")
_CAST_DTYPES = ("f32", "f64", "f16", "i32", "i64", "i8", "u8", "bool")


def _has(*ops: str) -> bool:
    return all(o in OPS for o in ops)


@st.composite
def shapes_like(draw, base: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``base``: a suffix of it with some dims set to 1."""
    k = draw(st.integers(0, len(base)))
    suffix = base[len(base) - k:]
    return tuple(1 if draw(st.booleans()) and draw(st.booleans()) else d for d in suffix)


class _GraphMaker:
    """Grows a graph one node at a time; a draw the type rules reject is simply skipped."""

    def __init__(self, draw, base: tuple[int, ...]) -> None:
        self.draw = draw
        self.base = base
        self.g = Graph("random")
        self.b = Builder(self.g)
        self.pool: list[Value] = []
        self.results: list[Value] = []

    def pick(self, pred=None) -> Value | None:
        cands = self.pool if pred is None else [v for v in self.pool if pred(v)]
        if not cands:
            return None
        # Prefer recent values, so graphs are chains more than fans.
        i = self.draw(st.integers(0, len(cands) - 1))
        j = self.draw(st.integers(0, len(cands) - 1))
        return cands[max(i, j)]

    def emit(self, op: str, *operands: Value, **attrs: Any) -> Value | None:
        if not _has(op) or any(v is None for v in operands):
            return None
        try:
            out = self.b.emit(op, *operands, **attrs)
        except PartitaError:
            return None
        v = out[0] if isinstance(out, tuple) else out
        self.pool.append(v)
        self.results.append(v)
        return v

    def splat(self, t: TensorType, value) -> Value | None:
        use_full = _has("full") and (not _has("constant") or self.draw(st.booleans()))
        if t.dtype.is_bool:
            value = bool(value)
        elif t.dtype.is_int:
            value = int(value)
            if t.dtype.kind == "uint":
                value = abs(value)
        if use_full:
            return self.emit("full", value=value, shape=t.shape, dtype=t.dtype)
        return self.emit("constant", value=DenseAttr(np.full(t.shape, value, dtype=t.dtype.np)))

    def dense(self, t: TensorType) -> Value | None:
        vals = self.draw(st.lists(st.integers(-3, 3), min_size=t.numel, max_size=t.numel))
        arr = np.array(vals, dtype=np.int64).reshape(t.shape)
        if t.dtype.kind == "uint":
            arr = np.abs(arr)
        return self.emit("constant", value=DenseAttr(arr.astype(t.dtype.np)))

    # --- one step per kind ---------------------------------------------------------------
    def step(self, kind: str) -> None:
        d = self.draw
        if kind == "binary":
            a = self.pick()
            b = a if d(st.integers(0, 5)) == 0 else self.pick()
            self.emit(d(st.sampled_from(BINARY)), a, b)
        elif kind == "unary":
            op = d(st.sampled_from(UNARY))
            v = self.emit(op, self.pick())
            if v is not None and d(st.booleans()):
                self.emit(op, v)  # op(op(x)): involutions and idempotent ops
        elif kind == "splat":
            a = self.pick()
            if a is None:
                return
            dt = a.type.dtype if d(st.booleans()) else DTYPES[d(st.sampled_from(("f32", "i32", "bool")))]
            c = self.splat(TensorType(d(shapes_like(self.base)), dt), d(st.sampled_from(_SPLAT_VALUES)))
            op = d(st.sampled_from(_WITH_CONSTANT))
            if c is not None:
                self.emit(op, *((a, c) if d(st.booleans()) else (c, a)))
        elif kind == "dense":
            t = TensorType(d(shapes_like(self.base)), DTYPES[d(st.sampled_from(("f32", "i32")))])
            c = self.dense(t)
            if c is not None:
                self.emit(d(st.sampled_from(BINARY)), self.pick(), c)
        elif kind == "cast":
            v = self.emit("cast", self.pick(), dtype=DTYPES[d(st.sampled_from(_CAST_DTYPES))])
            if v is not None and d(st.booleans()):
                self.emit("cast", v, dtype=DTYPES[d(st.sampled_from(_CAST_DTYPES))])
        elif kind == "where":
            c = self.pick(lambda v: v.type.dtype.is_bool)
            if c is None and _has("full") and d(st.booleans()):
                c = self.splat(TensorType((), DTYPES["bool"]), d(st.booleans()))
            if c is not None:
                x = self.pick()
                self.emit("where", c, x, x if d(st.booleans()) else self.pick())
        elif kind == "reshape":
            a = self.pick()
            if a is None:
                return
            dims = list(a.type.shape)
            choice = d(st.integers(0, 2))
            shape = [a.type.numel] if choice == 0 else dims[::-1] if choice == 1 else [1] + dims
            v = self.emit("reshape", a, shape=tuple(shape))
            if v is not None and d(st.booleans()):
                self.emit("reshape", v, shape=a.type.shape)
        elif kind == "transpose":
            a = self.pick(lambda v: v.type.rank >= 1)
            if a is None:
                return
            perm = tuple(d(st.permutations(range(a.type.rank))))
            v = self.emit("transpose", a, perm=perm)
            if v is not None and d(st.booleans()):
                self.emit("transpose", v, perm=tuple(d(st.permutations(range(a.type.rank)))))
        elif kind == "sum":
            a = self.pick(lambda v: v.type.rank >= 1)
            if a is None:
                return
            axes = sorted(d(st.sets(st.integers(0, a.type.rank - 1), max_size=a.type.rank)))
            self.emit("sum", a, axes=tuple(axes), keepdim=d(st.booleans()))
        elif kind == "matmul":
            a = self.pick(lambda v: v.type.rank >= 2 and not v.type.dtype.is_bool)
            if a is None:
                return
            rank = a.type.rank
            swap = tuple(range(rank - 2)) + (rank - 1, rank - 2)
            if d(st.booleans()):
                self.emit("matmul", a, self.emit("transpose", a, perm=swap))
            else:
                # matmul(transpose(a), transpose(c)) with c: [.., N, M] for a: [.., M, K]
                n = d(st.integers(1, 3))
                c = self.dense(TensorType(a.type.shape[:-2] + (n, a.type.shape[-2]), a.type.dtype))
                self.emit("matmul", self.emit("transpose", a, perm=swap), self.emit("transpose", c, perm=swap))
        elif kind == "broadcast_to":
            a = self.pick(lambda v: len(v.type.shape) <= len(self.base))
            if a is not None:
                v = self.emit("broadcast_to", a, shape=self.base)
                if v is not None and d(st.booleans()):
                    self.emit("broadcast_to", v, shape=self.base)
        elif kind == "slice":
            a = self.pick(lambda v: v.type.rank >= 1)
            if a is None:
                return
            axis = d(st.integers(0, a.type.rank - 1))
            n = a.type.shape[axis]
            self.emit("slice", a, axis=axis, start=d(st.integers(0, n)), end=d(st.one_of(st.none(), st.integers(0, n))),
                      step=d(st.integers(1, 2)))
        elif kind == "concat":
            a = self.pick(lambda v: v.type.rank >= 1)
            if a is not None:
                self.emit("concat", *([a] * d(st.integers(1, 2))), axis=0)


_KINDS = {
    "binary": (), "unary": (), "splat": (), "dense": ("constant",), "cast": ("cast",), "where": ("where",),
    "reshape": ("reshape",), "transpose": ("transpose",), "sum": ("sum",), "matmul": ("matmul", "transpose"),
    "broadcast_to": ("broadcast_to",), "slice": ("slice",), "concat": ("concat",),
}


@st.composite
def graphs(draw, max_nodes: int = 12, max_inputs: int = 3, kinds: Sequence[str] | None = None) -> Graph:
    """A random verified graph of up to about ``max_nodes`` steps (a step adds 1-3 nodes).

    ``kinds`` restricts the node kinds (default: every kind whose ops are registered; see
    ``_KINDS``). Some results are left unused, so dead code exists for DCE to remove.
    """
    avail = [k for k, need in _KINDS.items() if _has(*need) and (kinds is None or k in kinds)]
    if not (_has("full") or _has("constant")):
        avail = [k for k in avail if k != "splat"]
    rank = draw(st.integers(0, 3))
    base = tuple(draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank)))
    mk = _GraphMaker(draw, base)
    for i in range(draw(st.integers(1, max_inputs))):
        dt = DTYPES[draw(st.sampled_from(_INPUT_DTYPES))] if i else f32
        role = draw(st.sampled_from(("input", "input", "param")))
        mk.pool.append(mk.b.input(f"in{i}", TensorType(draw(shapes_like(base)), dt), role=role))
    for _ in range(draw(st.integers(1, max_nodes))):
        mk.step(draw(st.sampled_from(avail)))
    if not mk.results:
        mk.emit("neg", mk.pool[0]) or mk.emit("logical_not", mk.pool[0])
    outs = [mk.results[-1]]
    for _ in range(draw(st.integers(0, 2))):
        outs.append(draw(st.sampled_from(mk.pool)))
    mk.b.ret(*outs)
    return verify(mk.g)


# --- running and comparing ------------------------------------------------------------------

def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Arrays for every graph input (all roles), by name: floats ~ N(0, 2), integers in
    [-4, 4] (unsigned: [0, 8]), bools fair coins."""
    rng = np.random.default_rng(seed)
    out = {}
    for v in graph.inputs:
        t = v.type
        if t.dtype.is_bool:
            a = rng.random(t.shape) < 0.5
        elif t.dtype.is_int:
            lo, hi = (0, 9) if t.dtype.kind == "uint" else (-4, 5)
            a = rng.integers(lo, hi, size=t.shape)
        else:
            a = rng.normal(0.0, 2.0, size=t.shape)
        out[v.name] = np.asarray(a).astype(t.dtype.np)
    return out


def run_reference(graph: Graph, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``graph`` with the NumPy reference interpreter."""
    from partita.backend.numpy_ref import run

    return run(graph, inputs, {})


_TOL = {"f64": (1e-12, 1e-12), "f32": (1e-5, 1e-6), "f16": (2e-3, 1e-3), "bf16": (1e-2, 1e-2)}


def assert_same_outputs(before: Sequence[np.ndarray], after: Sequence[np.ndarray], what: str = "") -> None:
    """Outputs agree: same count, shapes and dtypes; floats allclose (tight, per dtype) with
    NaN at the same positions and infinities equal; other dtypes exactly equal."""
    assert len(before) == len(after), f"{what}: {len(before)} outputs before, {len(after)} after"
    for i, (a, b) in enumerate(zip(before, after)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, \
            f"{what}: output {i} is {a.dtype}{list(a.shape)} before, {b.dtype}{list(b.shape)} after"
        if a.dtype.kind in "biu":
            assert np.array_equal(a, b), f"{what}: output {i} differs:\n{a}\nvs\n{b}"
            continue
        name = {2: "f16", 4: "f32", 8: "f64"}.get(a.dtype.itemsize, "f32") if a.dtype.kind == "f" else "bf16"
        rtol, atol = _TOL[name]
        x, y = a.astype(np.float64), b.astype(np.float64)
        nan_x, nan_y = np.isnan(x), np.isnan(y)
        assert np.array_equal(nan_x, nan_y), f"{what}: output {i} has NaN at different positions:\n{a}\nvs\n{b}"
        assert np.allclose(x[~nan_x], y[~nan_y], rtol=rtol, atol=atol), \
            f"{what}: output {i} differs beyond rtol={rtol}, atol={atol}:\n{a}\nvs\n{b}"
