"""A frozen program folds what constants alone feed (``fold-constants`` ahead of ``fold-params``
in ``CompiledProgram(freeze=True)``): DeBERTa-v2's log-bucketed relative positions, made from
tensors the forward creates, and the scale ``sqrt(E * 3)`` are computed once, not at every
call; the results equal eager's and the unfrozen program's, which keeps the steps."""

from __future__ import annotations

import torch
import torch.nn as nn

import partita
from partita.codegen import CompiledProgram


class _Buckets(nn.Module):
    """Scores plus a bias gathered by log-bucketed relative positions (DeBERTa-v2's
    ``make_log_bucket_position`` on a constant position table), scaled by sqrt(E * 3)."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Embedding(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.tensor([[i - j for j in range(7)] for i in range(7)], dtype=torch.float32)
        mid = 2
        sign = torch.sign(pos)
        abs_pos = torch.where((pos < mid) & (pos > -mid), torch.tensor(mid - 1.0), torch.abs(pos))
        log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor(7.0 / mid)) * (mid - 1)) + mid
        bucket = torch.where(abs_pos <= mid, pos, log_pos * sign).long() + 7
        scale = torch.sqrt(torch.tensor(x.shape[-1] * 3.0))
        scores = x @ x.transpose(-1, -2) / scale
        return scores + self.bias(bucket)[..., 0]


def test_constant_only_chains_fold_and_match_eager():
    torch.manual_seed(0)
    m = _Buckets().eval()
    x = torch.randn(2, 7, 6)
    g = partita.import_torch(m, (x,))
    frozen = CompiledProgram(g, freeze=True)
    loose = CompiledProgram(g)
    ops = [n.op for n in frozen.graph.nodes]
    assert not {"log", "ceil", "sqrt", "sign"} & set(ops), ops
    with torch.no_grad():
        ref = m(x)
        torch.testing.assert_close(frozen([x])[0], ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loose([x])[0], ref, rtol=1e-5, atol=1e-5)
