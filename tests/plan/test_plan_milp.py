"""The planner with the per-op sharding integer program (partita/planning/search.py
``milp_variant``, planner.py ``price_candidate``): a plan carries the program's placements
through JSON, ``parallelize(step, plan=...)`` applies them and the result equals one device's,
pricing both never returns a slower plan than the words alone, and the command's option."""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.cli import main
from partita.cluster.hardware import load_cluster
from partita.models.gpt import gpt
from partita.models.llama import llama
from partita.planning.plan import Plan
from partita.planning.search import Pricer, milp_variant
from partita.planning.shape import PlanError

# sgd: the runs compare the updated weights too, which adamw's random moments make ill-conditioned.
OPTIONS = {"loss": "cross_entropy", "optimizer": "sgd"}


def feed_of(step, seed: int = 0):
    rng = np.random.default_rng(seed)
    feed = {}
    for v in step.inputs:
        t = v.type
        if str(t.dtype).startswith("i"):
            feed[v.name] = rng.integers(1, 8, size=t.shape).astype(np.int64)
        else:
            x = 0.1 * rng.standard_normal(t.shape)
            feed[v.name] = (np.abs(x) if v.role == "state" else x).astype(np.float32)   # exp_avg_sq >= 0
    return feed


def milp_plan(g, mesh: str, words: str) -> Plan:
    pricer = Pricer(g, load_cluster("selene"), False, OPTIONS)
    step, choice = pricer.sharding(2, "none")
    p = Plan(mesh=mesh, strategy=words, devices=4 if "dp" in mesh else 2, cluster="selene")
    return milp_variant(p, step, choice)


@pytest.mark.parametrize("mesh,words", [("tp=2", "megatron"), ("dp=2,tp=2", "dp+megatron")])
def test_plan_with_the_programs_placements_runs_as_one_device(mesh, words):
    g = gpt(2, 32, 4, 8, 64, batch=4, dtype="f32")
    q = Plan.from_json(milp_plan(g, mesh, words).to_json())
    assert q.sharding == "milp" and q.annotations and "megatron" not in q.strategy
    assert any("#" in k for k in q.annotations)
    step = partita.training_step(g, recompute=q.recompute, **OPTIONS)
    named = q.annotations_for(step)
    assert len(named) > len(q.annotations)          # a pattern names the value of every layer
    feed = feed_of(step)
    want = partita.run(step, feed)
    prog = partita.parallelize(step, plan=q)
    weights = {v.name: feed[v.name] for v in step.inputs if v.role == "param"}
    got = prog.simulate({k: a for k, a in feed.items() if k not in weights}, weights)
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5, err_msg=f"output {i}")


def test_json_round_trip_and_bad_annotations():
    p = Plan(mesh="tp=2", strategy="", sharding="milp", annotations={"transformer.h.#.mlp.c_fc.weight": "[-, tp]"})
    q = Plan.from_json(p.to_json())
    assert q == p and q.describe().endswith("placements=milp")
    assert Plan(mesh="tp=2", strategy="megatron").annotations_for(gpt(1, 32, 4, 8, 64)) == {}
    text = p.to_json().replace('"[-, tp]"', "3")
    with pytest.raises(PlanError, match="annotations"):
        Plan.from_json(text)
    with pytest.raises(PlanError, match="sharding"):
        Plan.from_json(p.to_json().replace('"milp"', '"ilp"'))
    with pytest.raises(PlanError, match="sharding="):
        partita.plan(gpt(1, 32, 4, 8, 64), "selene", devices=2, sharding="ilp")


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_pricing_both_is_never_slower(model):
    if model == "gpt":
        g = gpt(4, 512, 8, 256, 1024, batch=16, dtype="bf16")
    else:
        g = llama(4, 512, 8, 256, 1024, kv_heads=4, batch=16, dtype="bf16")
    words = partita.plan(g, "selene", devices=8, sharding="words")
    both = partita.plan(g, "selene", devices=8, sharding="both")
    assert both.step_time <= words.step_time * (1 + 1e-9)
    assert both.memory <= both.memory_cap
    notes = both.report["sharding"]
    assert notes and all(n["kept"] in ("words", "milp") and n["lp_bound_s"] <= n["objective_s"] * (1 + 1e-9)
                         for n in notes)
    assert not words.report["sharding"]


def test_plan_command_sharding_option(tmp_path, capsys):
    g = gpt(2, 256, 4, 64, 256, batch=8, dtype="bf16")
    model = tmp_path / "gpt.pir"
    partita.save(g, model)
    out = tmp_path / "plan.json"
    assert main(["plan", str(model), "--nodes", "1", "--devices", "4", "--price", "3", "--sharding", "milp",
                 "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "chosen: " in text
    p = partita.Plan.from_json(out.read_text())
    assert p.devices == 4 and p.step_time > 0
    assert main(["plan", str(model), "--devices", "4", "--sharding", "ilp"]) != 0
