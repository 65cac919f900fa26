"""A plan made by the planner runs on gloo processes and computes what one device computes:
``partita.launch(partita.parallelize(step, plan=plan), N, ...)`` and ``partita run model.pir
--plan plan.json --nproc N``; a model of few layers prices what the full one does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import partita
from partita.cli.train import synthetic_batch
from partita.cluster.hardware import load_cluster
from partita.planning import Plan, model_shape
from partita.planning.reduce import truncate_layers
from partita.planning.search import Pricer

ROOT = Path(__file__).resolve().parents[2]


def tiny(layers: int = 4) -> partita.Graph:
    return partita.models.gpt(layers=layers, hidden=32, heads=4, seq=8, vocab=64, batch=4, dtype="f32")


def weighted(fwd: partita.Graph) -> partita.Graph:
    """``fwd`` carrying random weights (partita.save writes them beside the .pir)."""
    rng = np.random.default_rng(1)
    for v in fwd.inputs:
        if v.role == "param":
            fwd.weights[str(v.name)] = (rng.standard_normal(v.type.shape) * 0.2).astype(v.type.dtype.np)
    return fwd


def test_truncated_model_is_the_model_built_with_fewer_layers():
    cut = truncate_layers(tiny(6), 2)
    assert cut is not None and cut.diff(tiny(2)) is None
    llama = partita.models.llama(layers=4, hidden=64, heads=4, kv_heads=2, seq=8, vocab=64, batch=2, dtype="f32")
    assert model_shape(truncate_layers(llama, 2)).layers == 2


def test_scaled_price_matches_the_full_simulation():
    fwd = partita.models.gpt(layers=12, hidden=256, heads=8, seq=128, vocab=512, batch=16, dtype="bf16")
    pricer = Pricer(fwd, load_cluster("selene").with_nodes(1), False,
                    {"loss": "cross_entropy", "optimizer": "adamw", "master_weights": True})
    for p in (Plan(mesh="dp=2,tp=4", strategy="dp+megatron+sp", devices=8),
              Plan(mesh="pp=2,dp=4", strategy="pp+zero1", microbatches=4, schedule="interleaved",
                   virtual_stages=2, devices=8)):
        full, _, _ = pricer.price(p)
        scaled, _, _ = pricer.price_scaled(p, model_shape(fwd))
        assert scaled == pytest.approx(full, rel=0.03), p.describe()


@pytest.fixture(scope="module")
def two_device_plan() -> Plan:
    return partita.plan(tiny(), load_cluster("selene").with_nodes(1), devices=2, price=2)


def test_launch_runs_the_plan_like_one_device(two_device_plan):
    p = two_device_plan
    fwd = tiny()
    step = p.training_step(fwd)
    rng = np.random.default_rng(0)
    batches = [synthetic_batch(step, fwd, rng, 64) for _ in range(2)]
    weights = dict(weighted(tiny()).weights.items())
    res = partita.launch(partita.parallelize(step, plan=p), 2, batches, weights=weights, check=True,
                         tolerance=1e-3, timeout_s=60)  # f32 partial sums of tp-split biases under adamw
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]


@pytest.mark.parametrize("hand", [None, "pp=2 1f1b"])
def test_cli_runs_a_plan_file(tmp_path, two_device_plan, hand):
    fwd = weighted(tiny())
    model = tmp_path / "gpt.pir"
    partita.save(fwd, model)
    p = two_device_plan if hand is None else Plan(mesh="pp=2", strategy="pp", microbatches=2, schedule="1f1b",
                                                  stages=[2, 2], recompute="selective", devices=2)
    (tmp_path / "plan.json").write_text(p.to_json())
    cmd = [sys.executable, "-m", "partita", "run", str(model), "--plan", str(tmp_path / "plan.json"), "--nproc", "2",
           "--steps", "2", "--check"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"plan {p.describe()}" in out.stdout and "check: PASS" in out.stdout


def test_cli_refuses_a_plan_with_a_mesh(tmp_path):
    model = tmp_path / "gpt.pir"
    partita.save(weighted(tiny()), model)
    (tmp_path / "plan.json").write_text(Plan(mesh="dp=2", strategy="dp", devices=2).to_json())
    cmd = [sys.executable, "-m", "partita", "run", str(model), "--plan", str(tmp_path / "plan.json"), "--mesh", "dp=2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode != 0 and "drop --mesh" in out.stderr and "Traceback" not in out.stderr
