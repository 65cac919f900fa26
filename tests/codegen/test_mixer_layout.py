"""The pool_mixer kernel's channels-last result: a channels-last input with one group gives a
channels-last result (written over a given row-major buffer's bytes), equal to torch's ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from partita.codegen.token_mixer import PreparedPoolMixer


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, s: torch.Tensor, k: tuple, pad: bool) -> torch.Tensor:
    """``x + s * (avg_pool(gn(x)) - gn(x))`` by torch's ops (one group)."""
    gn = F.group_norm(x.double(), 1, w.double(), b.double(), 1e-5)
    pool = F.avg_pool2d(gn, k, 1, (k[0] // 2, k[1] // 2), count_include_pad=pad)
    return (x.double() + s.double().view(1, -1, 1, 1) * (pool - gn)).float()


@pytest.mark.parametrize("shape,k,pad", [((2, 5, 7, 3), (3, 3), False), ((3, 16, 8, 8), (3, 3), False),
                                         ((1, 9, 11, 13), (5, 3), True), ((2, 4, 1, 1), (3, 3), False),
                                         ((2, 12, 6, 9), (3, 5), False)])
@pytest.mark.parametrize("given", [False, True])
def test_channels_last_input_gives_channels_last_result(shape: tuple, k: tuple, pad: bool, given: bool) -> None:
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g).contiguous(memory_format=torch.channels_last)
    c = shape[1]
    w, b, s = (torch.randn(c, generator=g) for _ in range(3))
    try:
        mixer = PreparedPoolMixer(shape, 1, 1e-5, k, pad)
    except Exception as e:  # pragma: no cover: no code generator on this machine
        pytest.skip(f"no generated kernel here: {e}")
    out = torch.full(shape, float("nan")) if given else None
    for _ in range(2):   # the second call reuses the buffer's channels-last view
        y = mixer(x, w, b, s, out=out)
        assert y.is_contiguous(memory_format=torch.channels_last)
        if given:
            assert out is not None and y.data_ptr() == out.data_ptr()
        torch.testing.assert_close(y, reference(x, w, b, s, k, pad), rtol=1e-5, atol=1e-5)


def test_contiguous_input_keeps_contiguous_result() -> None:
    x = torch.randn(2, 6, 5, 7)
    w, b, s = torch.randn(6), torch.randn(6), torch.randn(6)
    y = PreparedPoolMixer(tuple(x.shape), 1, 1e-5, (3, 3), False)(x, w, b, s)
    assert y.is_contiguous()
    torch.testing.assert_close(y, reference(x, w, b, s, (3, 3), False), rtol=1e-5, atol=1e-5)


def test_a_mixer_result_returned_to_the_caller_is_contiguous() -> None:
    import torch.nn as nn

    from partita.codegen import CompiledProgram
    from partita import import_torch, optimize

    class Mixer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.GroupNorm(1, 8)
            self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
            self.scale = nn.Parameter(torch.randn(8, 1, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.norm(x)
            return x + self.scale * (self.pool(y) - y)

    m = Mixer().eval()
    x = torch.randn(2, 8, 5, 7).contiguous(memory_format=torch.channels_last)
    g = optimize(import_torch(m, (x,)), "canonicalize,fuse-library,fuse-kernels,cse,dce")
    prog = CompiledProgram(g)
    assert any(n.op == "pool_mixer" for n in prog.graph.nodes), "the pattern should become one pool_mixer"
    y = prog([x])[0]
    assert torch.as_tensor(y).is_contiguous()
    torch.testing.assert_close(torch.as_tensor(y), m(x), rtol=1e-5, atol=1e-5)
