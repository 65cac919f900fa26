"""GroupNorm as one step (partita/codegen/group_norm.py): the ``group_norm`` op against
torch.nn.functional.group_norm on odd shapes, the written-out form the importers make taken back
into it (bit for bit on the reference interpreter), and models through the import path and the
torch.compile backend against eager."""

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
from partita.codegen.group_norm import KERNEL_UNARY, generated_for, group_norm_kernel
from partita.ir import verify
from partita.ir.graph import Graph, Node
from partita.ir.types import TensorType
from partita.ir.dtypes import f32
from partita.ops.registry import OPS
from partita.passes import PassManager

# (n, c, spatial, groups): groups 1, 2 and C; C not a multiple of the vector width; H*W 1, 7, 49
SHAPES = [(2, 6, (1, 1), 1), (2, 6, (1, 7), 2), (3, 6, (7, 7), 6), (1, 10, (7, 7), 2), (2, 10, (1, 7), 10),
          (2, 12, (5, 3), 3), (1, 4, (9,), 2), (2, 8, (3, 3, 3), 4)]
ACTS = {"none": lambda y: y, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu}


def _want(x: torch.Tensor, g: int, w, b, unary: str) -> torch.Tensor:
    return ACTS[unary](F.group_norm(x, g, w, b, 1e-5))


@pytest.mark.parametrize("n,c,sp,g", SHAPES)
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("unary", ["none", "relu", "silu", "gelu"])
def test_op_reference_and_step_match_torch_group_norm(n: int, c: int, sp: tuple, g: int, affine: bool,
                                                       unary: str) -> None:
    torch.manual_seed(n * 100 + c + g)
    x = torch.randn(n, c, *sp) * 3 + 1
    w, b = (torch.randn(c), torch.randn(c)) if affine else (None, None)
    want = _want(x, g, w, b, unary)
    attrs = OPS["group_norm"].normalize_attrs({"groups": g, "eps": 1e-5, "unary": unary})
    args = [x] + ([w, b] if affine else [])
    ref = OPS["group_norm"].reference([a.numpy() for a in args], attrs)
    np.testing.assert_allclose(ref, want.numpy(), rtol=1e-5, atol=2e-5)
    xt = TensorType(tuple(x.shape), f32)
    gr = Graph("g")
    operands = [gr.add_input("x", xt)] + ([gr.add_input(k, TensorType((c,), f32)) for k in "wb"] if affine else [])
    node = Node("group_norm", operands, attrs, [xt])
    step = group_norm_kernel(node)
    assert step is not None
    assert (generated_for(node) is not None) == (unary in KERNEL_UNARY)   # else ATen runs it
    torch.testing.assert_close(step(args, attrs), want, rtol=1e-5, atol=2e-5)
    if x.dim() == 4:   # a channels-last input gives the same values
        xl = x.contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(step([xl] + args[1:], attrs), want, rtol=1e-5, atol=2e-5)


def test_bad_groups_name_the_op_and_the_channels() -> None:
    with pytest.raises(Exception, match="groups=4 must divide the 6 channels"):
        OPS["group_norm"].infer_types([TensorType((2, 6, 3, 3), f32)], {"groups": 4, "eps": 1e-5, "unary": "none"})


class _Block(nn.Module):
    """A pre-activation block as BiT writes it (GroupNorm, ReLU, convolution) and PoolFormer's
    GroupNorm of one group read twice."""

    def __init__(self, c: int, groups: int, affine: bool = True) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(groups, c, affine=affine)
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.norm1 = nn.GroupNorm(1, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(torch.relu(self.norm(x)))
        y = self.norm1(h)
        return F.avg_pool2d(y, 3, 1, 1, count_include_pad=False) - y + h


@pytest.mark.parametrize("c,groups,hw,affine", [(6, 2, 7, True), (10, 5, 1, True), (8, 8, 5, False),
                                                 (12, 1, 7, True)])
def test_written_out_group_norm_becomes_one_node_with_the_same_reference(c: int, groups: int, hw: int,
                                                                          affine: bool) -> None:
    torch.manual_seed(c + groups)
    m = _Block(c, groups, affine).eval()
    x = torch.randn(2, c, hw, hw)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize")
    before = numpy_ref.run(g, [x.numpy()])[0]
    fused = verify(PassManager.parse("fuse-library,dce").run(g.clone()))
    gns = [n for n in fused.nodes if n.op == "group_norm"]
    assert len(gns) == 2, [n.op for n in fused.nodes]
    assert gns[0].attrs["unary"] == "relu" and gns[0].attrs["groups"] == groups
    assert gns[1].attrs["unary"] == "none" and gns[1].attrs["groups"] == 1
    assert not any(n.op in ("rsqrt", "mean") for n in fused.nodes)
    after = numpy_ref.run(fused, [x.numpy()])[0]
    np.testing.assert_array_equal(after, before)
    with torch.no_grad():
        want = m(x)
    prog = CompiledProgram(partita.optimize(partita.import_torch(m, (x,)),
                                            "canonicalize,fuse-library,fuse-kernels,cse,dce"), freeze=True)
    for _ in range(2):
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)


def test_a_group_norm_read_before_its_affine_part_is_left_written_out() -> None:
    class Leak(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple:
            g = x.reshape(2, 2, -1)
            mu = g.mean(-1, keepdim=True)
            d = g - mu
            r = torch.rsqrt((d * d).mean(-1, keepdim=True) + 1e-5)
            return (d * r).reshape(x.shape), d      # the centred value is an output too

    x = torch.randn(2, 4, 3, 3)
    g = PassManager.parse("canonicalize,fuse-library,dce").run(partita.import_torch(Leak(), (x,)))
    assert not any(n.op == "group_norm" for n in g.nodes)


def test_backend_path_takes_group_norm_and_matches_eager() -> None:
    torch.manual_seed(0)
    m = _Block(8, 4).eval()
    x = torch.randn(2, 8, 7, 7)
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
    assert ops.count("group_norm") == 2, ops
    assert "reshape" not in ops, ops   # frozen affine params ([1, C, 1, 1] after folding) are read as they are
