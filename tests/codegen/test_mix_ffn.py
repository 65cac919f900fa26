"""An activation behind layout moves after a convolution moved onto the convolution
(codegen/mix_ffn.py), so fuse-library takes it as the epilogue: PVT-v2's Mix-FFN (tokens ->
depthwise conv -> tokens -> GELU) on odd shapes against the reference interpreter before the
rewrite and torch; the cases the rewrite must leave alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partita.codegen import CompiledProgram
from partita.codegen.mix_ffn import hoist_activations
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731
PIPELINE = "canonicalize,fuse-library,fuse-kernels,cse,dce"


def _mix_ffn(B: int, H: int, W: int, C: int, act: str = "gelu", approximate: str = "none", groups: int = 0,
             k: int = 3):
    """tokens [B, H*W, C] -> [B, C, H, W] -> conv (depthwise unless ``groups``) -> tokens -> act."""
    b = Builder()
    x = b.input("x", T(B, H * W, C))
    g = groups or C
    img = b.reshape(b.transpose(x, perm=(0, 2, 1)), shape=(B, C, H, W))
    y = b.conv2d(img, b.param("w", T(C, C // g, k, k)), b.param("bias", T(C)), padding=(k // 2, k // 2), groups=g)
    t = b.transpose(b.reshape(y, shape=(B, C, H * W)), perm=(0, 2, 1))
    if act == "gelu":
        t = b.gelu(t, approximate=approximate)
    else:
        t = getattr(b, act)(t)
    return verify(b.ret(t))


def _torch_mix_ffn(inputs: dict, B: int, H: int, W: int, C: int, act: str, approximate: str, groups: int):
    x = torch.from_numpy(inputs["x"]).double()
    img = x.transpose(1, 2).reshape(B, C, H, W)
    y = torch.nn.functional.conv2d(img, torch.from_numpy(inputs["w"]).double(), torch.from_numpy(inputs["bias"]).double(),
                                   padding=inputs["w"].shape[-1] // 2, groups=groups or C)
    t = y.flatten(2).transpose(1, 2)
    if act == "gelu":
        return torch.nn.functional.gelu(t, approximate=approximate)
    return getattr(torch, act)(t) if act != "silu" else torch.nn.functional.silu(t)


@pytest.mark.parametrize("B,H,W,C,act,approximate,groups", [
    (4, 8, 8, 32, "gelu", "none", 0),     # PVT-v2's first stage
    (3, 5, 7, 13, "gelu", "none", 0),     # odd sides, channels no multiple of a vector
    (2, 3, 11, 19, "gelu", "tanh", 0),
    (1, 6, 5, 9, "silu", "none", 0),
    (2, 4, 3, 8, "relu", "none", 2),      # a grouped (not depthwise) conv takes it too
])
def test_activation_becomes_the_conv_epilogue(B, H, W, C, act, approximate, groups):
    g = _mix_ffn(B, H, W, C, act, approximate, groups)
    inputs = random_inputs(g, B + H + C)
    inputs = {k: v * 2 for k, v in inputs.items()}
    before = run_reference(g, inputs)
    out = verify(PassManager.parse(PIPELINE).run(g))
    convs = [n for n in out.nodes if n.op == "conv2d_pointwise"]
    assert len(convs) == 1 and convs[0].attrs["unary"] == ("gelu_tanh" if approximate == "tanh" else act)
    assert not {"gelu", "silu", "relu", "fused"} & {n.op for n in out.nodes}, [n.op for n in out.nodes]
    np.testing.assert_allclose(run_reference(out, inputs)[0], before[0], rtol=1e-5, atol=1e-5)
    ref = _torch_mix_ffn(inputs, B, H, W, C, act, approximate, groups).numpy()
    np.testing.assert_allclose(before[0], ref, rtol=1e-4, atol=1e-4)
    got = CompiledProgram(out, freeze=True)({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), ref, rtol=1e-4, atol=1e-4)


def test_left_alone_when_a_move_has_another_reader():
    """The reshaped conv result also read elsewhere: it must not see the activation."""
    b = Builder()
    x = b.input("x", T(2, 4, 3, 3))
    y = b.conv2d(x, b.param("w", T(4, 1, 3, 3)), padding=(1, 1), groups=4)
    r = b.reshape(y, shape=(2, 4, 9))
    t = b.gelu(b.transpose(r, perm=(0, 2, 1)))
    g = verify(b.ret(t, b.mul(r, r)))
    inputs = random_inputs(g, 5)
    before = run_reference(g, inputs)
    assert hoist_activations(g) == 0
    out = verify(PassManager.parse(PIPELINE).run(g))
    for got, want in zip(run_reference(out, inputs), before):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_left_alone_when_not_a_move_between():
    """A non-move (an add) between the conv and the activation stops the walk."""
    b = Builder()
    x = b.input("x", T(2, 4, 3, 3))
    y = b.conv2d(x, b.param("w", T(4, 1, 3, 3)), padding=(1, 1), groups=4)
    t = b.gelu(b.add(b.reshape(y, shape=(2, 4, 9)), b.param("c", T(2, 4, 9))))
    g = verify(b.ret(t))
    assert hoist_activations(g) == 0


def test_the_rewrite_itself_keeps_the_meaning():
    """hoist_activations alone, before fuse-library: reference interpreter before and after."""
    g = _mix_ffn(3, 5, 4, 7)
    inputs = random_inputs(g, 11)
    before = run_reference(g, inputs)
    assert hoist_activations(g) == 1
    verify(g)
    ops = [n.op for n in g.nodes]
    assert ops.index("gelu") == ops.index("conv2d") + 1, ops
    np.testing.assert_allclose(run_reference(g, inputs)[0], before[0], rtol=1e-6, atol=1e-6)
