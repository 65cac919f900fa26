"""Steps that declared they write their one result into a given buffer (arena.declare_into):
the generated pad, max pool, global mean and channels-last GroupNorm, and the ATen ops with an
out= form. Their results are planned, never overlap a live buffer, equal the unplanned program
on odd shapes, and a result the caller keeps is never written over by the next call."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import partita
from partita.codegen import CompiledProgram
from partita.codegen.arena import OUT_FORMS, PLANNED_OPS, takes_buffer

PIPELINE = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"


def _no_overlap(prog: CompiledProgram) -> None:
    planned = prog.memory_plan.planned()
    for i, a in enumerate(planned):
        for b in planned[i + 1:]:
            if a.first <= b.last and b.first <= a.last:
                assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset, (a, b)
    outs = set(prog.graph.outputs)
    assert not any(b.value in outs for b in planned)


def _into_planned(prog: CompiledProgram) -> set[str]:
    """The ops outside PLANNED_OPS whose result the plan placed in the arena."""
    return {b.value.producer.op for b in prog.memory_plan.planned() if b.value.producer.op not in PLANNED_OPS}


class PreactCnn(nn.Module):
    """A pre-activation block on odd sizes: conv, pad, max pool, GroupNorm + ReLU, conv, mean."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.gn = nn.Conv2d(3, 16, 3, stride=2), nn.GroupNorm(4, 16)
        self.conv = nn.Conv2d(16, 24, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(F.pad(self.stem(x), (1, 1, 1, 1)), 3, 2)
        y = self.conv(F.relu(self.gn(y)))
        return y.mean((2, 3)) * 2.0


def test_cnn_steps_write_into_the_plan_and_stay_right_call_after_call() -> None:
    torch.manual_seed(0)
    m = PreactCnn().eval()
    x = torch.randn(3, 3, 29, 27)
    g = partita.optimize(partita.import_torch(m, (x,)), PIPELINE)
    prog, plain = CompiledProgram(g, freeze=True), CompiledProgram(g, freeze=True, plan_memory=False)
    _no_overlap(prog)
    assert {"pad", "max_pool2d", "group_norm"} <= _into_planned(prog), prog.memory_plan.text()
    kept = []
    for seed in range(3):
        xi = torch.randn(3, 3, 29, 27, generator=torch.Generator().manual_seed(seed))
        got = prog([xi])[0]
        with torch.no_grad():
            torch.testing.assert_close(got, plain([xi])[0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got, m(xi), rtol=1e-4, atol=1e-4)
        kept.append((got, got.clone()))
    assert all(torch.equal(a, b) for a, b in kept), "a later call wrote over a result the caller kept"


class Mixed(nn.Module):
    """Embedding, broadcast add, where and maximum between linear layers (odd sizes)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.a, self.b = nn.Embedding(11, 13), nn.Linear(13, 13), nn.Linear(13, 7)
        self.bias = nn.Parameter(torch.randn(13))

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        e = self.emb(ids)
        h = self.a(e + x)
        h = torch.where(h > 0, h, x)
        return self.b(torch.maximum(h, self.bias))


def test_aten_out_forms_write_into_the_plan_and_stay_right() -> None:
    torch.manual_seed(0)
    m = Mixed().eval()
    ids, x = torch.randint(0, 11, (3, 5)), torch.randn(3, 5, 13)
    g = partita.optimize(partita.import_torch(m, (ids, x)), PIPELINE)
    prog, plain = CompiledProgram(g, freeze=True), CompiledProgram(g, freeze=True, plan_memory=False)
    _no_overlap(prog)
    assert _into_planned(prog) & set(OUT_FORMS), prog.memory_plan.text()
    kept = []
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        ii, xi = torch.randint(0, 11, (3, 5), generator=gen), torch.randn(3, 5, 13, generator=gen)
        got = prog([ii, xi])[0]
        torch.testing.assert_close(got, plain([ii, xi])[0], rtol=0, atol=0)
        with torch.no_grad():
            torch.testing.assert_close(got, m(ii, xi), rtol=1e-5, atol=1e-5)
        kept.append((got, got.clone()))
    assert all(torch.equal(a, b) for a, b in kept)
    # an input in other memory: the step takes its own path and allocates, still right
    xt = torch.randn(3, 13, 5).transpose(1, 2)
    torch.testing.assert_close(prog([ids, xt])[0], plain([ids, xt])[0], rtol=0, atol=0)


def test_a_declared_step_carries_write_into() -> None:
    from partita.codegen.arena import declare_into

    def step(args: list, attrs: dict) -> torch.Tensor:
        return args[0] + 1

    assert not takes_buffer(step)
    assert takes_buffer(declare_into(step, lambda out: True))
