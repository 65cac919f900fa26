"""The static memory plan: buffers reused only when their lifetimes do not meet, views keep
their base alive, outputs never in the arena, and programs give the same results with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import partita
from partita.codegen import CompiledProgram
from partita.codegen.arena import ALIGN
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES

F32 = DTYPES["f32"]


def _mlp(layers=4, width=16, batch=8):
    b = Builder()
    x = b.input("x", TensorType((batch, width), F32))
    v = x
    for i in range(layers):
        w = b.param(f"w{i}", TensorType((width, width), F32))
        bias = b.param(f"b{i}", TensorType((width,), F32))
        h = b.matmul(v, w)
        v = b.tanh(b.mul(b.add(h, bias), b.full(shape=(), value=0.5)))
        t = b.transpose(v, perm=(1, 0))          # a view of v, read later
        v = b.add(v, b.transpose(t, perm=(1, 0)))
    return verify(b.ret(v))


def _weights(g, seed=0):
    rng = np.random.default_rng(seed)
    return {v.name: torch.from_numpy(rng.normal(0, 0.3, v.type.shape).astype(np.float32))
            for v in g.inputs if v.role == "param"}


def test_planned_buffers_never_overlap_while_both_live():
    g = _mlp()
    prog = CompiledProgram(g)
    plan = prog.memory_plan
    planned = plan.planned()
    assert len(planned) >= 4
    for i, a in enumerate(planned):
        assert a.offset % ALIGN == 0
        for b in planned[i + 1:]:
            if a.first <= b.last and b.first <= a.last:
                assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset, (a, b)
    assert plan.arena_bytes < plan.no_reuse_bytes, "buffers are reused"
    out = set(g.outputs) | set(prog.graph.outputs)
    assert not any(b.value in out for b in planned)


def test_same_results_with_and_without_the_plan_call_after_call():
    g = _mlp()
    ws = _weights(g)
    x = torch.randn(8, 16)
    want = CompiledProgram(g, plan_memory=False)([x], ws)[0]
    prog = CompiledProgram(g)
    first = prog([x], ws)[0]
    second = prog([x * 2], ws)[0]
    third = prog([x], ws)[0]
    assert torch.equal(first, want) and torch.equal(third, want)
    assert not torch.equal(second, want)
    assert first.data_ptr() != third.data_ptr(), "outputs are fresh tensors the caller keeps"


def test_the_plan_prints_and_reports_a_peak():
    prog = CompiledProgram(_mlp())
    text = prog.memory_plan.text()
    assert text.startswith("; memory plan:") and "arena" in text and "(ATen)" in text
    assert prog.memory_plan.peak_bytes >= prog.memory_plan.arena_bytes


@pytest.mark.parametrize("seed", range(8))
def test_random_graphs_agree_with_the_reference(seed):
    """Random elementwise/matmul chains with views, run twice through the arena."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_kernels import _float_graph, _inputs

    from strategies import run_reference

    g, rng = _float_graph(seed)
    ins = _inputs(g, rng)
    ref = run_reference(g, {v.name: a for v, a in zip(g.inputs, ins)})
    prog = CompiledProgram(g)
    for _ in range(2):
        got = [t.numpy() for t in prog([torch.from_numpy(a.copy()) for a in ins])]
        for r, o in zip(ref, got):
            np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_emit_memory_plan_cli(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    src = tmp_path / "g.pir"
    src.write_text(partita.print_graph(_mlp()))
    r = subprocess.run([sys.executable, "-m", "partita", "opt", str(src), "--emit=memory-plan"], capture_output=True,
                       text=True, cwd=str(Path(__file__).resolve().parents[2]), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("; memory plan:") and "live steps" in r.stdout


def test_large_matmuls_run_on_onednn_outside_the_plan():
    """A matmul of two activations above the library threshold runs as oneDNN's inner product
    (x @ b as linear(x, b.T)); its result is not in the arena, and the values are right."""
    b = Builder()
    x = b.input("x", TensorType((128, 256), F32))
    y = b.input("y", TensorType((256, 512), F32))
    z = b.tanh(b.matmul(b.exp(x), b.mul(y, y)))
    g = verify(b.ret(z))
    prog = CompiledProgram(g)
    assert len(prog.library_matmuls) == 1
    (mm,) = prog.library_matmuls
    buf = prog.memory_plan.by_value[mm.results[0]]
    assert buf.offset < 0 and "oneDNN" in buf.why
    xs, ys = torch.randn(128, 256) * 0.1, torch.randn(256, 512) * 0.1
    want = torch.tanh(torch.exp(xs) @ (ys * ys))
    torch.testing.assert_close(prog([xs, ys])[0], want, rtol=1e-5, atol=1e-5)


def test_linear_layers_on_the_generated_gemm_write_into_the_arena():
    """fuse-library makes linear_pointwise nodes of the constant-weight matmuls; those the
    generated GEMM runs have their results planned, and the values stay right call after call
    (the first call runs unpacked, later ones write into the arena)."""
    from partita.codegen import library as lib

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256),
                            torch.nn.Tanh(), torch.nn.Linear(256, 64)).eval().requires_grad_(False)
    x = torch.randn(64, 256)
    prog = CompiledProgram(partita.optimize(partita.import_torch(m, (x,))))
    lins = [n for n in prog.graph.nodes if n.op == "linear_pointwise"]
    assert len(lins) == 3
    inner = [n for n in lins if not n.results[0].is_output]
    assert inner and all(lib.writes_into(n) and prog.memory_plan.by_value[n.results[0]].offset >= 0 for n in inner)
    for i in range(3):
        xi = x * (i + 1)
        torch.testing.assert_close(prog([xi])[0], m(xi), rtol=1e-4, atol=1e-5)


def test_a_concat_copies_so_its_operands_keep_their_own_buffers():
    # a matmul's result concatenated with a parameter (ViT's class token): the concat makes a
    # new tensor, so the matmul's result is not an alias of the parameter and is planned; a
    # reshape (a view) still joins its operand's class
    from partita.codegen.arena import plan_memory

    b = Builder()
    x = b.input("x", TensorType((6, 8), F32))
    w = b.param("w", TensorType((8, 8), F32))
    tok = b.param("tok", TensorType((1, 8), F32))
    m = b.matmul(x, w)
    c = b.concat(tok, b.reshape(m, shape=(6, 8)), axis=0)
    g = verify(b.ret(b.exp(c)))
    nodes = list(g.nodes)
    plan = plan_memory(g, nodes)
    mm = next(n for n in nodes if n.op == "matmul")
    assert plan.by_value[mm.results[0]].why == "" and plan.by_value[mm.results[0]].offset >= 0
    prog = CompiledProgram(g)
    ws = {"w": torch.randn(8, 8), "tok": torch.randn(1, 8)}
    for i in range(3):
        xi = torch.randn(6, 8)
        want = torch.exp(torch.cat([ws["tok"], xi @ ws["w"]]))
        (got,) = prog([xi], ws)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


class _Attn(torch.nn.Module):
    """q, k, v projections viewed as heads, attention, the heads merged, an output projection:
    the reshapes and transposes between the kernels are views of buffers in the arena."""

    def __init__(self, d=128, heads=4):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))
        self.h = heads

    def forward(self, x):
        b, t, d = x.shape
        sp = lambda y: y.reshape(b, t, self.h, d // self.h).transpose(1, 2)  # noqa: E731
        a = torch.nn.functional.scaled_dot_product_attention(sp(self.q(x)), sp(self.k(x)), sp(self.v(x)))
        return self.o(a.transpose(1, 2).reshape(b, t, d))


def test_views_of_arena_buffers_are_made_once_and_read_the_buffer_from_the_first_call():
    from partita.backend.torch_exec import ConstantStep

    torch.manual_seed(0)
    m = _Attn().eval()
    x = torch.randn(2, 64, 128)
    prog = CompiledProgram(partita.optimize(partita.import_torch(m, (x,))))
    consts = [st for st in prog.program.steps if type(st[0]) is ConstantStep]
    assert prog.arena_view_steps == len(consts) >= 6
    assert all(st[7].op in ("reshape", "transpose") for st in consts)
    att = [n for n in prog.graph.nodes if n.op == "attention"]
    assert att and all(prog.memory_plan.by_value[r].offset >= 0 for r in att[0].results)  # in the arena
    for i in range(4):   # the first call runs the library's unpacked kernels, copied into the arena
        xi = torch.randn(2, 64, 128)
        with torch.no_grad():
            want = m(xi)
        (got,) = prog([xi])
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), i
