"""Measured kernel choice (partita/codegen/choose.py): the fastest candidate is kept, ties stay
on the default, the choice is cached in the process and on disk, measuring can be turned off;
a compiled CNN's convolutions each measure their kernels once and give eager's results
whichever kernel wins (generated, oneDNN or ATen, with the memory plan's in-place residual);
``partita opt --emit choices`` prints them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import partita
from partita.codegen import CompiledProgram, choose, library


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Measuring on, with a choice cache of this test's own."""
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "measure")
    monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path / "cache"))
    choose.clear(disk=False)
    yield
    choose.clear(disk=False)


class _Clock:
    """A clock each candidate advances by its own cost: the measurement is deterministic."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def candidate(self, seconds: float, calls: list):
        def run():
            calls.append(seconds)
            self.now += seconds
        return run


def test_the_fastest_candidate_is_picked_and_cached_on_disk(measuring):
    clock, calls = _Clock(), []
    cands = {"a": clock.candidate(3e-5, calls), "b": clock.candidate(1e-5, calls), "c": clock.candidate(2e-5, calls)}
    assert choose.choose("k1", cands, where="node 1", clock=clock) == "b"
    assert len(calls) == 3 * (1 + choose.ROUNDS)         # one untimed call each, then the rounds
    made = choose.choices()[-1]
    assert (made.picked, made.cached, made.where) == ("b", False, "node 1")
    assert made.micros == pytest.approx({"a": 30.0, "b": 10.0, "c": 20.0})
    assert "b (b 10.0 us, c 20.0 us, a 30.0 us)" in choose.report()

    def never():
        raise AssertionError("a cached choice is not measured again")

    choose.clear(disk=False)                              # a new process: only the file remains
    assert choose.choose("k1", {"a": never, "b": never, "c": never}, clock=clock) == "b"
    assert choose.choices()[-1].cached
    # another key, another machine's threads, or other candidates: measured afresh
    assert choose.choose("k1", {"a": clock.candidate(1e-5, calls), "c": clock.candidate(2e-5, calls)},
                         clock=clock) == "a"


def test_a_near_tie_stays_on_the_default_and_off_never_measures(measuring, monkeypatch):
    clock, calls = _Clock(), []
    near = {"rules": clock.candidate(1.00e-5, calls), "other": clock.candidate(0.99e-5, calls)}
    assert choose.choose("tie", near, default="rules", clock=clock) == "rules"
    clear_win = {"rules": clock.candidate(1e-5, calls), "other": clock.candidate(0.5e-5, calls)}
    assert choose.choose("win", clear_win, default="rules", clock=clock) == "other"
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "off")
    n = len(calls)
    assert choose.choose("off", {"x": clock.candidate(1.0, calls), "y": clock.candidate(0.0, calls)},
                         default="x", clock=clock) == "x"
    assert len(calls) == n
    with pytest.raises(ValueError, match="not one of the candidates"):
        choose.choose("bad", {"x": lambda: None}, default="z")


class _Block(nn.Module):
    """Depthwise 3x3, pointwise 1x1 with a residual, and a plain 3x3: each convolution kind a
    user's CNN brings, the residual written in place by the memory plan."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.pw = nn.Conv2d(32, 32, 1)
        self.out = nn.Conv2d(32, 32, 3, padding=1)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = torch.relu(self.pw(torch.relu(self.dw(h))) + h)
        return self.out(h)


def _program():
    torch.manual_seed(0)
    m = _Block().eval()
    x = torch.randn(2, 3, 12, 12)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,cse,dce")
    with torch.inference_mode():
        want = m(x)
    return CompiledProgram(g), x, want


@pytest.mark.parametrize("winner", ["generated", "onednn", "aten"])
def test_every_kernel_a_convolution_may_pick_gives_eager_results(measuring, monkeypatch, winner):
    def rigged(cands, clock=None, rounds=None):
        for fn in cands.values():                     # each candidate runs, on the real arguments
            fn()
        return {k: (1.0 if k == winner else 5.0) for k in cands}

    monkeypatch.setattr(choose, "measure", rigged)
    prog, x, want = _program()
    convs = [n for n in prog.graph.nodes if n.op == "conv2d_pointwise"]
    assert len(convs) == 4 and any(n.attrs["binary"] == "add" for n in convs)
    for _ in range(4):                                # unpacked, packed and measured, then the pick
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)
    made = prog.kernel_choices()
    assert len(made) == 4                             # one choice per convolution, made once
    for c in made:
        assert c.picked == winner or (winner == "generated" and "generated" not in c.micros)
    assert any(c.picked == winner for c in made)
    assert "measured kernel choice(s)" in prog.report()


def test_a_measured_program_matches_eager_and_reports_its_choices(measuring):
    prog, x, want = _program()
    for _ in range(3):
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)
    made = prog.kernel_choices()
    assert len(made) == 4 and all(c.picked in c.micros and not c.cached for c in made)
    assert any("groups 32" in c.where for c in made)  # the depthwise one says so
    prog2, _, _ = _program()                          # the same shapes again: from the cache
    for _ in range(3):
        torch.testing.assert_close(prog2([x])[0], want, rtol=1e-4, atol=1e-5)
    assert [c.picked for c in prog2.kernel_choices()] == [c.picked for c in made]
    assert all(c.cached for c in prog2.kernel_choices())


def test_without_measuring_the_rules_run_the_generated_kernel(monkeypatch):
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "off")
    choose.clear(disk=False)
    prog, x, want = _program()
    before = library.packed_weight_stats()["generated_conv_calls"]
    for _ in range(3):
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)
    assert prog.kernel_choices() == []
    if library._generated_gemm():
        assert library.packed_weight_stats()["generated_conv_calls"] > before


def test_opt_emit_choices_prints_each_convolution(tmp_path):
    torch.manual_seed(0)
    m = _Block().eval()
    path = tmp_path / "block.pir"
    partita.save(partita.import_torch(m, (torch.randn(1, 3, 8, 8),)), path)
    env = {"PARTITA_KERNEL_CHOICE": "measure", "PARTITA_CACHE_DIR": str(tmp_path / "cache")}
    import os

    r = subprocess.run([sys.executable, "-m", "partita", "opt", str(path), "--emit", "choices"],
                       capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "4 library convolution(s), 4 measured kernel choice(s)" in r.stdout
    assert r.stdout.count(" us") >= 8                 # every candidate's time, two or more per node
    off = subprocess.run([sys.executable, "-m", "partita", "opt", str(path), "--emit", "choices"],
                         capture_output=True, text=True, env={**os.environ, "PARTITA_KERNEL_CHOICE": "off"},
                         timeout=300)
    assert off.returncode == 0 and "not measured" in off.stdout
