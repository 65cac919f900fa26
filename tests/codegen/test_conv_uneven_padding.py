"""Uneven "same" padding merged into ``conv2d_pointwise`` (``padding`` before, ``padding_end``
after; codegen/library.py's fuse-library): the pass takes a zero pad of the spatial dims whose
one user is a convolution, the reference interpreter gives the same values before and after,
the generated direct and depthwise kernels run the unequal sides themselves, oneDNN and ATen
pad first; every kernel a node may pick gives torch's results; the attribute's text form reads
back and a bad one is refused with what to give."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.codegen import CompiledProgram, choose, library
from partita.codegen import conv as K
from partita.codegen import depthwise as D
from partita.ir.diagnostics import TypeRuleError
from partita.ir.verifier import verify

PIPELINE = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"


class _Same(nn.Module):
    """TensorFlow-style "same" pads before a stride-2 stem, a depthwise 3 x 3 and a 5 x 5."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 32, 3, 2)
        self.dw = nn.Conv2d(32, 32, 3, 2, groups=32)
        self.pw = nn.Conv2d(32, 16, 1)
        self.b = nn.Conv2d(16, 40, 5, 1, padding=1)

    def forward(self, x):
        x = torch.relu(self.a(F.pad(x, (0, 1, 0, 1))))
        x = torch.relu(self.dw(F.pad(x, (1, 2, 0, 1))))
        x = self.pw(x)
        return self.b(F.pad(x, (1, 0, 0, 2)))


def _graphs():
    torch.manual_seed(0)
    m = _Same().eval()
    x = torch.randn(2, 3, 17, 18)
    g0 = partita.import_torch(m, (x,))
    with torch.inference_mode():
        want = m.double()(x.double()).float()
    return g0, partita.optimize(g0, PIPELINE), x, want


def _weights(g):
    return {k: np.array(v, copy=True) for k, v in g.weights.items()}


def test_the_pass_merges_uneven_pads_and_the_reference_agrees():
    g0, g, x, want = _graphs()
    convs = [n for n in g.nodes if n.op == "conv2d_pointwise"]
    assert not any(n.op == "pad" for n in g.nodes) and len(convs) == 4
    assert [n.attrs["padding_end"] for n in convs] == [(1, 1), (1, 2), None, (3, 1)]
    assert [list(n.attrs["padding"]) for n in convs] == [[0, 0], [0, 1], [0, 0], [1, 2]]
    before = partita.run(g0, {"x": x.numpy()}, _weights(g0))[0]
    after = partita.run(g, {"x": x.numpy()}, _weights(g))[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(after, want.numpy(), rtol=1e-4, atol=1e-4)


def test_the_text_form_reads_back_and_a_bad_padding_end_is_refused():
    _, g, _, _ = _graphs()
    text = partita.print_graph(g)
    assert "padding_end=[1, 2]" in text and partita.print_graph(partita.parse(text)) == text
    bad = text.replace("padding_end=[1, 2]", "padding_end=[1, -2]")
    with pytest.raises(Exception, match="padding_end"):
        verify(partita.parse(bad))
    node = next(n for n in g.nodes if n.op == "conv2d_pointwise")
    with pytest.raises(TypeRuleError, match="padding_end must be two sizes"):
        library.OPS["conv2d_pointwise"].infer([v.type for v in node.operands], dict(node.attrs, padding_end=(1,)))


def test_the_program_without_measuring_matches_torch():
    _, g, x, want = _graphs()
    prog = CompiledProgram(g, freeze=True)
    w = {k: torch.from_numpy(v) for k, v in _weights(g).items()}
    before = library.packed_weight_stats()["generated_conv_calls"]
    for _ in range(3):
        torch.testing.assert_close(prog([x], w)[0], want, rtol=1e-4, atol=1e-4)
    if library._generated_gemm():
        assert library.packed_weight_stats()["generated_conv_calls"] > before


@pytest.mark.parametrize("winner", ["generated", "onednn", "aten"])
def test_every_kernel_a_node_may_pick_pads_as_it_should(monkeypatch, tmp_path, winner):
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "measure")
    monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path / "cache"))
    choose.clear(disk=False)

    def rigged(cands, clock=None, rounds=None):
        for fn in cands.values():
            fn()
        return {k: (1.0 if k == winner else 5.0) for k in cands}

    monkeypatch.setattr(choose, "measure", rigged)
    try:
        _, g, x, want = _graphs()
        prog = CompiledProgram(g)
        for _ in range(4):
            torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-4)
        assert any(c.picked == winner and "padding_end" in c.key for c in prog.kernel_choices())
    finally:
        choose.clear(disk=False)


@pytest.mark.parametrize("shape", [((2, 5, 9, 8), (24, 5, 3, 3), (2, 2), (0, 1), (1, 0)),
                                   ((1, 8, 7, 7), (32, 8, 5, 5), (1, 1), (2, 1), (1, 3)),
                                   ((3, 4, 6, 10), (40, 4, 3, 2), (1, 3), (1, 0), (2, 1))])
def test_the_direct_kernel_runs_unequal_sides(shape):
    xs, ws, stride, begin, end = shape
    g = torch.Generator().manual_seed(0)
    x = torch.randn(xs, generator=g).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(ws, generator=g), torch.randn(ws[0], generator=g)
    pc = K.PreparedConv(xs, ws, list(stride), list(begin), "relu", padding_end=list(end))
    want = torch.relu(F.conv2d(F.pad(x.double(), (begin[1], end[1], begin[0], end[0])), w.double(), b.double(),
                               stride=stride))
    y = pc(x, pc.pack(w), b)
    assert y.shape == want.shape
    assert float((y.double() - want).abs().max()) < 1e-5 * max(1.0, float(want.abs().max()))


@pytest.mark.parametrize("shape", [((2, 16, 9, 8), 3, (2, 2), (0, 1), (1, 0)),
                                   ((1, 24, 11, 7), 5, (1, 1), (1, 2), (3, 0)),
                                   ((2, 8, 6, 13), 3, (2, 1), (1, 1), (2, 2))])
def test_the_depthwise_kernel_runs_unequal_sides(shape):
    xs, k, stride, begin, end = shape
    c = xs[1]
    assert D.supported(xs, (c, 1, k, k), list(stride), list(begin), [1, 1], c, list(end)) == ""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(xs, generator=g).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(c, 1, k, k, generator=g), torch.randn(c, generator=g)
    pd = D.PreparedDepthwise(xs, (c, 1, k, k), list(stride), list(begin), "relu", padding_end=list(end))
    want = torch.relu(F.conv2d(F.pad(x.double(), (begin[1], end[1], begin[0], end[0])), w.double(), b.double(),
                               stride=stride, groups=c))
    y = pd(x, pd.pack(w), b)
    assert y.shape == want.shape
    assert float((y.double() - want).abs().max()) < 1e-5 * max(1.0, float(want.abs().max()))
