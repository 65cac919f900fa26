"""BatchNorm1d after and before a Linear (LeViT's blocks) folded by ``fold-batch-norm`` into the
linear layer's weight and a bias: the reference interpreter before and after the pass, the
compiled program against eager, and the batch norms it must leave."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

import partita
from partita.codegen import CompiledProgram


def _randomize(bn: nn.BatchNorm1d) -> None:
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)


class _LinearBN(nn.Module):
    """LeViT's MLPLayerWithBN: a Linear without bias, BatchNorm1d over the flattened tokens; then
    a 2-d one, and a BatchNorm1d before a Linear with a bias (LeViT's classifier)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 24, bias=False)
        self.bn = nn.BatchNorm1d(24)
        self.lin2 = nn.Linear(24, 12, bias=True)
        self.bn2 = nn.BatchNorm1d(12)
        self.head_bn = nn.BatchNorm1d(12)
        self.head = nn.Linear(12, 5)
        for b in (self.bn, self.bn2, self.head_bn):
            _randomize(b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.lin(x).flatten(0, 1)).reshape(x.shape[0], x.shape[1], -1)
        h = torch.relu(h).mean(1)
        h = self.bn2(self.lin2(h))
        return self.head(self.head_bn(h))


def _graph() -> tuple[partita.Graph, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = _LinearBN().eval()
    x = torch.randn(4, 6, 16)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize")
    with torch.inference_mode():
        want = m.double()(x.double()).float()
    return g, x, want


def test_the_batch_norms_fold_and_keep_the_meaning() -> None:
    g, x, want = _graph()
    assert sum(n.op == "batch_norm" for n in g.nodes) == 3
    before = partita.run(g, [x.numpy()])[0]
    h = partita.optimize(g.clone(), "fold-batch-norm")
    assert not any(n.op == "batch_norm" for n in h.nodes)
    assert not any("running" in str(v.name) for v in h.inputs)
    after = partita.run(h, [x.numpy()])[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after, want.numpy(), rtol=1e-4, atol=1e-5)


def test_the_program_gives_eagers_results() -> None:
    g, x, want = _graph()
    for freeze in (False, True):
        prog = CompiledProgram(g, freeze=freeze)
        assert not any(n.op == "batch_norm" for n in prog.graph.nodes)
        for _ in range(3):
            torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)


class _Shared(nn.Module):
    """The linear's result read by the batch norm and by an add: the norm must stay."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8, bias=False)
        self.bn = nn.BatchNorm1d(8)
        _randomize(self.bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return self.bn(y) + y


def test_a_result_read_elsewhere_keeps_its_batch_norm() -> None:
    torch.manual_seed(0)
    m = _Shared().eval()
    x = torch.randn(5, 8)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fold-batch-norm")
    assert sum(n.op == "batch_norm" for n in g.nodes) == 1
    with torch.inference_mode():
        want = m(x)
    np.testing.assert_allclose(partita.run(g, [x.numpy()])[0], want.numpy(), rtol=1e-5, atol=1e-6)


class _WeightIn(nn.Module):
    """The matmul's weight is a call input, not a param: nothing to fold into."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(8)
        _randomize(self.bn)

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.bn(x @ w)


def test_an_unknown_weight_keeps_its_batch_norm() -> None:
    torch.manual_seed(0)
    m = _WeightIn().eval()
    x, w = torch.randn(5, 8), torch.randn(8, 8)
    g = partita.optimize(partita.import_torch(m, (x, w)), "canonicalize,fold-batch-norm")
    assert sum(n.op == "batch_norm" for n in g.nodes) == 1
    with torch.inference_mode():
        want = m(x, w)
    np.testing.assert_allclose(partita.run(g, [x.numpy(), w.numpy()])[0], want.numpy(), rtol=1e-5, atol=1e-6)
