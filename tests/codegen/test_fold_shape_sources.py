"""fold-params on values made from shapes alone (partita/codegen/inference.py): a causal mask
built from ``arange`` and a padding mask gathered through indices made from shapes (GPT-2's
mask path) are computed once; the identity gather goes; the results are unchanged (the
reference interpreter before and after, the compiled program against eager)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

import partita
from partita.backend import numpy_ref
from partita.codegen import CompiledProgram
from partita.ir import verify
from partita.passes import PassManager


class _Masked(nn.Module):
    """Scores masked by a causal mask and a padding mask gathered row by row."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n = x.shape[0], x.shape[1]
        pos = torch.arange(n)
        causal = (pos[None, None, :] <= pos[None, :, None])
        rows = torch.arange(b)
        idx = (rows[:, None] * n + pos[None, :]).reshape(-1)
        pad = mask.bool().reshape(-1).index_select(0, idx).reshape(b, 1, n)
        scores = x @ x.transpose(1, 2)
        return torch.where(causal & pad, scores, torch.full_like(scores, -1e9))


def _case():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    m = _Masked().eval()
    g = partita.import_torch(m, (x, mask))
    return g, m, x, mask


def test_shape_only_values_are_folded_and_the_identity_gather_goes():
    g, m, x, mask = _case()
    assert any(n.op == "iota" for n in g.nodes) and any(n.op == "index_select" for n in g.nodes)
    before = numpy_ref.run(g, [x.numpy(), mask.numpy()])[0]
    folded = verify(PassManager.parse("fold-params,dce").run(g.clone()))
    ops = [n.op for n in folded.nodes]
    assert "iota" not in ops and "index_select" not in ops
    after = numpy_ref.run(folded, [x.numpy(), mask.numpy()])[0]
    np.testing.assert_array_equal(after, before)


def test_compiled_program_with_folded_masks_matches_eager():
    g, m, x, mask = _case()
    prog = CompiledProgram(g, freeze=True)
    assert not any(n.op in ("iota", "index_select") for n in prog.graph.nodes)
    with torch.no_grad():
        want = m(x, mask)
    got = prog([x, mask])[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_gather_that_permutes_is_kept():
    g = partita.import_torch(_Reverse().eval(), (torch.randn(5, 3),))
    folded = verify(PassManager.parse("fold-params,dce").run(g.clone()))
    assert any(n.op == "index_select" for n in folded.nodes)
    x = torch.randn(5, 3)
    np.testing.assert_array_equal(numpy_ref.run(folded, [x.numpy()])[0], x.flip(0).numpy())


class _Reverse(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.index_select(0, torch.arange(x.shape[0] - 1, -1, -1))
