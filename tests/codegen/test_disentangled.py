"""DeBERTa-v2's disentangled attention terms as one op and one generated kernel
(partita/codegen/disentangled.py): the kernel against the reference and torch on odd shapes
(head sizes that are, and are not, multiples of the vector width; strided q views; both
orientations), the fuse-library rewrite of the terms as transformers writes them (a module
imported from torch, against torch), what it leaves alone, and bad operands."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import partita
from partita.codegen import CompiledProgram
from partita.codegen.disentangled import PreparedRelScores, rel_scores_ir
from partita.ir import Builder, TensorType, verify
from partita.ir.diagnostics import TypeRuleError
from partita.ir.dtypes import DTYPES
from partita.ops.registry import OPS
from partita.passes import PassManager

F32, I64 = DTYPES["f32"], DTYPES["i64"]

# (B, H, rows, D, R, C): D a vector, odd, below a vector, over two vectors; one head; rows != C
_SHAPES = [(4, 4, 8, 16, 32, 8), (2, 3, 5, 7, 9, 6), (1, 1, 1, 3, 2, 1), (3, 2, 11, 33, 20, 13), (2, 5, 6, 64, 12, 6)]


@pytest.mark.parametrize("shape", _SHAPES)
@pytest.mark.parametrize("transpose", [False, True])
def test_the_kernel_equals_the_reference_and_torch(shape, transpose):
    b, h, rows, d, r, c = shape
    rng = np.random.default_rng(sum(shape))
    a = rng.standard_normal((b, rows, h, d)).astype(np.float32)
    table = rng.standard_normal((h, r, d)).astype(np.float32)
    idx = rng.integers(0, r, (rows, c)).astype(np.int64)
    a4 = torch.from_numpy(a).transpose(1, 2)                    # [B, H, rows, D], read in place
    attrs = {"transpose": transpose}
    want = OPS["rel_scores"].reference([a4.numpy(), table, idx], attrs)
    got = PreparedRelScores(tuple(a4.shape), table.shape, idx.shape, transpose)(a4, torch.from_numpy(table),
                                                                              torch.from_numpy(idx))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    a3 = a4.reshape(b * h, rows, d)                             # the 3-D form, contiguous
    got3 = PreparedRelScores(tuple(a3.shape), table.shape, idx.shape, transpose)(a3, torch.from_numpy(table),
                                                                               torch.from_numpy(idx))
    np.testing.assert_allclose(got3.numpy(), want, rtol=1e-5, atol=1e-5)
    on_aten = OPS["rel_scores"].torch([a4, torch.from_numpy(table), torch.from_numpy(idx)], attrs)
    np.testing.assert_allclose(on_aten.numpy(), want, rtol=1e-5, atol=1e-5)
    # gather(matmul(a, table repeated ^T), idx), written as the model writes it
    rep = torch.from_numpy(table).repeat(b, 1, 1)
    s = torch.gather(torch.bmm(a3, rep.transpose(-1, -2)), -1, torch.from_numpy(idx).expand(b * h, rows, c))
    np.testing.assert_allclose(got3.numpy(), (s.transpose(1, 2) if transpose else s).numpy(), rtol=1e-5, atol=1e-5)


def test_the_ir_uses_vectors_and_a_scalar_tail():
    assert "<16 x float>" in rel_scores_ir("k", 16, lanes=16)
    ir = rel_scores_ir("k", 7, lanes=16)
    assert "<4 x float>" in ir and "@llvm.fma.f32" in ir


class Disentangled(torch.nn.Module):
    """The c2p and p2c terms of transformers' DisentangledSelfAttention (share_att_key), with
    the scale and the attention after them."""

    def __init__(self, heads: int = 4, d: int = 16, span: int = 8) -> None:
        super().__init__()
        self.h, self.d, self.span = heads, d, span
        self.rel = torch.nn.Parameter(torch.randn(2 * span, heads * d))
        self.pk = torch.nn.Linear(heads * d, heads * d)
        self.pq = torch.nn.Linear(heads * d, heads * d)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        bh, t, d = q.shape
        rel = torch.arange(t)[:, None] - torch.arange(t)[None, :]
        pos_k = self.pk(self.rel).view(2 * self.span, self.h, d).transpose(0, 1).repeat(bh // self.h, 1, 1)
        pos_q = self.pq(self.rel).view(2 * self.span, self.h, d).transpose(0, 1).repeat(bh // self.h, 1, 1)
        c2p_pos = torch.clamp(rel + self.span, 0, 2 * self.span - 1)
        c2p = torch.gather(torch.bmm(q, pos_k.transpose(-1, -2)), -1, c2p_pos.unsqueeze(0).expand(bh, t, t))
        p2c_pos = torch.clamp(-rel + self.span, 0, 2 * self.span - 1)
        p2c = torch.gather(torch.bmm(k, pos_q.transpose(-1, -2)), -1, p2c_pos.unsqueeze(0).expand(bh, t, t))
        scores = torch.bmm(q, k.transpose(-1, -2)) + c2p / 3.0 + p2c.transpose(-1, -2) / 3.0
        return torch.softmax(scores, -1)


@pytest.mark.parametrize("t", [8, 5, 13])
def test_the_rewrite_takes_the_terms_and_keeps_their_meaning(t):
    torch.manual_seed(t)
    m = Disentangled().eval()
    q, k = torch.randn(8, t, 16), torch.randn(8, t, 16)
    g = partita.optimize(partita.import_torch(m, (q, k)), "canonicalize,fuse-library,cse,dce")
    ops = [n.op for n in g.nodes]
    assert ops.count("rel_scores") == 2 and "gather" not in ops
    assert sorted(n.attrs["transpose"] for n in g.nodes if n.op == "rel_scores") == [False, True]
    prog = CompiledProgram(g, freeze=True)
    weights = {kk: torch.from_numpy(np.array(v, copy=True)) for kk, v in g.weights.items()}
    args = [q, k]
    with torch.no_grad():
        want = m(q, k)
    got = prog(args, weights)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    steps = [st for st in prog.program.steps if st[7].op == "rel_scores"]
    assert len(steps) == 2


def test_what_the_rewrite_leaves_alone():
    b = Builder()
    x = b.input("x", TensorType((4, 6, 8), F32))
    m = b.input("m", TensorType((4, 10, 8), F32))
    idx = b.input("idx", TensorType((4, 6, 6), I64))        # a per-row index: not shared by every row
    s = b.matmul(x, b.transpose(m, perm=(0, 2, 1)))
    g = verify(b.ret(b.gather(s, idx, axis=2)))
    assert "rel_scores" not in [n.op for n in PassManager.parse("fuse-library,dce").run(g).nodes]
    b = Builder()
    x = b.input("x", TensorType((4, 6, 8), F32))
    m = b.input("m", TensorType((4, 10, 8), F32))
    i2 = b.input("i2", TensorType((1, 6, 6), I64))
    s = b.matmul(x, b.transpose(m, perm=(0, 2, 1)))
    g = verify(b.ret(b.gather(s, b.broadcast_to(i2, shape=(4, 6, 6)), axis=2), s))   # the scores read elsewhere
    assert "rel_scores" not in [n.op for n in PassManager.parse("fuse-library,dce").run(g).nodes]


def test_bad_operands_get_clear_errors():
    b = Builder()
    a = b.input("a", TensorType((4, 6, 8), F32))
    with pytest.raises(TypeRuleError, match="table is .* H dividing"):
        b.rel_scores(a, b.input("t", TensorType((3, 10, 8), F32)), b.input("i", TensorType((6, 6), I64)))
    with pytest.raises(TypeRuleError, match="idx is .* integer \\[6, C\\]"):
        b.rel_scores(a, b.input("t2", TensorType((2, 10, 8), F32)), b.input("i2", TensorType((5, 6), I64)))
    pr = PreparedRelScores((4, 6, 8), (2, 10, 8), (6, 6), False)
    bad = torch.full((6, 6), 10, dtype=torch.int64)
    with pytest.raises(IndexError, match="outside the table's 10 positions"):
        pr(torch.randn(4, 6, 8), torch.randn(2, 10, 8), bad)


def test_a_matmul_broadcasting_its_rows_of_heads_is_left_alone():
    b = Builder()
    x = b.input("x", TensorType((1, 6, 8), F32))          # one row of heads for all four
    m = b.input("m", TensorType((4, 10, 8), F32))
    i2 = b.input("i2", TensorType((1, 6, 6), I64))
    s = b.matmul(x, b.transpose(m, perm=(0, 2, 1)))
    g = verify(b.ret(b.gather(s, b.broadcast_to(i2, shape=(4, 6, 6)), axis=2)))
    assert "rel_scores" not in [n.op for n in PassManager.parse("fuse-library,dce").run(g).nodes]
