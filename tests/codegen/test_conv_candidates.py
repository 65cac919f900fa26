"""The generated direct convolution as a candidate of the measured choice (codegen/library.py,
codegen/choose.py) on few output channels, where its padded tile keeps the rules on oneDNN:
with measuring on it is timed against oneDNN and ATen (oneDNN the default a candidate must
beat) and, whichever wins, the program gives torch's results on the small CNN shapes (the 7 x 7
stride-2 stem on 3 channels, 3 x 3 and 1 x 1 on 8 and 16 channels); with measuring off it is
not even prepared."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.codegen import CompiledProgram, choose, library
from partita.codegen import conv as K


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Measuring on, with a choice cache of this test's own."""
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "measure")
    monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path / "cache"))
    choose.clear(disk=False)
    yield
    choose.clear(disk=False)


class _Small(nn.Module):
    """A ResNet-like stem (3 -> 16, 7 x 7, stride 2) and 3 x 3 / 1 x 1 convolutions on 16 and 8
    channels."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 7, stride=2, padding=3)
        self.c3 = nn.Conv2d(16, 16, 3, padding=1)
        self.c1 = nn.Conv2d(16, 8, 1)
        self.c8 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = torch.relu(self.c3(h)) + h
        return self.c8(torch.relu(self.c1(h)))


def _program():
    torch.manual_seed(0)
    m = _Small().eval()
    x = torch.randn(4, 3, 32, 32)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,cse,dce")
    with torch.inference_mode():
        want = m.double()(x.double()).float()
    return CompiledProgram(g), x, want


@pytest.mark.parametrize("shape", [((4, 3, 32, 32), (16, 3, 7, 7), (2, 2), (3, 3)),
                                   ((4, 16, 8, 8), (16, 16, 3, 3), (1, 1), (1, 1)),
                                   ((4, 16, 8, 8), (8, 16, 1, 1), (1, 1), (0, 0)),
                                   ((3, 8, 9, 7), (8, 8, 3, 3), (2, 1), (1, 0))])
def test_the_padded_tile_gives_torchs_results(shape):
    xs, ws, stride, padding = shape
    assert K.supported(xs, ws, list(stride), list(padding), [1, 1], 1, candidate=True) == ""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(xs, generator=g).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(ws, generator=g), torch.randn(ws[0], generator=g)
    pc = K.PreparedConv(xs, ws, list(stride), list(padding), "relu")
    want = torch.relu(F.conv2d(x.double(), w.double(), b.double(), stride=stride, padding=padding))
    assert float((pc(x, pc.pack(w), b).double() - want).abs().max()) < 1e-5 * max(1.0, float(want.abs().max()))


@pytest.mark.parametrize("winner", ["generated", "onednn", "aten"])
def test_small_channel_convolutions_measure_the_generated_kernel(measuring, monkeypatch, winner):
    if not library._generated_gemm():
        pytest.skip("no generated code on this machine")

    def rigged(cands, clock=None, rounds=None):
        for fn in cands.values():
            fn()
        return {k: (1.0 if k == winner else 5.0) for k in cands}

    monkeypatch.setattr(choose, "measure", rigged)
    prog, x, want = _program()
    for _ in range(4):
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-4)
    made = prog.kernel_choices()
    assert len(made) == 4 and all(set(c.micros) == {"generated", "onednn", "aten"} for c in made)
    assert all(c.picked == winner for c in made)


def test_a_tie_stays_on_the_kernel_the_rules_prefer(measuring, monkeypatch):
    """Every candidate timed alike: each node keeps its rules' kernel (oneDNN where the padded
    tile would waste lanes: on 16 lanes (AVX-512) every one of these; on 8 lanes (AVX2) the
    16-channel outputs fill whole vectors and the rules take the generated kernel there)."""
    if not library._generated_gemm():
        pytest.skip("no generated code on this machine")
    monkeypatch.setattr(choose, "measure", lambda cands, clock=None, rounds=None: {k: 1.0 for k in cands})
    defaults: dict[str, str | None] = {}
    inner = choose.choose

    def recording(key, candidates, **kw):
        defaults[key] = kw.get("default")
        return inner(key, candidates, **kw)

    monkeypatch.setattr(choose, "choose", recording)
    prog, x, want = _program()
    for _ in range(3):
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-4)
    made = prog.kernel_choices()
    assert len(made) == 4 and all(defaults.get(c.key) for c in made)
    assert all(c.picked == defaults[c.key] for c in made)


def test_without_measuring_the_rules_keep_small_channels_on_onednn(monkeypatch):
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "off")
    choose.clear(disk=False)
    prog, x, want = _program()
    before = library.packed_weight_stats()["generated_conv_calls"]
    for _ in range(3):
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-4)
    assert prog.kernel_choices() == []
    if K.vector_width() >= 16:   # every convolution here pads the 32-wide tile
        assert library.packed_weight_stats()["generated_conv_calls"] == before
