"""Linear layers measure the generated GEMM against ATen's addmm (codegen/library.py's
``LinearChoice`` through codegen/choose.py): a layer in the candidate band and one above the
GEMM's size rule each record one choice, give eager's results whichever kernel wins (into the
memory plan's arena), and keep the choice in the disk cache; with measuring off nothing is
measured and the small layer stays on ATen."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import partita
from partita.codegen import CompiledProgram, choose, library


class _Block(nn.Module):
    """A projection in the candidate band ([32, 64] x [64, 64], 262 KFLOP), reshaped as heads,
    and an MLP above the GEMM's size rule ([32, 64] x [64, 256], relu; [32, 256] x [256, 64])."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(64, 64)
        self.up = nn.Linear(64, 256)
        self.down = nn.Linear(256, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x).reshape(4, 8, 4, 16).transpose(1, 2)
        h = self.down(torch.relu(self.up(x)))
        return q.transpose(1, 2).reshape(4, 8, 64) + h


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Measuring on, with a choice cache of this test's own."""
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "measure")
    monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path / "cache"))
    choose.clear(disk=False)
    yield
    choose.clear(disk=False)


def _run(prog: CompiledProgram, m: nn.Module, calls: int = 3) -> None:
    with torch.no_grad():
        for _ in range(calls):
            x = torch.randn(4, 8, 64)
            torch.testing.assert_close(prog([x])[0], m(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("winner", ["generated", "aten"])
def test_each_linear_layer_measures_its_kernels_and_matches_eager(measuring, monkeypatch, winner):
    torch.manual_seed(0)
    m = _Block().eval()
    loser = "aten" if winner == "generated" else "generated"
    # a deterministic measurement: the winner 1 us, the loser 10 us
    monkeypatch.setattr(choose, "measure", lambda cands, **kw: {winner: 1.0, loser: 10.0})
    g = partita.import_torch(m, (torch.randn(4, 8, 64),))
    prog = CompiledProgram(g, freeze=True)
    before = library.packed_weight_stats()
    _run(prog, m)
    after = library.packed_weight_stats()
    assert after[f"linear_{winner}"] - before[f"linear_{winner}"] == 3
    picked = [c for c in choose.choices() if c.key.startswith("linear_pointwise")]
    assert len(picked) == 3 and {c.picked for c in picked} == {winner}
    assert "[32, 64] x [64, 64], none): " + winner in choose.report()
    # the program's own report lists them (CompiledProgram.kernel_choices)
    assert sorted(c.key for c in prog.kernel_choices()) == sorted(c.key for c in picked)
    # a second program takes the choices from the disk cache, without measuring
    choose.clear(disk=False)
    monkeypatch.setattr(choose, "measure", lambda cands, **kw: pytest.fail("measured again"))
    prog2 = CompiledProgram(partita.import_torch(m, (torch.randn(4, 8, 64),)), freeze=True)
    _run(prog2, m)
    again = [c for c in choose.choices() if c.key.startswith("linear_pointwise")]
    assert len(again) == 3 and all(c.cached and c.picked == winner for c in again)


def test_without_measuring_the_small_layer_stays_on_aten(monkeypatch):
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "off")
    choose.clear(disk=False)
    torch.manual_seed(0)
    m = _Block().eval()
    prog = CompiledProgram(partita.import_torch(m, (torch.randn(4, 8, 64),)), freeze=True)
    _run(prog, m)
    assert not [c for c in choose.choices() if c.key.startswith("linear_pointwise")]
    assert library.LINEAR_CANDIDATE_MIN_FLOPS <= 2 * 32 * 64 * 64 < library.GEMM_MIN_FLOPS


def test_the_aten_run_matches_addmm_with_each_activation():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 8), torch.randn(8, 5), torch.randn(5)
    for unary, act in (("none", lambda t: t), ("relu", torch.relu), ("silu", torch.nn.functional.silu),
                       ("gelu", torch.nn.functional.gelu)):
        want = act(torch.addmm(b, x.reshape(6, 8), w)).reshape(2, 3, 5)
        for out in (None, torch.empty(2, 3, 5)):
            got = library.aten_linear_run((2, 3, 5), 8, True, unary, out)(x, w, b)
            torch.testing.assert_close(got, want)
            got = library.aten_linear_run((2, 3, 5), 8, False, unary, out)(x, w.t().contiguous(), None)
            torch.testing.assert_close(got, act(x.reshape(6, 8) @ w).reshape(2, 3, 5))
