"""The ``fuse-activations`` pass: spelled-out GELU (tanh and erf forms) and SiLU chains
become one fused op, with the same values up to rounding, and nothing else does."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import partita
from partita.ir import Graph, TensorType, parse, print_graph, verify
from partita.ir.builder import Builder
from partita.ir.dtypes import bf16, f32, f64, i64
from partita.ir.graph import Value
from partita.passes import PASSES, PassManager
from partita.passes.fuse import FuseActivations

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
SHAPE = (4, 8)


def ops(g: Graph) -> list[str]:
    return [n.op for n in g.nodes]


def fused(g: Graph) -> Graph:
    """A copy of ``g`` after ``fuse-activations,dce`` (verified after each pass)."""
    out = g.clone()
    PassManager.parse("fuse-activations,dce").run(out)
    verify(out)
    return out


def const(b: Builder, value: float, dtype=f32, shape: tuple[int, ...] = ()) -> Value:
    return b.full(value=value, shape=shape, dtype=dtype)


# --- chain builders: every spelling the pass must recognise --------------------------------

def _mul(b: Builder, a: Value, c: Value, swap: bool) -> Value:
    return b.mul(c, a) if swap else b.mul(a, c)


def _add(b: Builder, a: Value, c: Value, swap: bool) -> Value:
    return b.add(c, a) if swap else b.add(a, c)


def outer(b: Builder, x: Value, core: Value, assoc: str, swap: bool, half: float = 0.5, dtype=f32,
          half_shape: tuple[int, ...] = ()) -> Value:
    """``half * x * core`` in association ``assoc``: "a" (0.5 x)(core), "b" x (0.5 core),
    "c" (x core) 0.5."""
    h = const(b, half, dtype, half_shape)
    if assoc == "a":
        return _mul(b, _mul(b, x, h, swap), core, swap)
    if assoc == "b":
        return _mul(b, x, _mul(b, h, core, swap), swap)
    return _mul(b, _mul(b, x, core, swap), h, swap)


def gelu_tanh_chain(b: Builder, x: Value, *, cube: str = "pow", assoc: str = "a", swap: bool = False,
                    half: float = 0.5, coef: float = 0.044715, scale: float = SQRT_2_OVER_PI,
                    inner_x: Value | None = None, dtype=f32, half_shape: tuple[int, ...] = ()) -> Value:
    """HF ``gelu_new``: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); ``inner_x`` replaces
    x inside the tanh (a chain that is not the activation of one value)."""
    xi = x if inner_x is None else inner_x
    if cube == "pow":
        x3 = b.pow(xi, const(b, 3.0, dtype))
    elif cube == "mul-left":
        x3 = b.mul(b.mul(xi, xi), xi)
    else:
        x3 = b.mul(xi, b.mul(xi, xi))
    inner = _add(b, xi, _mul(b, x3, const(b, coef, dtype), swap), swap)
    t = b.tanh(_mul(b, inner, const(b, scale, dtype), swap))
    core = _add(b, t, const(b, 1.0, dtype), swap)
    return outer(b, x, core, assoc, swap, half, dtype, half_shape)


def gelu_erf_chain(b: Builder, x: Value, *, scale: str = "mul", assoc: str = "a", swap: bool = False,
                   factor: float | None = None, dtype=f32) -> Value:
    """BERT's written-out GELU: 0.5 x (1 + erf(x / sqrt(2))), or with x * 0.70710678."""
    if scale == "mul":
        arg = _mul(b, x, const(b, math.sqrt(0.5) if factor is None else factor, dtype), swap)
    else:
        arg = b.div(x, const(b, math.sqrt(2.0) if factor is None else factor, dtype))
    core = _add(b, b.erf(arg), const(b, 1.0, dtype), swap)
    return outer(b, x, core, assoc, swap, dtype=dtype)


def graph_of(build: Callable[[Builder, Value], Value], dtype=f32, shape=SHAPE) -> Graph:
    g = Graph("act")
    b = Builder(g)
    x = b.input("x", TensorType(shape, dtype))
    b.ret(build(b, x))
    verify(g)
    return g


def assert_same_values(before: Graph, after: Graph, seed: int = 0) -> None:
    """Both graphs give the same outputs on both executors, to 1e-6 of the output's scale
    (elementwise ratios near GELU's zeros measure only the rounding of 1 + tanh ~ 0)."""
    rng = np.random.default_rng(seed)
    feed = {str(v.name): (rng.standard_normal(v.type.shape) * 3).astype(np.float32) for v in before.inputs}
    for backend in ("numpy", "torch"):
        want = [np.asarray(o, np.float64) for o in partita.run(before, feed, backend=backend)]
        got = [np.asarray(o, np.float64) for o in partita.run(after, feed, backend=backend)]
        for w, o in zip(want, got):
            assert o.shape == w.shape
            np.testing.assert_allclose(o, w, rtol=1e-6, atol=1e-6 * float(np.abs(w).max()),
                                       err_msg=f"{backend} executor")


# --- each idiom, each spelling --------------------------------------------------------------

@pytest.mark.parametrize("swap", [False, True], ids=["as-written", "operands-swapped"])
@pytest.mark.parametrize("assoc", ["a", "b", "c"])
@pytest.mark.parametrize("cube", ["pow", "mul-left", "mul-right"])
def test_gelu_tanh_spellings_become_one_gelu(cube: str, assoc: str, swap: bool) -> None:
    g = graph_of(lambda b, x: gelu_tanh_chain(b, x, cube=cube, assoc=assoc, swap=swap))
    out = fused(g)
    assert ops(out) == ["gelu"]
    (node,) = out.nodes
    assert node.attrs["approximate"] == "tanh"
    assert out.outputs[0].type == g.outputs[0].type
    assert_same_values(g, out)


@pytest.mark.parametrize("swap", [False, True], ids=["as-written", "operands-swapped"])
@pytest.mark.parametrize("assoc", ["a", "b", "c"])
@pytest.mark.parametrize("scale", ["mul", "div"])
def test_gelu_erf_spellings_become_one_gelu(scale: str, assoc: str, swap: bool) -> None:
    g = graph_of(lambda b, x: gelu_erf_chain(b, x, scale=scale, assoc=assoc, swap=swap))
    out = fused(g)
    assert ops(out) == ["gelu"]
    (node,) = out.nodes
    assert node.attrs["approximate"] == "none"
    assert_same_values(g, out)


@pytest.mark.parametrize("order", ["x*sigmoid(x)", "sigmoid(x)*x"])
def test_silu_becomes_one_silu(order: str) -> None:
    def build(b: Builder, x: Value) -> Value:
        s = b.sigmoid(x)
        return b.mul(x, s) if order == "x*sigmoid(x)" else b.mul(s, x)
    g = graph_of(build)
    out = fused(g)
    assert ops(out) == ["silu"]
    assert_same_values(g, out)


HF_GELU_NEW = """graph @mlp(%x: f32[2,3,8]) -> (f32[2,3,8]) {
  %139 = full() {shape=[], value=0.5} : f32[]
  %140 = mul(%x, %139) : f32[2,3,8]
  %141 = full() {shape=[], value=3.0} : f32[]
  %142 = pow(%x, %141) : f32[2,3,8]
  %143 = full() {shape=[], value=0.044715} : f32[]
  %144 = mul(%142, %143) : f32[2,3,8]
  %145 = add(%x, %144) : f32[2,3,8]
  %146 = full() {shape=[], value=0.7978845608028654} : f32[]
  %147 = mul(%145, %146) : f32[2,3,8]
  %148 = tanh(%147) : f32[2,3,8]
  %149 = full() {shape=[], value=1.0} : f32[]
  %150 = add(%148, %149) : f32[2,3,8]
  %151 = mul(%140, %150) : f32[2,3,8]
  return %151
}
"""


def test_text_form_of_the_imported_gelu_new_and_the_trace() -> None:
    """The exact chain the torch importer produces for HF's ``gelu_new``; ``trace=true``
    names the rule that fired and the node's location."""
    import io

    g = parse(HF_GELU_NEW, "gpt2.pir")
    pm = PassManager.parse("fuse-activations{trace=true},dce")
    pm.out = io.StringIO()
    out = pm.run(g.clone())
    assert print_graph(out) == (
        "graph @mlp(%x: f32[2,3,8]) -> (f32[2,3,8]) {\n"
        "  %0 = gelu(%x) {approximate=\"tanh\"} : f32[2,3,8]\n"
        "  return %0\n"
        "}\n")
    trace = pm.out.getvalue()
    assert "// fuse-activations: gelu-tanh[" in trace and "rewrote mul at gpt2.pir:14" in trace
    assert_same_values(g, out)


def test_dense_splat_constants_as_onnx_writes_them() -> None:
    """ONNX exports hold the constants as dense splats (``constant``), possibly of x's full
    shape: those match too, as long as the shape does not grow."""
    src = HF_GELU_NEW.replace("full() {shape=[], value=0.5} : f32[]",
                              "constant() {value=dense<f32[], 0.5>} : f32[]")
    src = src.replace("full() {shape=[], value=1.0} : f32[]", "full() {shape=[2,3,8], value=1.0} : f32[2,3,8]")
    g = parse(src, "onnx.pir")
    out = fused(g)
    assert ops(out) == ["gelu"]
    assert_same_values(g, out)


def test_shared_intermediates_stay_for_their_other_users() -> None:
    """A chain whose tanh is also an output still fuses; the tanh stays for that user."""
    g = graph_of(gelu_tanh_chain)
    (tanh,) = [n for n in g.nodes if n.op == "tanh"]
    g.set_outputs([g.outputs[0], tanh.results[0]])
    out = fused(g)
    assert ops(out).count("gelu") == 1 and ops(out).count("tanh") == 1
    assert out.outputs[0].producer is not None and out.outputs[0].producer.op == "gelu"
    assert_same_values(g, out)


def test_several_activations_in_one_graph() -> None:
    def build(b: Builder, x: Value) -> Value:
        h = gelu_tanh_chain(b, x, cube="mul-left", assoc="c")
        h = gelu_erf_chain(b, b.add(h, x), scale="div", assoc="b")
        return b.mul(h, b.sigmoid(h))
    g = graph_of(build)
    out = fused(g)
    assert ops(out) == ["gelu", "add", "gelu", "silu"]
    assert_same_values(g, out)


def test_f64_and_bf16_constants_rounded_to_their_dtype() -> None:
    """Constants match up to the rounding of their own dtype: bf16 holds 0.044715 as
    0.044677734375, which must still be recognised in a bf16 model."""
    for dt in (f64, bf16):
        g = graph_of(lambda b, x: gelu_tanh_chain(b, x, dtype=dt), dtype=dt)
        assert ops(fused(g)) == ["gelu"], dt


# --- what must not fuse --------------------------------------------------------------------

NEGATIVE: dict[str, Callable[[Builder, Value], Value]] = {
    "half-is-0.4": lambda b, x: gelu_tanh_chain(b, x, half=0.4),
    "coef-is-0.05": lambda b, x: gelu_tanh_chain(b, x, coef=0.05),
    "scale-is-0.8": lambda b, x: gelu_tanh_chain(b, x, scale=0.8),
    "erf-scale-is-0.7": lambda b, x: gelu_erf_chain(b, x, factor=0.7),
    "erf-div-by-1.4": lambda b, x: gelu_erf_chain(b, x, scale="div", factor=1.4),
}


@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_wrong_constants_do_not_fuse(name: str) -> None:
    g = graph_of(NEGATIVE[name])
    out = fused(g)
    assert "gelu" not in ops(out)
    assert print_graph(out) == print_graph(g), "nothing else changes either"


def test_a_chain_over_two_different_values_does_not_fuse() -> None:
    """0.5 * x * (1 + tanh(... y ...)) is not gelu of anything; nor is x * sigmoid(y)."""
    g = Graph("two")
    b = Builder(g)
    x = b.input("x", TensorType(SHAPE, f32))
    y = b.input("y", TensorType(SHAPE, f32))
    b.ret(gelu_tanh_chain(b, x, inner_x=y), gelu_erf_chain(b, x, scale="mul"), b.mul(x, b.sigmoid(y)))
    # The erf chain over x alone is the control: it fuses, the other two do not.
    out = fused(g)
    assert ops(out).count("gelu") == 1 and "silu" not in ops(out) and "tanh" in ops(out)
    assert_same_values(g, out)


def test_constants_that_broadcast_x_to_a_larger_shape_do_not_fuse() -> None:
    g = graph_of(lambda b, x: gelu_tanh_chain(b, x, half_shape=(2,) + SHAPE))
    assert g.outputs[0].type.shape == (2,) + SHAPE
    out = fused(g)
    assert print_graph(out) == print_graph(g)


def test_integer_inputs_do_not_fuse() -> None:
    """gelu/silu of an integer tensor would have the chain's f32 type, but the pass only
    rewrites float activations."""
    g = graph_of(lambda b, x: gelu_tanh_chain(b, x), dtype=i64)
    assert g.outputs[0].type.dtype == f32
    assert "gelu" not in ops(fused(g))
    g = graph_of(lambda b, x: b.mul(x, b.sigmoid(x)), dtype=i64)
    assert "silu" not in ops(fused(g))


def test_a_promoting_constant_does_not_fuse() -> None:
    """f32 x with f64 constants computes in f64: gelu(x) would be f32, so the chain stays."""
    def build(b: Builder, x: Value) -> Value:
        return gelu_erf_chain(b, b.cast(x, dtype=f32), dtype=f64)
    g = graph_of(build)
    assert g.outputs[0].type.dtype == f64
    assert "gelu" not in ops(fused(g))


# --- the pass manager and the command line -------------------------------------------------

def test_registered_and_parsed_by_the_pass_manager() -> None:
    assert PASSES["fuse-activations"] is FuseActivations
    pm = PassManager.parse("fuse-activations{trace=false},dce")
    assert [p.text() for p in pm.passes] == ["fuse-activations", "dce"]


def test_cli_opt_runs_the_pass(tmp_path: Path, capsys) -> None:
    from partita.cli import main

    src = tmp_path / "gelu.pir"
    src.write_text(HF_GELU_NEW)
    rc = main(["opt", str(src), "--passes", "fuse-activations,dce"])
    out = capsys.readouterr().out
    assert rc == 0
    assert 'gelu(%x) {approximate="tanh"}' in out and "tanh(" not in out


# --- the real importer and training ----------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_gpt2():
    """A 1-layer HF GPT-2 (width 64, 2 heads, vocab 128, 16 positions), its input ids and
    targets, and its imported forward graph."""
    pytest.importorskip("transformers")
    import torch

    bench = str(Path(__file__).resolve().parents[2] / "bench")
    sys.path.insert(0, bench)
    try:
        from bench_train import gpt2
    finally:
        sys.path.remove(bench)
    torch.manual_seed(0)
    model = gpt2(1, 64, 2, 128, 16).eval()
    ids = torch.randint(0, 128, (2, 16))
    target = torch.randint(0, 128, (2, 16))
    fwd = partita.import_torch(model, (ids,))
    return model, ids, target, fwd


def _input_name(g: Graph) -> str:
    (name,) = [str(v.name) for v in g.inputs if v.role == "input"]
    return name


def _rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def test_imported_gpt2_gets_one_tanh_gelu(tiny_gpt2) -> None:
    model, ids, _, fwd = tiny_gpt2
    assert "tanh" in ops(fwd), "the importer spells gelu_new out (else this test tests nothing)"
    out = fused(fwd)
    assert "tanh" not in ops(out)
    gelus = [n for n in out.nodes if n.op == "gelu"]
    assert len(gelus) == 1 and gelus[0].attrs["approximate"] == "tanh"
    feed = {_input_name(fwd): ids.numpy()}
    for backend in ("numpy", "torch"):
        (want,) = partita.run(fwd, feed, backend=backend)
        (got,) = partita.run(out, feed, backend=backend)
        assert _rel(got, want) <= 1e-5, backend


def test_gpt2_training_step_uses_gelu_grad_and_matches_eager_sgd(tiny_gpt2) -> None:
    """The step differentiates the fused gelu (one gelu_grad, no tanh_grad), and one SGD
    step gives torch eager's loss and parameters: eager runs HF's spelled-out formula and
    its autograd, so this checks the fused forward and backward against the unfused math."""
    import copy

    import torch
    import torch.nn.functional as F

    from partita.autodiff import Trainer

    model, ids, target, fwd = tiny_gpt2
    before = print_graph(fwd)
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.1)
    assert print_graph(fwd) == before, "training_step leaves its input alone"
    names = ops(step)
    assert names.count("gelu_grad") == 1 and "tanh_grad" not in names and "tanh" not in names
    trainer = Trainer(step)
    loss = trainer.step({_input_name(fwd): ids.numpy(), "target": target.numpy()})

    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    logits = model(ids)
    want_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    initial = {n: p.detach().clone().numpy() for n, p in model.named_parameters()}
    want_loss.backward()
    opt.step()
    assert abs(loss - want_loss.item()) <= 1e-5 * abs(want_loss.item())
    got = trainer.weights()
    for n, p in model.named_parameters():
        want = p.detach().numpy()
        assert _rel(got[n], want) <= 1e-5, f"parameter {n}"
        # The update itself, which the parameter comparison would hide behind the weights.
        assert _rel(got[n] - initial[n], want - initial[n]) <= 1e-5, f"update of {n}"
