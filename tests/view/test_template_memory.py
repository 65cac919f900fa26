"""Memory over the step of a pipeline built with ``unroll=False``, walked from its rank
templates (``partita.cluster.template_memory``): node for node what ``live_bytes`` gives on
the program ``unroll_local`` makes of each template, and the peak of the program
``parallelize`` unrolls; drawn on the pipeline's page and the simulation's."""

from __future__ import annotations

import dataclasses

from pathlib import Path

import pytest

import partita
from partita.cluster.memory_report import gradient_buffers, live_bytes, memory_report
from partita.cluster.template_memory import TemplateWalk, template_memory_report
from partita.parallel.pipeline.local_unroll import unroll_local
from partita.parallel.pipeline.schedule import PipelineError
from partita.view import page_data, view
from partita.view.memory import program_memory

from .browser import page_test, screenshot

CASES = [  # mesh, strategy, recomputation, pipeline options
    ("pp=2,tp=2", "pp+megatron", None, {}),
    ("pp=2,dp=2", "pp+dp", None, {"schedule": "interleaved", "virtual_stages": 2}),
    ("pp=2,tp=2", "pp+megatron", "selective", {"schedule": "interleaved", "virtual_stages": 2}),
    ("pp=2,tp=2", "pp+megatron", "full", {"schedule": "interleaved", "virtual_stages": 2}),
    ("pp=2,dp=2", "pp+dp", "full", {}),
    ("pp=4", "pp", None, {"microbatches": 8}),
]


def step_of(recompute: str | None) -> partita.Graph:
    fwd = partita.models.gpt(4, 64, 4, 16, 128, batch=8, dtype="f32")
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw",
                                 **({} if recompute is None else {"recompute": recompute}))


def programs(mesh: str, strategy: str, recompute: str | None, opts: dict) -> tuple:
    opts = {"microbatches": 4, **opts}
    step = step_of(recompute)
    return (partita.parallelize(step, mesh, strategy, unroll=False, **opts),
            partita.parallelize(step, mesh, strategy, **opts))


@pytest.fixture(scope="module", params=range(len(CASES)), ids=[f"{c[1]}-{c[2]}-{c[3].get('schedule', '1f1b')}"
                                                                for c in CASES])
def case(request):
    return programs(*CASES[request.param])


def test_the_walk_is_live_bytes_of_the_unrolled_template(case):
    """Without ordering the collectives, the walk gives what ``live_bytes`` gives on the
    program ``unroll_local`` makes of the template, point for point (a template
    ``unroll_local`` refuses, a dp stage's bucketed last rank, is skipped)."""
    prog, _ = case
    checked = 0
    for t in prog.templates:
        try:
            U = unroll_local(t.local, t.sections, t.sched, t.rank, t.items, batch=t.batch,
                             chunk_grads=t.chunk_grads, acc_values=t.acc_values, loss_share=t.loss_share,
                             finals=t.finals, mesh=prog.mesh)
        except PipelineError:
            continue
        ref = [(i, c, (live["activations and temporaries"], live["communication"], live["gradients"]))
               for i, _, c, live in live_bytes(U, gradient_buffers(U))]
        curve = TemplateWalk(t).walk(every_node=True)
        assert curve.n == len(list(U.nodes))
        assert list(zip(curve.x, curve.consts, zip(curve.act, curve.comm, curve.grads))) == ref
        a, b = memory_report(U), template_memory_report(t)
        assert (a.params, a.grads, a.optimizer, a.batch, a.peak, a.at_peak) == \
               (b.params, b.grads, b.optimizer, b.batch, b.peak, b.at_peak)
        assert b.peak_node.startswith(a.peak_node)
        checked += 1
    assert checked >= 1


def test_the_peak_is_the_unrolled_programs(case):
    """With the collectives ordered as ``parallelize`` orders them on the unrolled program,
    each pp rank's peak is that program's ``memory_report`` peak (measured: equal on every
    rank of these cases but one: the interleaved dp stage's last rank, 4 bytes under (a
    scalar the ordering keeps live a little longer in the unrolled program; docs/view.md)."""
    prog, unrolled = case
    m = program_memory(prog)
    assert [(c["rank"], c["count"]) for c in m["ranks"]] == \
           [(min(rs), len(rs)) for rs in stage_ranks(prog)]
    for p, c in enumerate(m["ranks"]):
        rep = memory_report(unrolled.stages[p].local)
        assert 0 <= rep.peak - c["peak"] <= (4 if prog.schedule.virtual > 1 and "dp" in prog.mesh.names else 0)
        assert c["base"] == {"params": rep.params, "optimizer state": rep.optimizer, "batch": rep.batch}
        tot = [sum(c["base"].values()) + sum(col[k] for col in c["cols"].values()) for k in range(len(c["x"]))]
        assert max(tot) == c["peak"]
        assert c["n"] == len(list(unrolled.stages[p].local.nodes))


def stage_ranks(prog) -> list[list[int]]:
    out: dict[int, list[int]] = {}
    for r in range(prog.mesh.size):
        out.setdefault(prog.coords(r)[0], []).append(r)
    return [out[p] for p in sorted(out)]


def test_the_simulation_page_draws_the_curves(tmp_path):
    """The page of a pipeline simulated section by section: the memory tab's curves (one per
    stage, with its ranks' count) peak where the unrolled program does, the timeline's memory
    at the peak per rank comes from them, and a simulation result that keeps its program
    draws them alone."""
    from partita.cluster import simulate

    prog, unrolled = programs(*CASES[0])
    res = simulate(prog, "selene", trace=True)
    out = Path(view(prog, tmp_path / "sim.html", sim=res))
    peaks = sorted(memory_report(st.local).peak for st in unrolled.stages)
    r = page_test(out, "memory")
    assert r["errors"] == [] and sorted(r["peaks"]) == peaks and r["ranks"] == [[0, 2], [2, 2]]
    assert r["peakLines"] == 2 and r["areas"] >= 2 * 5
    assert screenshot(out, "memory", tmp_path / "memory.png").stat().st_size > 1000
    r = page_test(out, "timeline")
    assert r["errors"] == [] and r["memory"] > 0
    d = page_data(prog, sim=res)
    assert sorted(x["memory"]["peak"] for x in d["sim"]["ranks"]) == peaks
    assert res.program is prog                 # the result keeps the program it simulated
    assert "memory" not in page_data(dataclasses.replace(res, program=None))   # without it: no curve
    alone = page_data(res)
    assert sorted(c["peak"] for c in alone["memory"]["ranks"]) == peaks
    r = page_test(Path(view(res, tmp_path / "alone.html")), "memory")
    assert r["errors"] == [] and sorted(r["peaks"]) == peaks
