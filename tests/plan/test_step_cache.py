"""The planner's Pricer keeps one StepCache (partita/parallel/pipeline/build.py) across its
candidates: a step's forward section and microbatch graph are derived once per step and
microbatch count, and every candidate's priced step equals what a fresh Pricer (nothing
shared) gives, to the last digit; the cached graphs are not changed by the pipelines that
read them."""

from __future__ import annotations

import partita
from partita.cluster.hardware import load_cluster
from partita.ir.printer import print_graph
from partita.parallel.pipeline import build
from partita.planning import Plan
from partita.planning.search import Pricer

OPTIONS = {"loss": "cross_entropy", "optimizer": "adamw"}


def gpt8() -> partita.Graph:
    return partita.models.gpt(layers=8, hidden=64, heads=4, seq=16, vocab=128, batch=16, dtype="f32")


# Four microbatches but the last: the first three share the microbatch graph.
PLANS = [Plan(mesh="pp=2,dp=4", strategy="pp+dp", microbatches=4, schedule="interleaved", virtual_stages=2, devices=8),
         Plan(mesh="pp=2,dp=2,tp=2", strategy="pp+zero1+megatron+sp", microbatches=4, schedule="interleaved",
              virtual_stages=4, devices=8),
         Plan(mesh="pp=4,dp=2", strategy="pp+dp", microbatches=4, schedule="1f1b", devices=8),
         Plan(mesh="pp=2,dp=4", strategy="pp+zero1", microbatches=2, schedule="1f1b", devices=8)]


def test_each_candidate_priced_with_the_step_cache_as_alone():
    node = load_cluster("selene").with_nodes(1)
    pricer = Pricer(gpt8(), node, False, OPTIONS)
    shared = [pricer.price(p)[0] for p in PLANS]
    assert pricer.built.hits >= 5          # three forwards and two microbatch graphs handed over again
    alone = [Pricer(gpt8(), node, False, OPTIONS).price(p)[0] for p in PLANS]
    assert shared == alone


def test_the_cached_graphs_are_not_changed_by_their_readers():
    node = load_cluster("selene").with_nodes(1)
    pricer = Pricer(gpt8(), node, False, OPTIONS)
    pricer.price(PLANS[0])
    (_step, fwd, _training), = pricer.built.forwards.values()
    (_step2, mbg), = pricer.built.micro.values()
    before = (print_graph(fwd), print_graph(mbg.graph))
    for p in PLANS[1:]:
        pricer.price(p)
    assert (print_graph(fwd), print_graph(mbg.graph)) == before


def test_a_planner_chooses_what_it_chose_without_the_step_cache(monkeypatch):
    fwd = gpt8()
    node = load_cluster("selene").with_nodes(1)
    a = partita.plan(fwd, node, devices=8, price=3)
    monkeypatch.setattr(build.StepCache, "forward", lambda self, step: build.forward_of(step))
    monkeypatch.setattr(build.StepCache, "microbatch",
                        lambda self, step, f, m, training: build.microbatch_graph(f, m, training))
    b = partita.plan(fwd, node, devices=8, price=3)
    assert a.describe() == b.describe()
    assert a.step_time == b.step_time
    assert [r["step_s"] for r in a.report["next"]] == [r["step_s"] for r in b.report["next"]]
