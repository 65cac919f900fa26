"""A weight whose storage is swapped under the same tensor object (``w.data = other``: no
in-place write, so its version does not move) is noticed by the packed-weight caches
(codegen/library.py keys each packed copy by object, version and address) and by the step
chains that run the packed kernels: the program computes with the new values, never the old
packed copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import partita
from partita.codegen import CompiledProgram


class _Net(nn.Module):
    """A 3 x 3 convolution, a depthwise one, a 1 x 1 one and a linear layer: the kinds of
    packed weights the library keeps."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(16, 32, 3, padding=1)
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.pw = nn.Conv2d(32, 32, 1)
        self.fc = nn.Linear(32, 24)

    def forward(self, x):
        h = torch.relu(self.c(x))
        h = torch.relu(self.pw(torch.relu(self.dw(h))))
        return self.fc(h.mean((2, 3)))


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("swapped", ["c.weight", "dw.weight", "pw.weight", "fc.weight", "fc.bias"])
def test_a_storage_swapped_under_a_weight_is_computed_with(swapped):
    torch.manual_seed(0)
    m = _Net().eval()
    x = torch.randn(2, 16, 12, 12)
    g = partita.import_torch(m, (x,))
    prog = CompiledProgram(g)
    w = {k: torch.as_tensor(np.array(v)).clone() for k, v in g.weights.items()}
    for _ in range(6):                       # packed, measured, chained
        prog([x], w)
    old = w[swapped].clone()
    w[swapped].data = torch.randn_like(old)
    assert w[swapped].data_ptr() != old.data_ptr()
    want = partita.run(g, [x.numpy()], {k: v.numpy() for k, v in w.items()})[0]
    for _ in range(3):                       # the first call after the swap and the steady state again
        got = prog([x], w)[0]
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
