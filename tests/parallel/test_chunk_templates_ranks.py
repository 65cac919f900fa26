"""Only the distinct pp ranks built (``build_pipeline(..., distinct=True)``, Pipeline.alike):
with ``unroll=False`` the driver copies the alike ranks' templates, and every template, its
sections and the simulated step must be what building every rank gives."""

from __future__ import annotations

import pytest

import partita
from partita.cluster.hardware import load_cluster
from partita.cluster.simulator import simulate
from partita.ir.placement import Placement
from partita.ir.printer import print_graph
from partita.parallel.pipeline import driver

CASES = [
    dict(mesh="pp=4,dp=2", strategy="pp+dp", schedule="1f1b", virtual_stages=1, microbatches=4),
    dict(mesh="pp=4,dp=2", strategy="pp+dp", schedule="interleaved", virtual_stages=2, microbatches=4),
    dict(mesh="pp=4,dp=2", strategy="pp+dp", schedule="interleaved", virtual_stages=4, microbatches=4),
    dict(mesh="pp=4,dp=2", strategy="pp+zero1", schedule="interleaved", virtual_stages=2, microbatches=4),
    dict(mesh="pp=4,dp=2,tp=2", strategy="pp+dp+megatron+sp", schedule="1f1b", virtual_stages=1, microbatches=4),
    dict(mesh="pp=4,dp=2", strategy="pp+dp", schedule="zero-bubble", virtual_stages=1, microbatches=4),
]


def _step(tied: bool = True, layers: int = 8) -> partita.Graph:
    """GPT-2 (its token embedding tied to the head) or, untied, Llama."""
    if tied:
        fwd = partita.models.gpt(layers=layers, hidden=32, heads=4, seq=8, vocab=64, batch=16, dtype="f32")
    else:
        fwd = partita.models.llama(layers=layers, hidden=32, heads=4, seq=8, vocab=64, batch=16, dtype="f32")
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")


def _every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """build_pipeline builds every rank, as before ``distinct``."""
    real = driver.build_pipeline

    def every(*a, **kw):
        kw["distinct"] = False
        return real(*a, **kw)

    monkeypatch.setattr(driver, "build_pipeline", every)


def _texts(prog) -> list[tuple]:
    out = []
    for t in prog.templates:
        order = {n: i for i, n in enumerate(t.local.nodes)}
        secs = sorted((order[n], k) for n, k in t.sections.items() if n in order)
        out.append((t.rank, print_graph(t.local), tuple(secs), sorted(t.chunk_grads), sorted(t.acc_values)))
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['strategy']}-{c['schedule']}-v{c['virtual_stages']}")
def test_distinct_ranks_give_every_rank_s_template(case, monkeypatch):
    layers = 4 * case["virtual_stages"] if case["virtual_stages"] > 2 else 8
    fast = partita.parallelize(_step(layers=layers), unroll=False, **case)
    assert fast.pipeline.alike                    # the middle ranks were not built
    assert len(fast.pipeline.ranks) + len(fast.pipeline.alike) == fast.pipeline.schedule.stages
    _every_rank(monkeypatch)
    slow = partita.parallelize(_step(layers=layers), unroll=False, **case)
    assert not slow.pipeline.alike
    assert _texts(fast) == _texts(slow)
    cl = load_cluster("selene").with_nodes(2)
    assert simulate(fast, cl, trace=False).step_time == simulate(slow, cl, trace=False).step_time


def test_untied_first_and_last_ranks(monkeypatch):
    case = dict(mesh="pp=4,dp=2", strategy="pp+dp", schedule="interleaved", virtual_stages=2, microbatches=4)
    fast = partita.parallelize(_step(tied=False), unroll=False, **case)
    assert fast.pipeline.alike == {2: 1}
    _every_rank(monkeypatch)
    slow = partita.parallelize(_step(tied=False), unroll=False, **case)
    assert _texts(fast) == _texts(slow)


def test_unrolled_and_annotated_pipelines_build_every_rank():
    step = _step()
    prog = partita.parallelize(step, "pp=4,dp=2", "pp+dp", microbatches=4)
    assert not prog.pipeline.alike and len(prog.pipeline.ranks) == 4
    w = next(str(v.name) for v in step.inputs if v.role == "param")
    ins = {str(v.name): v for v in step.inputs}
    w = next(nm for nm, v in ins.items() if v.role == "param")
    ann = partita.parallelize(step, "pp=4,dp=2", "pp+dp", microbatches=4, unroll=False,
                              annotations={w: Placement.replicated(ins[w].type.rank)})
    assert not ann.pipeline.alike
