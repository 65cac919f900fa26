"""Propagation's memo of its choices (``choose`` by ``choice_key``) and the first of two runs
that places the values only (``propagate(..., resolve=False)``): the per-rank programs and
pipeline templates must be what pricing every conflicting node afresh gives."""

from __future__ import annotations

import gc

import pytest

import partita
from partita.ir.placement import Placement
from partita.ir.printer import print_graph
from partita.parallel import propagate as propagate_module
from partita.passes.split_projections import split_projections

CASES = [
    dict(mesh="dp=2,tp=2", strategy="dp+megatron+sp"),
    dict(mesh="dp=2,tp=2", strategy="zero3+megatron"),
    dict(mesh="pp=2,dp=2", strategy="pp+zero1", microbatches=4, schedule="interleaved", virtual_stages=2,
         unroll=False),
    dict(mesh="pp=2,dp=2,tp=2", strategy="pp+zero1+megatron+sp", microbatches=4, schedule="interleaved",
         virtual_stages=2, unroll=False),
    dict(mesh="pp=2,dp=2,tp=2", strategy="pp+dp+megatron", microbatches=4),
]


def _texts(case: dict, recompute: str, llama: bool) -> list[str]:
    """The printed per-rank programs (or, with unroll=False, the templates) of ``case``."""
    model = partita.models.llama if llama else partita.models.gpt
    fwd = model(layers=4, hidden=32, heads=4, seq=8, vocab=64, batch=16, dtype="f32")
    if "megatron" in case["strategy"]:
        split_projections(fwd)
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", recompute=recompute)
    opts = {k: v for k, v in case.items() if k not in ("mesh", "strategy")}
    prog = partita.parallelize(step, case["mesh"], case["strategy"], **opts)
    if getattr(prog, "templates", None):
        return [print_graph(t.local) + repr(sorted(map(str, t.sections))) for t in prog.templates]
    graphs = prog.rank_graphs() if hasattr(prog, "rank_graphs") else [prog.local]
    return [print_graph(g) for g in graphs]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['mesh']} {c['strategy']}")
@pytest.mark.parametrize("recompute,llama", [("none", False), ("selective", True)])
def test_memoized_choices_give_the_same_programs(case: dict, recompute: str, llama: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    memo = _texts(case, recompute, llama)
    monkeypatch.setattr(propagate_module, "MEMOIZE_CHOICES", False)
    fresh = _texts(case, recompute, llama)
    assert memo == fresh


def test_placing_only_leaves_the_placements_and_reports_no_reshards() -> None:
    fwd = partita.models.gpt(layers=2, hidden=32, heads=4, seq=8, vocab=64, batch=4, dtype="f32")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    placed = {}
    for resolve in (True, False):
        g = step.clone()
        for v in g.inputs:
            v.placement = None
        g.inputs[0].placement = Placement.replicated(g.inputs[0].type.rank)
        rep = propagate_module.propagate(g, "dp=2", resolve=resolve)
        placed[resolve] = rep.placements
        if not resolve:
            assert not rep.reshards and not rep.replicated
    assert placed[True] == placed[False]


def test_planning_restores_the_collector() -> None:
    from partita.planning.planner import cyclic_gc_paused

    for start in (True, False):
        (gc.enable if start else gc.disable)()
        with cyclic_gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == start
    gc.enable()


def test_copied_templates_report_the_memory_of_their_source() -> None:
    from partita.parallel.pipeline.pipeline_report import build_pipeline_plan

    fwd = partita.models.gpt(layers=8, hidden=32, heads=4, seq=8, vocab=64, batch=16, dtype="f32")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    prog = partita.parallelize(step, "pp=4,dp=2", "pp+dp", microbatches=4, schedule="interleaved",
                               virtual_stages=2, unroll=False)
    assert prog.copied_from, "the middle pp ranks' templates are copies"
    reused = prog.plan.to_dict()
    prog.copied_from = {}
    each = build_pipeline_plan(prog).to_dict()
    reused.pop("timings_s")
    each.pop("timings_s")
    assert each == reused
