"""Generated kernels against the reference interpreter.

Random elementwise graphs (tests/codegen/test_kernels.py's own generator, seeded) over shapes
that are not multiples of the vector width, empty and 0-d tensors, and broadcasting, in two
families: exact ops (arithmetic without transcendental functions, comparisons, logic, where,
casts, integer ops), whose kernels must agree with the reference bit for bit; and float chains
with exp/log/tanh/erf/sigmoid/gelu/silu/sqrt, which must agree to a few ulp (the tolerance of
``strategies.assert_same_outputs``). Every case also checks that no fused node fell back to
ATen, so the kernels, not ATen, are what is compared.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import partita
from partita.codegen import CompiledProgram, fallbacks, plan_groups
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES

from strategies import assert_same_outputs, run_reference

SHAPES = [(), (0,), (1,), (7,), (9,), (17,), (3, 5), (2, 0, 3), (4, 33), (2, 3, 9), (5, 1, 7), (2, 2, 2, 11), (65,)]


def _sub_shape(rng, space):
    """A shape that broadcasts to ``space``."""
    k = int(rng.integers(0, len(space) + 1))
    suffix = space[len(space) - k:]
    return tuple(1 if rng.random() < 0.3 else d for d in suffix)


def _inputs(graph, rng):
    out = []
    for v in graph.inputs:
        t = v.type
        if t.dtype.is_bool:
            a = rng.random(t.shape) < 0.5
        elif t.dtype.is_int:
            a = rng.integers(-6, 7, size=t.shape)
        else:
            a = rng.normal(0.0, 2.0, size=t.shape)
            if a.size and rng.random() < 0.3:
                flat = a.reshape(-1)
                flat[rng.integers(0, flat.size)] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0])
        out.append(np.asarray(a).astype(t.dtype.np))
    return out


EXACT_BINARY = ["add", "sub", "mul", "maximum", "minimum", "equal", "not_equal", "less", "less_equal", "greater",
                "greater_equal", "logical_and", "logical_or"]
EXACT_UNARY = ["neg", "abs", "relu", "sign", "logical_not"]
FLOAT_UNARY = ["exp", "tanh", "sigmoid", "erf", "silu", "gelu", "gelu_tanh", "sqrt", "abs", "neg", "relu", "log", "rsqrt"]
FLOAT_BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "relu_grad", "sigmoid_grad", "tanh_grad",
                "silu_grad", "gelu_grad", "gelu_grad_tanh"]


def _exact_graph(seed):
    rng = np.random.default_rng(seed)
    space = SHAPES[seed % len(SHAPES)]
    b = Builder()
    pool = []
    for i in range(int(rng.integers(1, 4))):
        dt = DTYPES[str(rng.choice(["f32", "f32", "f64", "i32", "i64", "bool"]))]
        pool.append(b.input(f"x{i}", TensorType(space if i == 0 else _sub_shape(rng, space), dt)))
    made = []
    for _ in range(int(rng.integers(2, 9))):
        kind = rng.random()
        try:
            if kind < 0.45:
                op = str(rng.choice(EXACT_BINARY))
                a, c = pool[int(rng.integers(len(pool)))], pool[int(rng.integers(len(pool)))]
                if op in ("add", "sub", "mul", "maximum", "minimum") and (a.type.dtype.is_bool or c.type.dtype.is_bool):
                    continue
                v = b.emit(op, a, c)
            elif kind < 0.65:
                op = str(rng.choice(EXACT_UNARY))
                a = pool[int(rng.integers(len(pool)))]
                if op != "logical_not" and a.type.dtype.is_bool:
                    continue
                v = b.emit(op, a)
            elif kind < 0.8:
                a = pool[int(rng.integers(len(pool)))]
                to = DTYPES[str(rng.choice(["f32", "f64", "i32", "i64", "bool"]))]
                v = b.emit("cast", a, dtype=to)
            elif kind < 0.9:
                conds = [p for p in pool if p.type.dtype.is_bool]
                if not conds:
                    continue
                v = b.emit("where", conds[int(rng.integers(len(conds)))], pool[int(rng.integers(len(pool)))],
                           pool[int(rng.integers(len(pool)))])
            else:
                a = pool[int(rng.integers(len(pool)))]
                if a.type.dtype.is_bool:
                    continue
                c = b.emit("full", shape=(), value=float(rng.choice([0.5, -1.0, 2.0, 3.0])), dtype=DTYPES["f32"]) \
                    if a.type.dtype.is_float else b.emit("full", shape=(), value=int(rng.integers(-3, 4)), dtype=a.type.dtype)
                v = b.emit(str(rng.choice(["add", "mul", "maximum"])), a, c)
        except partita.PartitaError:
            continue
        pool.append(v)
        made.append(v)
    if not made:
        made.append(b.emit("logical_not", pool[0]) if pool[0].type.dtype.is_bool else b.emit("neg", pool[0]))
    outs = [made[-1]] + ([made[0]] if len(made) > 2 and rng.random() < 0.5 else [])
    b.ret(*outs)
    return verify(b.graph), rng


def _float_graph(seed):
    rng = np.random.default_rng(1000 + seed)
    space = SHAPES[seed % len(SHAPES)]
    dt = DTYPES["f64" if seed % 5 == 4 else "f32"]
    b = Builder()
    pool = [b.input("x0", TensorType(space, dt))]
    for i in range(1, int(rng.integers(1, 3)) + 1):
        pool.append(b.input(f"x{i}", TensorType(_sub_shape(rng, space), dt)))
    made = []
    for _ in range(int(rng.integers(2, 10))):
        if rng.random() < 0.12 and made:
            # a reshape of a computed value (free inside a kernel: one flat index)
            v = made[-1]
            n = v.type.numel
            divs = [d for d in range(1, n + 1) if n and n % d == 0]
            shape = (n,) if not divs or rng.random() < 0.4 else (int(rng.choice(divs)), n // int(rng.choice(divs)))
            if len(shape) == 2 and shape[0] * shape[1] != n:
                shape = (shape[0], n // shape[0])
            v = b.emit("reshape", v, shape=shape)
            pool.append(v)
            made.append(v)
            if rng.random() < 0.5:
                pool.append(b.input(f"x{len(b.graph.inputs)}", TensorType(_sub_shape(rng, shape), dt)))
            continue
        if rng.random() < 0.5:
            op = str(rng.choice(FLOAT_UNARY))
            a = pool[int(rng.integers(len(pool)))]
            if op in ("log", "sqrt", "rsqrt"):
                a = b.emit("abs", a)
            if op == "gelu_tanh":
                v = b.emit("gelu", a, approximate="tanh")
            else:
                v = b.emit(op, a)
        else:
            op = str(rng.choice(FLOAT_BINARY))
            try:
                lhs, rhs = pool[int(rng.integers(len(pool)))], pool[int(rng.integers(len(pool)))]
                if op.endswith("_grad") or op == "gelu_grad_tanh":
                    # dy and the forward value have the same type (the rule requires it)
                    rhs = b.emit("add", rhs, b.emit("mul", lhs, b.emit("full", shape=(), value=0.0, dtype=dt)))
                    lhs = b.emit("add", lhs, b.emit("mul", rhs, b.emit("full", shape=(), value=0.0, dtype=dt)))
                if op == "gelu_grad_tanh":
                    v = b.emit("gelu_grad", lhs, rhs, approximate="tanh")
                else:
                    v = b.emit(op, lhs, rhs)
            except partita.PartitaError:
                continue  # shapes that do not broadcast (after a reshape)
        pool.append(v)
        made.append(v)
    if not made:
        made.append(b.emit("exp", pool[0]))
    b.ret(made[-1], made[len(made) // 2])
    return verify(b.graph), rng


def _check(graph, rng, exact: bool):
    before = len(fallbacks())
    prog = CompiledProgram(graph)
    assert len(fallbacks()) == before, fallbacks()[before:]
    ins = _inputs(graph, rng)
    ref = run_reference(graph, {v.name: a for v, a in zip(graph.inputs, ins)})
    got = [partita.backend.torch_exec.to_numpy(t) for t in prog([torch.from_numpy(a.copy()) for a in ins])]
    if exact:
        for r, g in zip(ref, got):
            assert r.dtype == g.dtype and r.shape == g.shape
            if r.dtype.kind == "f":
                assert np.array_equal(r, g, equal_nan=True), (r, g, partita.print_graph(prog.graph))
            else:
                assert np.array_equal(r, g), (r, g, partita.print_graph(prog.graph))
    else:
        # Within the reference's tolerance, or, where the graph itself amplifies rounding (a sqrt
        # near 0 after a GELU), no further from the reference than twice what ATen's own
        # kernels are from it there.
        aten = [partita.backend.torch_exec.to_numpy(t) for t in
                partita.backend.torch_exec.TorchProgram(graph)([torch.from_numpy(a.copy()) for a in ins])]
        for r, g, a in zip(ref, got, aten):
            assert r.dtype == g.dtype and r.shape == g.shape
            assert np.array_equal(np.isnan(r), np.isnan(g)), (r, g)
            fin = ~np.isnan(r)
            rtol, atol = (1e-5, 1e-6) if r.dtype == np.float32 else (1e-12, 1e-12)
            r64, g64, a64 = (x[fin].astype(np.float64) for x in (r, g, a))
            inf = np.isinf(r64)
            assert np.array_equal(r64[inf], g64[inf])
            with np.errstate(invalid="ignore"):
                allowed = atol + rtol * np.abs(r64) + 2 * np.abs(a64 - r64)
                bad = np.abs(g64 - r64)[~inf] > allowed[~inf]
            assert not bad.any(), (partita.print_graph(prog.graph), r64[~inf][bad], g64[~inf][bad], a64[~inf][bad])
    return prog


@pytest.mark.parametrize("seed", range(60))
def test_exact_ops_bit_for_bit(seed):
    graph, rng = _exact_graph(seed)
    _check(graph, rng, exact=True)


@pytest.mark.parametrize("seed", range(100))
def test_float_chains_within_ulps(seed):
    graph, rng = _float_graph(seed)
    _check(graph, rng, exact=False)


def test_kernels_are_made_for_random_cases():
    """The random families do fuse (otherwise the tests above compare ATen with itself)."""
    fused = sum(1 for s in range(60) for g in (_exact_graph(s)[0], _float_graph(s)[0]) if plan_groups(g))
    assert fused >= 80


def test_clamp_chain_is_one_kernel_and_bit_exact():
    b = Builder()
    x = b.input("x", TensorType((37, 129), DTYPES["f32"]))
    v = x
    for _ in range(12):
        v = b.minimum(b.maximum(v, b.full(shape=(), value=-2.0)), b.full(shape=(), value=2.0))
        v = b.add(b.mul(v, b.full(shape=(), value=1.01)), b.full(shape=(), value=0.1))
    g = verify(b.ret(v))
    prog = CompiledProgram(g)
    assert [n.op for n in prog.graph.nodes] == ["fused"]
    xs = torch.randn(37, 129) * 3
    xs[0, 0] = float("nan")
    want = partita.backend.torch_exec.TorchProgram(g)([xs])[0]
    got = prog([xs])[0]
    assert torch.equal(torch.isnan(want), torch.isnan(got))
    assert torch.equal(torch.nan_to_num(want), torch.nan_to_num(got))


@pytest.mark.parametrize("team", [True, False])
def test_two_threads_split_the_outer_loop(team, monkeypatch):
    # team: torch's OpenMP team (libgomp); else the Python pool, as without libgomp
    from partita.codegen import cpu

    if not team:
        monkeypatch.setattr(cpu, "_SPLIT", False)
    b = Builder()
    x = b.input("x", TensorType((300, 513), DTYPES["f32"]))
    y = b.input("y", TensorType((513,), DTYPES["f32"]))
    g = verify(b.ret(b.tanh(b.add(b.mul(x, y), y))))
    prog = CompiledProgram(g)
    xs, ys = torch.randn(300, 513), torch.randn(513)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = prog([xs, ys])[0]
        torch.set_num_threads(2)
        two = prog([xs, ys])[0]
    finally:
        torch.set_num_threads(old)
    assert torch.equal(one, two)
    if team and cpu.gomp_loaded():
        assert cpu._PSPLIT        # the split ran on a launcher of the team


def test_non_contiguous_operand_is_read_right():
    """A transpose the ATen path returns as a view is made contiguous before the kernel reads it."""
    b = Builder()
    x = b.input("x", TensorType((6, 10), DTYPES["f32"]))
    t = b.transpose(x, perm=(1, 0))
    g = verify(b.ret(b.exp(b.add(t, t))))
    prog = CompiledProgram(g)
    xs = torch.randn(6, 10)
    assert torch.allclose(prog([xs])[0], torch.exp(xs.t() * 2), rtol=1e-6)


@pytest.mark.parametrize("fn", ["exp", "log", "tanh", "erf"])
def test_math_functions_over_the_float_range(fn):
    """The f32 math library (mathlib.py) over 2**20 random bit patterns and a dense grid:
    ulp error bounds as documented, NaN and infinities where the reference has them."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2 ** 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), np.linspace(-12, 12, 100_001, dtype=np.float32),
                        np.array([0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 88.72, 88.73, -103.9, -104,
                                  1.17e-38, 0.0004, -0.0004], np.float32)])
    b = Builder()
    xi = b.input("x", TensorType(x.shape, DTYPES["f32"]))
    g = verify(b.ret(b.emit(fn, xi)))
    prog = CompiledProgram(g, min_ops=1)
    assert [n.op for n in prog.graph.nodes] == ["fused"]
    got = prog([torch.from_numpy(x)])[0].numpy()
    with np.errstate(all="ignore"):
        ref64 = np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)) if fn == "erf" else \
            getattr(np, fn)(x.astype(np.float64))
        ref = ref64.astype(np.float32)
    assert np.array_equal(np.isnan(ref), np.isnan(got))
    inf = np.isinf(ref) | np.isinf(got)
    assert np.array_equal(ref[inf], got[inf])
    fin = ~(np.isnan(ref) | inf)
    ulp = np.abs(got[fin].astype(np.float64) - ref64[fin]) / np.spacing(np.abs(ref[fin])).astype(np.float64)
    bound = {"exp": 1.0, "log": 1.0, "tanh": 5.0, "erf": 4.0}[fn]
    assert ulp.max() <= bound, (fn, ulp.max(), x[fin][np.argmax(ulp)])


RED_SHAPES = [((4,), 1), ((3, 7), 1), ((2, 3, 9), 2), ((5, 17), 1), ((2, 1, 33), 1), ((1, 65), 1), ((4, 2, 3), 3)]


def _reduction_graph(seed):
    """prologue (elementwise, with broadcast inputs) -> sum/mean/max/min over trailing axes ->
    row epilogue (elementwise on the row values, with splats and a row-size input)."""
    rng = np.random.default_rng(2000 + seed)
    shape, k = RED_SHAPES[seed % len(RED_SHAPES)]
    dt = DTYPES["f64" if seed % 6 == 5 else "f32"]
    b = Builder()
    x = b.input("x", TensorType(shape, dt))
    w = b.input("w", TensorType(shape[len(shape) - k:], dt))
    v = b.mul(x, w)
    for _ in range(int(rng.integers(0, 3))):
        op = str(rng.choice(["tanh", "exp", "abs", "neg", "relu"]))
        v = b.emit(op, v)
    if rng.random() < 0.5:
        v = b.pow(v, b.full(shape=(), value=2.0, dtype=dt))
    red = str(rng.choice(["sum", "mean", "max", "min"]))
    keep = bool(rng.random() < 0.5)
    axes = tuple(range(len(shape) - k, len(shape)))
    r = b.emit(red, v, axes=axes, keepdim=keep)
    rows = b.input("rows", r.type)
    for _ in range(int(rng.integers(1, 4))):
        op = str(rng.choice(["add_eps", "rsqrt_abs", "mul_rows", "tanh"]))
        if op == "add_eps":
            r = b.add(r, b.full(shape=(), value=1e-6, dtype=dt))
        elif op == "rsqrt_abs":
            r = b.rsqrt(b.add(b.abs(r), b.full(shape=(), value=1e-3, dtype=dt)))
        elif op == "mul_rows":
            r = b.mul(r, rows)
        else:
            r = b.tanh(r)
    b.ret(r)
    return verify(b.graph), rng


@pytest.mark.parametrize("seed", range(42))
def test_row_reductions_against_the_reference(seed):
    graph, rng = _reduction_graph(seed)
    prog = _check(graph, rng, exact=False)
    assert not any(n.op in ("sum", "mean", "max", "min") for n in prog.graph.nodes), \
        partita.print_graph(prog.graph)
