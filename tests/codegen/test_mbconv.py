"""Inverted-residual (MobileNet v2/v3, EfficientNet) blocks on the generated convolutions:
the prepared kernels' parameter block kept between calls with the same tensors (conv.py's
``bound_args``/``bound_call``), checked against torch when the tensors, their contents or
their storage change; the generated NCHW -> NHWC copy of a stem's image (nhwc.py); and the blocks through the import path with measuring on, where the
convolutions whose generated kernel is only a candidate write into the memory plan's
buffers (library.py's ``writes_into``), against eager over several calls, on odd channel
counts, stride 2 with odd sizes and 1 x 1 maps."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.codegen import CompiledProgram, choose, library
from partita.codegen.conv import PreparedConv
from partita.codegen.depthwise import PreparedDepthwise
from partita.codegen.nhwc import NhwcCopy, takes

CL = torch.channels_last


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Measuring on, with a choice cache of this test's own."""
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "measure")
    monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path / "cache"))
    choose.clear(disk=False)
    yield
    choose.clear(disk=False)


def _cl(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).contiguous(memory_format=CL)


def _conv_ref(x, w, b, stride, pad, groups, act, other=None):
    y = F.conv2d(x.double(), w.double(), None if b is None else b.double(), stride, pad, groups=groups)
    if other is not None:
        y = y + other.double()
    return {"none": y, "relu6": y.clamp(0, 6), "silu": F.silu(y)}[act].float()


@pytest.mark.parametrize("kind", ["pointwise", "depthwise", "depthwise_s2"])
@pytest.mark.parametrize("bias", [True, False])
def test_a_kernel_called_again_reads_what_its_tensors_hold_now(kind, bias):
    torch.manual_seed(0)
    if kind == "pointwise":
        xs, ws, stride, pad, groups = (3, 13, 5, 7), (37, 13, 1, 1), [1, 1], [0, 0], 1
        k = PreparedConv(xs, ws, stride, pad, "relu6", other=True)
    else:
        s = 2 if kind == "depthwise_s2" else 1
        xs, ws, stride, pad, groups = (3, 37, 9, 7), (37, 1, 3, 3), [s, s], [1, 1], 37
        k = PreparedDepthwise(xs, ws, stride, pad, "relu6", other=s == 1)
    w, b = torch.randn(ws), (torch.randn(ws[0]) if bias else None)
    packed = k.pack(w)
    out = torch.empty(k.shape).contiguous(memory_format=CL)
    x = _cl(*xs)
    other = _cl(*k.shape) if k.other else None
    for step in range(5):
        if step == 1:
            x.copy_(torch.randn(xs))                   # the same tensor, new contents
        elif step == 2:
            x = _cl(*xs)                               # another tensor
        elif step == 3:
            x.set_(_cl(*xs).untyped_storage(), 0, xs, x.stride())   # the same object, other storage
        elif step == 4 and other is not None:
            other = _cl(*k.shape)
        y = k(x, packed, b, other, out)
        assert y is out
        torch.testing.assert_close(y, _conv_ref(x, w, b, stride, pad, groups, "relu6", other), rtol=1e-4, atol=1e-5)
    y = k(x, packed, b, other, None)                    # no buffer: a new result each call
    assert y is not out
    torch.testing.assert_close(y, _conv_ref(x, w, b, stride, pad, groups, "relu6", other), rtol=1e-4, atol=1e-5)
    xn = x.contiguous()                                 # NCHW memory: converted, not kept
    torch.testing.assert_close(k(xn, packed, b, other, out), _conv_ref(x, w, b, stride, pad, groups, "relu6", other),
                               rtol=1e-4, atol=1e-5)


class _InvertedResidual(nn.Module):
    """1 x 1 expansion + act, depthwise k x k (stride s) + act, 1 x 1 projection (+ the input)."""

    def __init__(self, c: int, e: int, co: int, k: int, s: int, act: nn.Module) -> None:
        super().__init__()
        self.expand = nn.Conv2d(c, e, 1)
        self.dw = nn.Conv2d(e, e, k, stride=s, padding=k // 2, groups=e)
        self.project = nn.Conv2d(e, co, 1)
        self.act = act
        self.residual = s == 1 and c == co

    def forward(self, x):
        h = self.project(self.act(self.dw(self.act(self.expand(x)))))
        return h + x if self.residual else h


class _Net(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 13, 3, stride=2, padding=1)
        self.blocks = nn.Sequential(_InvertedResidual(13, 37, 13, 3, 1, act), _InvertedResidual(13, 40, 24, 5, 2, act),
                                    _InvertedResidual(24, 72, 24, 3, 1, act), _InvertedResidual(24, 72, 40, 3, 2, act),
                                    _InvertedResidual(40, 120, 40, 3, 1, act))

    def forward(self, x):
        return self.blocks(F.relu6(self.stem(x)))


@pytest.mark.parametrize("act", [nn.ReLU6(), nn.SiLU()], ids=["relu6", "silu"])
def test_inverted_residual_blocks_with_measuring_on_give_eagers_results(measuring, act):
    torch.manual_seed(0)
    m = _Net(act).eval()
    x = torch.randn(2, 3, 15, 13)            # odd sizes: 8 x 7, then 4 x 4, then 2 x 2 maps
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce")
    prog = CompiledProgram(g, freeze=True)
    convs = [n for n in g.nodes if n.op == "conv2d_pointwise"]
    assert convs and all(library.writes_into(n) for n in convs)
    with torch.inference_mode():
        for _ in range(4):
            x = torch.randn(2, 3, 15, 13)
            want = m.double()(x.double()).float()
            m.float()
            got = prog([x])[0]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert prog.kernel_choices()


def test_a_1x1_map_block_with_measuring_on(measuring):
    torch.manual_seed(1)
    m = _InvertedResidual(19, 57, 19, 3, 1, nn.ReLU6()).eval()
    g = partita.optimize(partita.import_torch(m, (torch.randn(3, 19, 1, 1),)), "canonicalize,fuse-library,fuse-kernels,cse,dce")
    prog = CompiledProgram(g, freeze=True)
    with torch.inference_mode():
        for _ in range(4):
            x = torch.randn(3, 19, 1, 1)
            torch.testing.assert_close(prog([x])[0], m.double()(x.double()).float(), rtol=1e-4, atol=1e-4)
            m.float()


@pytest.mark.parametrize("shape", [(4, 3, 32, 32), (2, 3, 15, 13), (1, 2, 5, 5), (3, 4, 7, 9), (2, 3, 4, 4), (1, 3, 1, 3)])
def test_the_generated_nhwc_copy_equals_atens(shape):
    torch.manual_seed(0)
    x = torch.randn(shape)
    k = NhwcCopy(shape)
    for _ in range(2):
        y = k(x)
        assert y.is_contiguous(memory_format=CL)
        assert torch.equal(y, x.contiguous(memory_format=CL))
        x = torch.randn(shape)


def test_what_the_nhwc_copy_takes():
    assert takes(torch.randn(2, 3, 8, 8))
    assert not takes(torch.randn(2, 3, 8, 8).contiguous(memory_format=CL))   # channels-last already
    assert not takes(torch.randn(2, 8, 8, 8))                                # more than MAX_CHANNELS
    assert not takes(torch.randn(2, 3, 8, 8, dtype=torch.float64))
    assert not takes(torch.randn(2, 3, 8, 16)[..., ::2])                     # not contiguous


@pytest.mark.parametrize("stride", [1, 2])
def test_a_stem_on_an_nchw_image_converts_it_with_the_generated_copy(stride):
    torch.manual_seed(2)
    xs, ws = (3, 3, 17, 11), (16, 3, 3, 3)
    k = PreparedConv(xs, ws, [stride, stride], [1, 1], "silu")
    w, b = torch.randn(ws), torch.randn(16)
    packed = k.pack(w)
    out = torch.empty(k.shape).contiguous(memory_format=CL)
    for _ in range(3):
        x = torch.randn(xs)                       # NCHW, as a user's image comes
        torch.testing.assert_close(k(x, packed, b, None, out), _conv_ref(x, w, b, [stride, stride], [1, 1], 1, "silu"),
                                   rtol=1e-4, atol=1e-5)
    assert k.to_cl.copy is not None
