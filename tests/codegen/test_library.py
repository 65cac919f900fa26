"""Library kernels with fused epilogues (partita/codegen/library.py) and fold-batch-norm
(partita/codegen/inference.py): the ops against eager torch and the reference, every kernel of
the rule table, the packed weights' key, the passes' rewrites and what they leave alone, and a
ResNet-style model imported from torch end to end."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.backend import numpy_ref
from partita.backend.torch_exec import TorchProgram
from partita.codegen import CompiledProgram, library
from partita.codegen.library import KERNELS, UNARY, PackedWeight, packed_weight_stats
from partita.ir import Builder, TensorType, parse, print_graph, verify
from partita.ir.diagnostics import AttributeError_, ParseError, TypeRuleError
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import assert_same_outputs, random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731

_EAGER_UNARY = {"none": lambda y: y, "relu": torch.relu, "gelu": F.gelu,
                "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"), "silu": F.silu,
                "sigmoid": torch.sigmoid, "tanh": torch.tanh}


def _rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


def _close(got, want, rtol=1e-4):
    got, want = torch.as_tensor(np.asarray(got)) if not isinstance(got, torch.Tensor) else got, want
    err = float((got.float() - want).abs().max())
    assert err <= rtol * max(float(want.abs().max()), 1.0), f"max |error| {err}"


def test_unary_kinds_match_eager():
    assert set(_EAGER_UNARY) == set(UNARY)


# --- conv2d_pointwise ---------------------------------------------------------------------------

_CONV_KEYS = sorted(k[1] for k in KERNELS if k[0] == "conv2d_pointwise")


def _conv_graph(binary, unary, bias=True, stride=(1, 1), padding=(1, 1), groups=1, cin=4, cout=6):
    b = Builder()
    x = b.input("x", T(2, cin, 7, 7))
    w = b.param("w", T(cout, cin // groups, 3, 3))
    ops = [x, w]
    if bias:
        ops.append(b.param("b", T(cout)))
    h = (7 + 2 * padding[0] - 3) // stride[0] + 1
    if binary != "none":
        ops.append(b.input("s", T(2, cout, h, h)))
    y = b.conv2d_pointwise(*ops, stride=stride, padding=padding, groups=groups, binary=binary, unary=unary)
    return verify(b.ret(y))


def _conv_eager(args, binary, unary, bias, stride, padding, groups):
    x, w = args[0], args[1]
    bb = args[2] if bias else None
    y = F.conv2d(x, w, bb, stride, padding, 1, groups)
    if binary == "add":
        y = y + args[-1]
    return _EAGER_UNARY[unary](y)


@pytest.mark.parametrize("epilogue", _CONV_KEYS, ids=lambda e: "+".join(e))
def test_every_conv_kernel_matches_eager_and_the_reference(epilogue):
    binary, unary = epilogue
    for bias, stride, padding, groups in ((True, (1, 1), (1, 1), 1), (False, (2, 2), (0, 0), 2)):
        g = _conv_graph(binary, unary, bias, stride, padding, groups)
        text = print_graph(g)
        assert print_graph(parse(text)) == text
        args = [_rand(*v.type.shape, seed=i) for i, v in enumerate(g.inputs)]
        want = _conv_eager(args, binary, unary, bias, stride, padding, groups)
        prog = TorchProgram(g)
        for _ in range(3):  # unpacked, then packed
            _close(prog([a for a, v in zip(args, g.inputs) if v.role == "input"],
                        {v.name: a for a, v in zip(args, g.inputs) if v.role == "param"})[0], want)
        ref = numpy_ref.run(g, {v.name: a.numpy() for v, a in zip(g.inputs, args)})[0]
        _close(ref, want)
        _close(library.OPS["conv2d_pointwise"].torch(args, g.first.attrs), want)  # the unprepared op


def test_conv_pair_without_a_kernel_runs_on_aten():
    # oneDNN's binary overload takes only relu after the add: gelu after it has no kernel.
    assert ("conv2d_pointwise", ("add", "gelu")) not in KERNELS
    g = _conv_graph("add", "gelu")
    args = [_rand(*v.type.shape, seed=i) for i, v in enumerate(g.inputs)]
    want = _conv_eager(args, "add", "gelu", True, (1, 1), (1, 1), 1)
    _close(TorchProgram(g)({v.name: a for v, a in zip(g.inputs, args)})[0], want)


def test_conv_pointwise_errors():
    b = Builder()
    x, w = b.input("x", T(1, 2, 5, 5)), b.param("w", T(3, 2, 3, 3))
    with pytest.raises(AttributeError_, match="'unary' must be one of 'none', 'relu'.*got 'swish'"):
        b.conv2d_pointwise(x, w, unary="swish")
    with pytest.raises(AttributeError_, match="'binary' must be one of"):
        b.conv2d_pointwise(x, w, b.input("s", T(1, 3, 3, 3)), binary="mul")
    with pytest.raises(TypeRuleError, match="needs the operand 'other'"):
        b.conv2d_pointwise(x, w, binary="add")
    with pytest.raises(TypeRuleError, match="other must have the convolution's type f32\\[1,3,3,3\\]"):
        b.conv2d_pointwise(x, w, b.input("s2", T(1, 3, 1, 1)), binary="add")
    with pytest.raises(TypeRuleError, match="need a binary epilogue"):
        b.conv2d_pointwise(x, w, b.param("b", T(3)), b.input("s3", T(1, 3, 3, 3)))
    with pytest.raises(TypeRuleError, match="channel mismatch"):
        b.conv2d_pointwise(x, b.param("w2", T(3, 4, 3, 3)))
    with pytest.raises(ParseError, match="'unary' must be one of"):
        parse('graph @f(%x: f32[1,2,5,5], %w: f32[3,2,3,3]) -> (f32[1,3,3,3]) {\n'
              '  %0 = conv2d_pointwise(%x, %w) {unary="leaky"} : f32[1,3,3,3]\n  return %0\n}\n')


# --- linear_pointwise ---------------------------------------------------------------------------

@pytest.mark.parametrize("unary", sorted(UNARY))
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_every_linear_kernel_matches_eager_and_the_reference(unary, layout):
    assert ("linear_pointwise", ("none", unary)) in KERNELS
    # [128,256]x[256,512] is above the kernels' min_flops (oneDNN runs); [3,5,8]x[8,6] below (ATen).
    big = (128,), 256, 512
    assert 2 * 128 * 256 * 512 >= max(k.threshold() for k in KERNELS.values())
    for (lead, k, n), bias in itertools.product((big, ((3, 5), 8, 6)), (True, False)):
        b = Builder()
        x = b.input("x", T(*lead, k))
        w = b.param("w", T(k, n) if layout == "kn" else T(n, k))
        ops = [x, w] + ([b.param("b", T(n))] if bias else [])
        g = verify(b.ret(b.linear_pointwise(*ops, unary=unary, weight_layout=layout)))
        args = [_rand(*v.type.shape, seed=i, scale=0.2) for i, v in enumerate(g.inputs)]
        wt = args[1] if layout == "kn" else args[1].t()
        want = _EAGER_UNARY[unary](torch.matmul(args[0], wt) + (args[2] if bias else 0))
        prog = TorchProgram(g)
        named = {v.name: a for v, a in zip(g.inputs, args)}
        for _ in range(3):
            _close(prog(named)[0], want)
        _close(numpy_ref.run(g, {k2: a.numpy() for k2, a in named.items()})[0], want)
        _close(library.OPS["linear_pointwise"].torch(args, g.first.attrs), want)


def test_linear_pointwise_errors():
    b = Builder()
    x = b.input("x", T(4, 8))
    with pytest.raises(TypeRuleError, match="has K=8 but the weight f32\\[6,8\\].*laid out \\[K, N\\]"):
        b.linear_pointwise(x, b.param("w", T(6, 8)))
    with pytest.raises(TypeRuleError, match="the bias must have shape \\[6\\]"):
        b.linear_pointwise(x, b.param("w2", T(6, 8)), b.param("b", T(8)), weight_layout="nk")
    with pytest.raises(TypeRuleError, match="must be 2-d"):
        b.linear_pointwise(x, b.param("w3", T(2, 8, 6)))
    with pytest.raises(TypeRuleError, match="must have the input's dtype"):
        b.linear_pointwise(x, b.param("w4", TensorType((8, 6), DTYPES["f64"])))
    with pytest.raises(AttributeError_, match="'weight_layout' must be one of 'kn', 'nk'"):
        b.linear_pointwise(x, b.param("w5", T(8, 6)), weight_layout="t")


# --- packed weights ------------------------------------------------------------------------------

def _packed_programs():
    b = Builder()
    x = b.input("x", T(16, 4, 6, 6))
    y = b.conv2d_pointwise(x, b.param("w", T(8, 4, 3, 3)), padding=(1, 1), unary="relu")
    h = b.reshape(y, shape=(16, 8 * 36))
    z = b.linear_pointwise(h, b.param("v", T(8 * 36, 1024)), unary="tanh")   # [K, N]: packed copy
    return verify(b.ret(z))


def _packed_eager(x, w, v):
    return torch.tanh(torch.relu(F.conv2d(x, w, None, 1, 1)).reshape(16, -1) @ v)


def test_packed_weights_follow_new_tensors_and_in_place_updates():
    g = _packed_programs()
    prog = TorchProgram(g)
    x = _rand(16, 4, 6, 6)
    w, v = _rand(8, 4, 3, 3, seed=1, scale=0.3), _rand(8 * 36, 1024, seed=2, scale=0.05)
    start = packed_weight_stats()["packed"]
    for _ in range(3):
        _close(prog([x], {"w": w, "v": v})[0], _packed_eager(x, w, v))
    assert packed_weight_stats()["packed"] - start == 2          # both packed once, on the second call
    with torch.no_grad():
        w.mul_(-1.5)                                              # in place: _version moves
        v[:10].zero_()
    for _ in range(3):
        _close(prog([x], {"w": w, "v": v})[0], _packed_eager(x, w, v))
    assert packed_weight_stats()["packed"] - start == 4
    w2, v2 = _rand(8, 4, 3, 3, seed=3), _rand(8 * 36, 1024, seed=4, scale=0.05)  # new tensors
    _close(prog([x], {"w": w2, "v": v2})[0], _packed_eager(x, w2, v2))
    _close(prog([x], {"w": w, "v": v})[0], _packed_eager(x, w, v))  # and back
    # NumPy weights are new tensors at every call: never packed, always right.
    wn, vn = w.numpy().copy(), v.numpy().copy()
    before = packed_weight_stats()["packed"]
    for _ in range(3):
        _close(prog([x], {"w": wn, "v": vn})[0], _packed_eager(x, w, v))
    assert packed_weight_stats()["packed"] == before
    # Inference tensors have no version counter: never packed.
    with torch.inference_mode():
        wi, vi = w.clone(), v.clone()
    for _ in range(3):
        _close(prog([x], {"w": wi, "v": vi})[0], _packed_eager(x, w, v))
    assert packed_weight_stats()["packed"] == before


def test_a_packed_weight_is_dropped_with_its_tensor():
    pw = PackedWeight(lambda t: t * 2)
    t = torch.ones(3)
    assert pw.get(t) is None
    assert torch.equal(pw.get(t), torch.full((3,), 2.0))
    del t
    t2 = torch.zeros(3)          # may reuse the address of the first: the weak reference is dead
    assert pw.get(t2) is None


def test_prepack_off_never_packs():
    old = library.PREPACK
    library.PREPACK = False
    try:
        prog = TorchProgram(_packed_programs())
    finally:
        library.PREPACK = old
    x, w, v = _rand(16, 4, 6, 6), _rand(8, 4, 3, 3, seed=1), _rand(8 * 36, 1024, seed=2, scale=0.05)
    start = packed_weight_stats()["packed"]
    for _ in range(3):
        _close(prog([x], {"w": w, "v": v})[0], _packed_eager(x, w, v))
    assert packed_weight_stats()["packed"] == start


# --- the fuse-library pass -----------------------------------------------------------------------

def _fuse(g, pipeline="fuse-library,dce"):
    inputs = random_inputs(g, 5)
    before = run_reference(g, inputs)
    out = PassManager.parse(pipeline).run(g)
    verify(out)
    after = run_reference(out, inputs)
    return out, before, after


def test_fuse_library_keeps_the_reference_bit_for_bit():
    b = Builder()
    x = b.input("x", T(2, 3, 8, 8))
    s = b.input("s", T(2, 4, 8, 8))
    c = b.conv2d(x, b.param("w", T(4, 3, 3, 3)), padding=(1, 1))
    c = b.add(b.reshape(b.param("b", T(4)), shape=(4, 1, 1)), c)
    y = b.relu(b.add(s, c))
    m = b.reshape(y, shape=(2, 256))
    z = b.silu(b.add(b.matmul(m, b.param("v", T(256, 16))), b.param("c", T(16))))
    out, before, after = _fuse(verify(b.ret(z)))
    assert [n.op for n in out.nodes] == ["conv2d_pointwise", "reshape", "linear_pointwise"]
    conv, _, lin = out.nodes
    assert (conv.attrs["binary"], conv.attrs["unary"], lin.attrs["unary"]) == ("add", "relu", "silu")
    for a, b2 in zip(before, after):
        assert np.array_equal(a, b2)


def test_a_patch_convolution_becomes_a_gemm_and_packs_its_weight_view():
    assert library._generated_gemm()
    b = Builder()
    x = b.input("x", T(2, 3, 64, 64))   # 128 patches of 192 values by 64 outputs: 3 MFLOP
    y = b.conv2d(x, b.param("w", T(64, 3, 8, 8)), b.param("b", T(64)), stride=(8, 8))
    g = verify(b.ret(b.relu(y)))
    out, before, after = _fuse(g)
    assert [n.op for n in out.nodes] == ["reshape", "transpose", "reshape", "reshape", "linear_pointwise",
                                         "reshape", "transpose", "relu"]
    lin = list(out.nodes)[4]
    assert lin.attrs["weight_layout"] == "nk" and lin.results[0].type.shape == (2 * 8 * 8, 64)
    # Sums of 192 products in another order (the GEMM's, which depends on the CPU's BLAS):
    # the error scales with the outputs' magnitude, not with each output.
    for a, b2 in zip(before, after):
        assert np.max(np.abs(a - b2)) <= 1e-5 * max(float(np.max(np.abs(a))), 1.0)
    # run: the weight reaches the GEMM as a reshape made at every call, and is packed once
    xs, w, bias = _rand(2, 3, 64, 64), _rand(64, 3, 8, 8, seed=1, scale=0.1), _rand(64, seed=2)
    prog = TorchProgram(out)
    start = packed_weight_stats()["packed"]
    for _ in range(3):
        _close(prog([xs], {"w": w, "b": bias})[0], F.relu(F.conv2d(xs, w, bias, stride=8)))
    assert packed_weight_stats()["packed"] - start == 1


def test_a_patch_embedding_flattened_as_vit_does_is_a_view_of_the_gemm_result():
    """conv as linear, then the model's flatten(2).transpose(1, 2): the two transposes cancel
    across the reshape, so CompiledProgram's graph reshapes the GEMM's result and copies nothing."""
    from partita.codegen import CompiledProgram

    b = Builder()
    x = b.input("x", T(2, 3, 32, 32))
    y = b.conv2d(x, b.param("w", T(64, 3, 8, 8)), b.param("b", T(64)), stride=(8, 8))
    t = b.transpose(b.reshape(y, shape=(2, 64, 16)), perm=(0, 2, 1))
    g = verify(b.ret(b.tanh(t)))
    prog = CompiledProgram(g)
    ops = [n.op for n in prog.graph.nodes]
    after = ops[ops.index("linear_pointwise") + 1:]
    assert "transpose" not in after and after[0] == "reshape", ops
    xs, w, bias = _rand(2, 3, 32, 32), _rand(64, 3, 8, 8, seed=1, scale=0.1), _rand(64, seed=2)
    want = torch.tanh(F.conv2d(xs, w, bias, stride=8).flatten(2).transpose(1, 2))
    for _ in range(3):
        _close(prog([xs], {"w": w, "b": bias})[0], want)


def test_convolutions_that_are_not_patches_stay_convolutions():
    for shape, kw in [((4, 3, 3, 3), dict(stride=(1, 1), padding=(1, 1))),   # overlapping windows
                      ((4, 3, 2, 2), dict(stride=(2, 2), padding=(1, 1))),   # padded
                      ((4, 3, 1, 1), dict(stride=(1, 1))),                    # 1 x 1: oneDNN's
                      ((4, 3, 3, 3), dict(stride=(3, 3)))]:                   # 8 is no multiple of 3
        b = Builder()
        x = b.input("x", T(2, 3, 8, 8))
        g = verify(b.ret(b.conv2d(x, b.param("w", T(*shape)), **kw)))
        out, _, _ = _fuse(g)
        assert [n.op for n in out.nodes] == ["conv2d_pointwise"], kw


def test_a_packed_weight_seen_through_a_view_is_the_same_weight():
    pw = PackedWeight(lambda t: t * 2)
    w = torch.ones(4, 6)
    assert pw.get(w.reshape(24)) is None
    assert torch.equal(pw.get(w.reshape(24)), torch.full((24,), 2.0))   # a new view, the same weight
    assert pw.get(w.reshape(6, 4)) is None                               # another view: packed anew
    with torch.no_grad():
        w.mul_(3)                                                       # the base changes in place
    assert pw.get(w.reshape(6, 4)) is None


def test_fuse_library_leaves_other_dtypes_and_shapes():
    b = Builder()
    f64 = DTYPES["f64"]
    x = b.input("x", TensorType((1, 2, 5, 5), f64))
    y = b.relu(b.conv2d(x, b.param("w", TensorType((3, 2, 3, 3), f64))))
    a = b.input("a", T(8))                                     # a vector: no linear layer
    z = b.matmul(a, b.param("v", T(8, 4)))
    out, before, after = _fuse(verify(b.ret(y, z)))
    assert [n.op for n in out.nodes] == ["conv2d", "relu", "matmul"]


def test_fuse_library_then_fuse_kernels_runs_compiled():
    b = Builder()
    x = b.input("x", T(8, 64))
    h = b.gelu(b.add(b.matmul(x, b.param("w", T(64, 128))), b.param("b", T(128))))
    y = b.mul(b.tanh(h), h)
    g = verify(b.ret(y))
    out, before, after = _fuse(g.clone(), "fuse-library,fuse-kernels,dce")
    assert [n.op for n in out.nodes] == ["linear_pointwise", "fused"]
    assert_same_outputs(before, after)
    named = {k: torch.from_numpy(v) for k, v in random_inputs(g, 5).items()}
    got = CompiledProgram(out)(named)[0]
    _close(got, torch.from_numpy(before[0]))


# --- fold-batch-norm with params --------------------------------------------------------------------

def _conv_bn(conv_bias=False, shared_weight=False):
    b = Builder()
    x = b.input("x", T(2, 3, 6, 6))
    w = b.param("conv.weight", T(4, 3, 3, 3))
    ops = [x, w] + ([b.param("conv.bias", T(4))] if conv_bias else [])
    c = b.conv2d(*ops, padding=(1, 1))
    names = ("bn.weight", "bn.bias", "bn.running_mean", "bn.running_var")
    stats = [b.param(names[0], T(4)), b.param(names[1], T(4)), b.state(names[2], T(4)), b.state(names[3], T(4))]
    y = b.relu(b.batch_norm(c, *stats, eps=1e-3))
    outs = [y] + ([b.conv2d(x, w)] if shared_weight else [])
    g = verify(b.ret(*outs))
    rng = np.random.default_rng(0)
    for v in g.inputs:
        if v.role != "input":
            a = rng.normal(0, 1, v.type.shape)
            if v.name == "bn.running_var":
                a = rng.uniform(0.2, 2.0, v.type.shape)
            g.weights[v.name] = a.astype(np.float32)
    return g


@pytest.mark.parametrize("conv_bias", [False, True])
def test_fold_batch_norm_with_params(conv_bias):
    g = _conv_bn(conv_bias)
    x = np.random.default_rng(1).normal(0, 1, (2, 3, 6, 6)).astype(np.float32)
    before = numpy_ref.run(g, [x])
    out = PassManager.parse("fold-batch-norm").run(g.clone())
    assert [n.op for n in out.nodes] == ["conv2d", "relu"]
    names = [v.name for v in out.inputs]
    assert names == ["x", "conv.weight.bn_folded", "conv.weight.bn_folded_bias"]
    assert sorted(out.weights) == sorted(names[1:])
    assert all(out.weights[n].dtype == np.float32 for n in names[1:])
    after = numpy_ref.run(out, [x])                     # with the folded graph's own weights
    np.testing.assert_allclose(after[0], before[0], rtol=1e-5, atol=1e-5)
    # and the torch executor on the folded and fused graph
    fused = PassManager.parse("fuse-library").run(out.clone())
    assert [n.op for n in fused.nodes] == ["conv2d_pointwise"]
    np.testing.assert_allclose(CompiledProgram(fused)([torch.from_numpy(x)])[0].numpy(), before[0],
                               rtol=1e-4, atol=1e-4)


def test_fold_batch_norm_keeps_a_weight_read_elsewhere():
    g = _conv_bn(shared_weight=True)
    x = np.random.default_rng(2).normal(0, 1, (2, 3, 6, 6)).astype(np.float32)
    before = numpy_ref.run(g, [x])
    out = PassManager.parse("fold-batch-norm").run(g.clone())
    assert "batch_norm" not in [n.op for n in out.nodes]
    assert [v.name for v in out.inputs] == ["x", "conv.weight", "conv.weight.bn_folded",
                                            "conv.weight.bn_folded_bias"]
    after = numpy_ref.run(out, [x])
    for a, b2 in zip(before, after):
        np.testing.assert_allclose(a, b2, rtol=1e-5, atol=1e-5)


def test_fold_batch_norm_needs_every_value():
    g = _conv_bn()
    del g.weights["bn.running_var"]
    out = PassManager.parse("fold-batch-norm").run(g.clone())
    assert [n.op for n in out.nodes] == ["conv2d", "batch_norm", "relu"]
    g = _conv_bn()
    g.weights["bn.running_var"] = np.ones(5, np.float32)   # not the input's shape
    out = PassManager.parse("fold-batch-norm").run(g.clone())
    assert "batch_norm" in [n.op for n in out.nodes]


def test_fold_batch_norm_names_do_not_collide():
    g = _conv_bn()
    g.add_input("conv.weight.bn_folded", T(1), "param")
    g.weights["conv.weight.bn_folded"] = np.zeros(1, np.float32)
    out = PassManager.parse("fold-batch-norm").run(g)
    assert "conv.weight.bn_folded.1" in [v.name for v in out.inputs]


# --- a ResNet-style model imported from torch ---------------------------------------------------------

class _Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class _ResNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.blocks = nn.Sequential(_Block(8, 8, 1), _Block(8, 16, 2), _Block(16, 16, 1))
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


def test_resnet_style_model_ends_as_library_kernels_and_matches_eager():
    torch.manual_seed(0)
    m = _ResNetish().eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.3, 0.3)
    x = torch.randn(2, 3, 16, 16)
    g = partita.import_torch(m, (x,))
    n_convs = sum(n.op == "conv2d" for n in g.nodes)
    out = partita.optimize(g, "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce")
    ops = [n.op for n in out.nodes]
    assert "batch_norm" not in ops and "conv2d" not in ops and "relu" not in ops and "add" not in ops
    assert ops.count("conv2d_pointwise") == n_convs == 8
    convs = [n for n in out.nodes if n.op == "conv2d_pointwise"]
    assert sum(n.attrs["binary"] == "add" for n in convs) == 3         # one residual per block
    assert all(len(n.operands) >= 3 for n in convs)                     # every one has its folded bias
    assert ops.count("linear_pointwise") == 1
    with torch.inference_mode():
        want = m(x)
    prog = CompiledProgram(out)
    weights = {k: torch.from_numpy(np.array(v)) for k, v in out.weights.items()}
    for _ in range(3):                                                  # unpacked, then packed
        _close(prog([x], weights)[0], want)
    _close(prog([x])[0], want)                                          # graph.weights (NumPy)
    _close(numpy_ref.run(out, [x.numpy()])[0], want)


def test_a_per_channel_constant_after_a_conv_becomes_its_bias():
    b = Builder()
    x = b.input("x", T(1, 2, 5, 5))
    c = b.constant(value=np.arange(3, dtype=np.float32).reshape(1, 3, 1, 1))
    y = b.relu(b.add(b.conv2d(x, b.param("w", T(3, 2, 3, 3))), c))
    out, before, after = _fuse(verify(b.ret(y)))
    assert [n.op for n in out.nodes] == ["constant", "reshape", "conv2d_pointwise"]
    assert len(out.last.operands) == 3 and out.last.attrs["unary"] == "relu"
    assert np.array_equal(before[0], after[0])
