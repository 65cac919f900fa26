"""Generated layer norm and RMS norm with the residual add before them (partita/codegen/norm.py):
the kernel against torch on sizes that are and are not multiples of the vector width, the
rewrite with the reference before and after, what it leaves alone, the op's own steps, and a
pre-LN transformer block and a transformers GPT-2 compiled end to end against eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partita.codegen import CompiledProgram
from partita.codegen.lowering import vector_width
from partita.codegen.norm import PreparedNorm, norm_ir
from partita.ir import Builder, TensorType, verify
from partita.ir.diagnostics import TypeRuleError
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731

# rows of C: below one vector, not a multiple of it, a multiple of 4 vectors, 3 vectors
_SHAPES = [(3, 5), (7, 17), (2, 3, 40), (148, 256), (1, 1), (4, 3 * 16), (5, 2 * 8 + 3)]


def _torch_norm(kind, s, w, b, eps):
    if kind == "layer":
        return torch.nn.functional.layer_norm(s, s.shape[-1:], w, b, eps)
    return torch.nn.functional.rms_norm(s, s.shape[-1:], w, eps)


@pytest.mark.parametrize("shape", _SHAPES)
@pytest.mark.parametrize("kind,residual,affine", [("layer", True, 2), ("layer", False, 2), ("layer", True, 0),
                                                  ("layer", False, 1), ("rms", True, 1), ("rms", False, 0)])
def test_the_kernel_equals_torch(shape, kind, residual, affine):
    g = torch.Generator().manual_seed(hash((shape, kind, residual, affine)) % 1000)
    x = torch.randn(shape, generator=g) * 3 + 1.5   # a mean far from 0: the two-pass variance matters
    r = torch.randn(shape, generator=g)
    w = torch.randn(shape[-1:], generator=g)
    b = torch.randn(shape[-1:], generator=g)
    pn = PreparedNorm(kind, shape, 1, 1e-5, residual, affine > 0, affine > 1)
    out = pn(x, r if residual else None, w if affine > 0 else None, b if affine > 1 else None)
    s = x + r if residual else x
    want = _torch_norm(kind, s, w if affine > 0 else None, b if affine > 1 else None, 1e-5)
    y = out[0] if residual else out
    torch.testing.assert_close(y, want, rtol=1e-5, atol=2e-5)
    if residual:
        assert torch.equal(out[1], s)


def test_the_kernel_reads_strided_inputs_and_is_vectorized():
    x = torch.randn(8, 64).t()            # not contiguous: copied first
    pn = PreparedNorm("layer", (64, 8), 1, 1e-5, False, False, False)
    torch.testing.assert_close(pn(x), _torch_norm("layer", x, None, None, 1e-5), rtol=1e-5, atol=2e-5)
    ir = norm_ir("k", "layer", 64, 1e-5, True, True, True)
    assert f"<{vector_width()} x float>" in ir and "llvm.vector.reduce.fadd" in ir


def _block(kind="layer", broadcast=False, user_between=False, w_late=False):
    """h2 = h + a; y = norm(h2) (* w + b); out = y * 2 + h2: a pre-LN residual step."""
    b = Builder()
    h = b.input("h", T(4, 6, 24))
    a = b.input("a", T(1, 6, 24) if broadcast else T(4, 6, 24))
    w = b.input("w", T(24))
    bias = b.input("bias", T(24))
    h2 = b.add(h, a)
    between = b.tanh(h2) if user_between else None
    if w_late:
        w = b.mul(w, b.full(value=1.0, shape=[24], dtype="f32"))
    if kind == "layer":
        y = b.layer_norm(h2, w, bias, eps=1e-6)
    else:
        y = b.rms_norm(h2, w, eps=1e-6)
    out = b.add(b.mul(y, b.full(value=2.0, shape=[4, 6, 24], dtype="f32")), h2)
    return verify(b.ret(out, *([between] if between is not None else [])))


def _fuse(g):
    inputs = random_inputs(g, 4)
    before = run_reference(g, inputs)
    out = verify(PassManager.parse("fuse-library,dce").run(g))
    after = run_reference(out, inputs)
    for x, y in zip(before, after):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
    return out, inputs, before


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_add_then_norm_becomes_add_norm_with_the_same_reference_and_runs_the_kernel(kind):
    out, inputs, before = _fuse(_block(kind))
    ops = [n.op for n in out.nodes]
    assert ops.count("add_norm") == 1 and "layer_norm" not in ops and "rms_norm" not in ops
    an = next(n for n in out.nodes if n.op == "add_norm")
    assert an.attrs["kind"] == kind and an.attrs["eps"] == 1e-6
    assert an.results[1].users                      # the sum still feeds the next residual add
    feed = {k: torch.from_numpy(v) for k, v in inputs.items()}
    got = CompiledProgram(out)(feed)
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-5)
    from partita.backend.torch_exec import TorchProgram

    aten = TorchProgram(out)(feed)                  # the op's own step: add, then the norm on ATen
    np.testing.assert_allclose(aten[0].numpy(), before[0], rtol=1e-5, atol=1e-5)


def test_a_user_between_the_add_and_the_norm_keeps_its_order():
    out, inputs, before = _fuse(_block(user_between=True))
    assert [n.op for n in out.nodes].count("add_norm") == 1
    got = CompiledProgram(out)({k: torch.from_numpy(v) for k, v in inputs.items()})
    for x, y in zip(got, before):
        np.testing.assert_allclose(x.numpy(), y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [{"broadcast": True}, {"w_late": True}])
def test_what_does_not_fit_stays_an_add_and_a_norm(kw):
    out, _, _ = _fuse(_block(**kw))
    ops = [n.op for n in out.nodes]
    assert "add_norm" not in ops and "layer_norm" in ops


def test_a_plain_layer_norm_runs_the_generated_kernel():
    b = Builder()
    x = b.input("x", T(5, 40))
    w, bias = b.input("w", T(40)), b.input("b", T(40))
    g = verify(b.ret(b.layer_norm(x, w, bias)))
    prog = CompiledProgram(g)
    step = next(st for st in prog.program.steps if st[7].op == "layer_norm")
    assert getattr(step[0], "__qualname__", "").startswith("norm_kernel")
    inputs = random_inputs(g, 1)
    got = prog({k: torch.from_numpy(v) for k, v in inputs.items()})[0]
    np.testing.assert_allclose(got.numpy(), run_reference(g, inputs)[0], rtol=1e-5, atol=1e-5)


def test_bad_operands_get_clear_errors():
    b = Builder()
    x, r = b.input("x", T(4, 8)), b.input("r", T(1, 8))
    with pytest.raises(TypeRuleError, match="residual .* must have x's type"):
        b.add_norm(x, r)
    b = Builder()
    x, r = b.input("x", T(4, 8)), b.input("r", T(4, 8))
    w, bias = b.input("w", T(8)), b.input("b", T(8))
    with pytest.raises(TypeRuleError, match="rms.* no bias"):
        b.add_norm(x, r, w, bias, kind="rms")


def test_a_gpt2_compiles_with_add_norm_and_equals_eager():
    transformers = pytest.importorskip("transformers")
    from lm_helpers import compiled_lm

    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100, n_positions=32)
    torch.manual_seed(0)
    prog, ids, want = compiled_lm(transformers.GPT2LMHeadModel(cfg))
    # every norm but the first (its input is the embeddings' sum with a broadcast position table)
    assert sum(n.op == "add_norm" for n in prog.graph.nodes) >= 3
    got = prog([ids])[0]
    assert float((got - want).abs().max()) <= 1e-4


def test_emit_kernels_prints_the_norm_kernels():
    from partita.codegen import emit_kernels

    out, _, _ = _fuse(_block("layer"))
    text = emit_kernels(out)
    assert "; ---- norm kernel pt_layer_norm_c24_add_w_b" in text and "define void @pt_layer_norm_c24_add_w_b" in text
    assert "llvm.sqrt.f32" in emit_kernels(out, optimized=True)


def _rms_block(weight="right", axis=-1, keepdim=True, exponent=2.0):
    """h2 = h + a; y = w * (h2 * rsqrt(mean(h2^2) + eps)), as transformers' LlamaRMSNorm."""
    b = Builder()
    h, a = b.input("h", T(4, 6, 24)), b.input("a", T(4, 6, 24))
    w = b.input("w", T(24))
    h2 = b.add(h, a)
    sq = b.pow(h2, b.full(value=exponent, shape=[], dtype="f32"))
    ms = b.mean(sq, axes=[axis], keepdim=keepdim)
    r = b.rsqrt(b.add(ms, b.full(value=1e-6, shape=[], dtype="f32")))
    n = b.mul(r, h2) if weight == "left" else b.mul(h2, r)
    if weight == "right":
        n = b.mul(w, n)
    elif weight == "left":
        n = b.mul(n, w)
    return verify(b.ret(b.add(n, h2)))


@pytest.mark.parametrize("weight", ["right", "left", None])
def test_rms_norm_as_llama_writes_it_becomes_add_norm(weight):
    out, inputs, before = _fuse(_rms_block(weight))
    ops = [n.op for n in out.nodes]
    assert ops.count("add_norm") == 1 and "rsqrt" not in ops and "mean" not in ops, ops
    an = next(n for n in out.nodes if n.op == "add_norm")
    assert an.attrs["kind"] == "rms" and an.attrs["eps"] == pytest.approx(1e-6)
    assert len(an.operands) == (3 if weight else 2)
    feed = {k: torch.from_numpy(v) for k, v in inputs.items()}
    np.testing.assert_allclose(CompiledProgram(out)(feed)[0].numpy(), before[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [{"axis": 1}, {"keepdim": False, "axis": -1, "weight": None}, {"exponent": 3.0}])
def test_what_is_not_an_rms_norm_is_left_alone(kw):
    try:
        g = _rms_block(**kw)
    except TypeRuleError:   # keepdim=False does not broadcast back: not a graph to rewrite
        return
    out, _, _ = _fuse(g)
    assert "add_norm" not in [n.op for n in out.nodes] and "rms_norm" not in [n.op for n in out.nodes]


def test_norm_results_are_in_the_memory_plan_and_stay_right_call_after_call():
    out, inputs, before = _fuse(_block("layer"))
    prog = CompiledProgram(out)
    an = next(n for n in prog.graph.nodes if n.op == "add_norm")
    planned = {b.value for b in prog.memory_plan.planned()}
    assert an.results[0] in planned or an.results[1] in planned
    feed = {k: torch.from_numpy(v) for k, v in inputs.items()}
    for _ in range(3):
        np.testing.assert_allclose(prog(feed)[0].numpy(), before[0], rtol=1e-5, atol=1e-5)
    unplanned = CompiledProgram(out, plan_memory=False)(feed)[0]
    np.testing.assert_allclose(unplanned.numpy(), before[0], rtol=1e-5, atol=1e-5)


def test_a_llama_compiles_with_rms_add_norm_and_equals_eager():
    transformers = pytest.importorskip("transformers")
    from lm_helpers import compiled_lm

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=4, vocab_size=100, max_position_embeddings=32)
    torch.manual_seed(0)
    prog, ids, want = compiled_lm(transformers.LlamaForCausalLM(cfg))
    ops = [n.op for n in prog.graph.nodes]
    # every norm but the first takes its residual add; the first is a plain rms_norm
    assert ops.count("add_norm") == 4 and ops.count("rms_norm") == 1, ops
    got = prog([ids])[0]
    assert float((got - want).abs().max()) <= 1e-4


def test_empty_and_non_f32_norms_fall_back_to_aten_with_the_same_results():
    from partita.codegen.norm import norm_kernel

    for shape, dt in [((0, 24), "f32"), ((3, 24), "f64")]:
        ty = TensorType(shape, DTYPES[dt])
        b = Builder()
        h, a = b.input("h", ty), b.input("a", ty)
        w, bias = b.input("w", TensorType((24,), DTYPES[dt])), b.input("b", TensorType((24,), DTYPES[dt]))
        y = b.layer_norm(b.add(h, a), w, bias)
        g = verify(b.ret(y))
        out, inputs, before = _fuse(g)
        an = next(n for n in out.nodes if n.op == "add_norm")
        assert norm_kernel(an) is None                 # not the generated kernel: ATen's step
        got = CompiledProgram(out)({k: torch.from_numpy(v) for k, v in inputs.items()})[0]
        assert tuple(got.shape) == shape
        np.testing.assert_allclose(got.numpy(), before[0], rtol=1e-5, atol=1e-5)


def _transposed_block(sum_read_elsewhere=False, perm_back=(0, 2, 3, 1)):
    """ConvNeXt's stage end: the residual add in NCHW of two channels-last values, then a layer
    norm over the channels of the sum moved back to channels-last."""
    b = Builder()
    x = b.input("x", T(2, 5, 3, 24))          # channels-last, 24 channels
    r = b.input("r", T(2, 5, 3, 24))
    w, bias = b.input("w", T(24)), b.input("bias", T(24))
    xn = b.transpose(b.tanh(x), perm=(0, 3, 1, 2))
    s = b.add(xn, b.transpose(r, perm=(0, 3, 1, 2)))
    y = b.layer_norm(b.transpose(s, perm=perm_back), w, bias, eps=1e-6)
    return verify(b.ret(y, xn, *([s] if sum_read_elsewhere else [])))


def test_a_residual_add_between_transposes_becomes_add_norm_without_them():
    out, inputs, before = _fuse(_transposed_block())
    ops = [n.op for n in out.nodes]
    assert ops.count("add_norm") == 1 and "layer_norm" not in ops and ops.count("transpose") == 1
    got = CompiledProgram(out)({k: torch.from_numpy(v) for k, v in inputs.items()})
    for x, y in zip(got, before):
        np.testing.assert_allclose(x.numpy(), y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [{"sum_read_elsewhere": True}, {"perm_back": (0, 3, 2, 1)}])
def test_a_transposed_sum_read_elsewhere_or_not_moved_back_stays(kw):
    if kw.get("perm_back") == (0, 3, 2, 1):   # not the inverse: H and W swapped
        b = Builder()
        x, r = b.input("x", T(2, 4, 4, 24)), b.input("r", T(2, 4, 4, 24))
        w, bias = b.input("w", T(24)), b.input("bias", T(24))
        s = b.add(b.transpose(x, perm=(0, 3, 1, 2)), b.transpose(r, perm=(0, 3, 1, 2)))
        g = verify(b.ret(b.layer_norm(b.transpose(s, perm=(0, 3, 2, 1)), w, bias, eps=1e-6)))
    else:
        g = _transposed_block(**kw)
    out, _, _ = _fuse(g)
    ops = [n.op for n in out.nodes]
    assert "add_norm" not in ops and "layer_norm" in ops
