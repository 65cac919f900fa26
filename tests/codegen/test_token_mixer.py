"""PoolFormer's token mixer as one step (partita/codegen/token_mixer.py): the ``pool_mixer`` op and
its generated kernel against torch on odd shapes, the rewrite's meaning on the reference
interpreter, and models through the import path and the torch.compile backend against eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
import partita.codegen.dynamo as pd
from partita.backend import numpy_ref
from partita.codegen import CompiledProgram
from partita.codegen.token_mixer import fold_residual_scales, fuse_pool_mixers, generated_for, pool_mixer_kernel
from partita.ir import verify
from partita.ir.dtypes import f32
from partita.ir.graph import Graph, Node
from partita.ir.types import TensorType
from partita.ops.registry import OPS
from partita.passes import PassManager

# (shape, groups, kernel, count_include_pad): one group and several, maps of 1 x 1 to 11 x 13,
# C not a multiple of the vector width, square and oblong windows wider than the map
CASES = [((4, 16, 8, 8), 1, (3, 3), False), ((3, 5, 7, 9), 1, (3, 3), False), ((2, 6, 5, 4), 3, (3, 5), True),
         ((1, 4, 1, 1), 1, (3, 3), False), ((2, 8, 11, 13), 2, (5, 3), False), ((2, 7, 2, 3), 7, (3, 3), True),
         ((1, 3, 6, 1), 1, (1, 1), False), ((2, 20, 17, 5), 4, (7, 7), False)]


def _want(x: torch.Tensor, g: int, w: torch.Tensor, b: torch.Tensor, s: torch.Tensor, k: tuple,
          inc: bool) -> torch.Tensor:
    y = F.group_norm(x, g, w, b, 1e-5)
    p = F.avg_pool2d(y, k, 1, (k[0] // 2, k[1] // 2), count_include_pad=inc)
    return x + s.reshape(-1, 1, 1) * (p - y)


@pytest.mark.parametrize("shape,g,k,inc", CASES)
def test_op_reference_and_step_match_torch(shape: tuple, g: int, k: tuple, inc: bool) -> None:
    torch.manual_seed(sum(shape) + g)
    c = shape[1]
    x = torch.randn(shape) * 3 + 1
    w, b, s = torch.randn(c), torch.randn(c), torch.randn(c)
    want = _want(x, g, w, b, s, k, inc)
    attrs = OPS["pool_mixer"].normalize_attrs({"groups": g, "eps": 1e-5, "kernel": k, "count_include_pad": inc})
    args = [x, w, b, s]
    ref = OPS["pool_mixer"].reference([a.numpy() for a in args], attrs)
    np.testing.assert_allclose(ref, want.numpy(), rtol=1e-5, atol=3e-5)
    xt = TensorType(shape, f32)
    gr = Graph("g")
    operands = [gr.add_input("x", xt)] + [gr.add_input(n, TensorType((c,), f32)) for n in "wbs"]
    node = Node("pool_mixer", operands, attrs, [xt])
    assert generated_for(node) is not None
    step = pool_mixer_kernel(node)
    assert step is not None
    for _ in range(2):
        torch.testing.assert_close(step(args, attrs), want, rtol=1e-5, atol=3e-5)
    gen = generated_for(node)
    assert gen is not None
    torch.testing.assert_close(gen(*args), want, rtol=1e-5, atol=3e-5)
    xl = x.contiguous(memory_format=torch.channels_last)   # another layout: the same values
    torch.testing.assert_close(gen(xl, w.reshape(1, c, 1, 1), b.reshape(c, 1, 1), s.reshape(c, 1, 1)), want,
                               rtol=1e-5, atol=3e-5)


def test_bad_kernel_and_groups_name_the_op() -> None:
    t, v = TensorType((2, 6, 5, 5), f32), TensorType((6,), f32)
    with pytest.raises(Exception, match="pool_mixer: the pool's kernel \\[2, 2\\] must be odd"):
        OPS["pool_mixer"].infer_types([t, v, v, v], {"groups": 1, "eps": 1e-5, "kernel": (2, 2),
                                                      "count_include_pad": False})
    with pytest.raises(Exception, match="groups=4 must divide the 6 channels"):
        OPS["pool_mixer"].infer_types([t, v, v, v], {"groups": 4, "eps": 1e-5, "kernel": (3, 3),
                                                      "count_include_pad": False})


class _Mixer(nn.Module):
    """PoolFormer's block as transformers writes it: x + s * (pool(norm(x)) - norm(x)), then a
    normed 1 x 1 MLP with its own layer scale."""

    def __init__(self, c: int, groups: int = 1, k: int = 3, inc: bool = False, scale_first: bool = True) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(groups, c)
        self.pool = nn.AvgPool2d(k, 1, k // 2, count_include_pad=inc)
        self.s1 = nn.Parameter(torch.randn(c))
        self.s2 = nn.Parameter(torch.randn(c))
        self.norm2 = nn.GroupNorm(1, c)
        self.fc1, self.fc2 = nn.Conv2d(c, 2 * c, 1), nn.Conv2d(2 * c, c, 1)
        self.scale_first = scale_first
        with torch.no_grad():
            for n in (self.norm, self.norm2):
                n.weight.uniform_(0.5, 1.5)
                n.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        d = self.pool(y) - y
        m = self.s1.unsqueeze(-1).unsqueeze(-1) * d if self.scale_first else d * self.s1.reshape(1, -1, 1, 1)
        x = x + m
        return x + self.s2.unsqueeze(-1).unsqueeze(-1) * self.fc2(F.gelu(self.fc1(self.norm2(x))))


@pytest.mark.parametrize("c,groups,k,inc,hw,scale_first", [(16, 1, 3, False, 8, True), (6, 2, 3, True, 5, False),
                                                            (10, 1, 5, False, 3, True), (12, 3, 3, False, 1, True)])
@pytest.mark.parametrize("pipeline", ["canonicalize,fuse-library,fuse-kernels,cse,dce", "canonicalize,fuse-library"])
def test_mixer_becomes_one_node_with_the_same_meaning(c: int, groups: int, k: int, inc: bool, hw: int,
                                                      scale_first: bool, pipeline: str) -> None:
    torch.manual_seed(c + groups + k)
    m = _Mixer(c, groups, k, inc, scale_first).eval()
    x = torch.randn(2, c, hw, hw + 1)
    g = partita.optimize(partita.import_torch(m, (x,)), pipeline)
    before = numpy_ref.run(g, [x.numpy()])[0]
    rewritten = g.clone()
    assert fuse_pool_mixers(rewritten) == 1
    rewritten = verify(PassManager.parse("dce").run(rewritten))
    assert [n.op for n in rewritten.nodes].count("pool_mixer") == 1
    assert not any(n.op == "avg_pool2d" for n in rewritten.nodes)
    after = numpy_ref.run(rewritten, [x.numpy()])[0]
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        want = m(x)
    for freeze in (False, True):
        prog = CompiledProgram(g, freeze=freeze)
        assert [n.op for n in prog.graph.nodes].count("pool_mixer") == 1
        for _ in range(2):
            torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)


def test_a_norm_read_elsewhere_or_another_residual_is_left_alone() -> None:
    class Leak(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.GroupNorm(1, 4)
            self.s = nn.Parameter(torch.randn(4))

        def forward(self, x: torch.Tensor, r: torch.Tensor) -> tuple:
            y = self.norm(x)
            mixed = r + self.s.reshape(-1, 1, 1) * (F.avg_pool2d(y, 3, 1, 1, count_include_pad=False) - y)
            return mixed, x + self.s.reshape(-1, 1, 1) * (F.avg_pool2d(self.norm(r), 3, 1, 1) - self.norm(r)) + y

    x, r = torch.randn(2, 4, 5, 5), torch.randn(2, 4, 5, 5)
    g = partita.optimize(partita.import_torch(Leak().eval(), (x, r)), "canonicalize,fuse-library,cse,dce")
    assert fuse_pool_mixers(g) == 0
    assert any(n.op == "avg_pool2d" for n in g.nodes)


def test_backend_path_takes_the_mixer_and_matches_eager() -> None:
    torch.manual_seed(0)
    m = _Mixer(8).eval()
    x = torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        want = m(x)
        pd.reset_stats()
        torch._dynamo.reset()
        cm = torch.compile(m, backend="partita")
        for _ in range(3):
            got = cm(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    s = pd.stats()
    assert s.fallbacks == 0, s.report()
    ops = [n.op for g in s.graphs if g.program is not None for n in g.program.graph.nodes]
    assert ops.count("pool_mixer") == 1, ops


@pytest.mark.parametrize("pipeline", ["canonicalize,fuse-library,fuse-kernels,cse,dce", "canonicalize,fuse-library"])
def test_mlp_layer_scale_folds_into_the_convolution_under_freezing(pipeline: str) -> None:
    torch.manual_seed(3)
    m = _Mixer(6, 2).eval()
    x = torch.randn(2, 6, 5, 4)
    g = partita.optimize(partita.import_torch(m, (x,)), pipeline)
    before = numpy_ref.run(g, [x.numpy()])[0]
    folded = g.clone()
    assert fold_residual_scales(folded) == 1
    folded = verify(PassManager.parse("dce").run(folded))
    convs = [n for n in folded.nodes if n.op == "conv2d_pointwise"]
    assert [n.attrs["binary"] for n in convs] == ["none", "add"]
    assert folded.outputs[0].producer is convs[1]   # the scale and the residual are the convolution's
    after = numpy_ref.run(folded, [x.numpy()])[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        want = m(x)
    for freeze in (False, True):
        prog = CompiledProgram(g, freeze=freeze)
        adds = [n for n in prog.graph.nodes if n.op == "conv2d_pointwise" and n.attrs["binary"] == "add"]
        assert len(adds) == (1 if freeze else 0)
        for _ in range(2):
            torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)


def test_a_scale_not_known_or_a_convolution_read_twice_is_not_folded() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Conv2d(4, 4, 1)
            self.s = nn.Parameter(torch.randn(4))

        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> tuple:
            h = self.fc(x)
            return x + scale.reshape(-1, 1, 1) * self.fc(x + 1), x + self.s.reshape(-1, 1, 1) * h, h

    x = torch.randn(2, 4, 3, 3)
    g = partita.optimize(partita.import_torch(Twice().eval(), (x, torch.randn(4))), "canonicalize,fuse-library")
    assert fold_residual_scales(g) == 0
