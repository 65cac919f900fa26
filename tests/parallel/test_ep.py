"""``ep``, expert parallelism (partita/parallel/strategies/ep.py), on a small MoE language model.

Every plan is checked like the other strategies: the simulated mesh (exact collectives)
against the single-device training step, loss, gradients and updated params. The plans are
checked for what the strategy promises: the experts split, the tokens moved with all_to_all
(two per layer forward, two backward), no gather of the tokens or the experts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import partita
from partita.parallel.strategy import StrategyError, parallelize

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from moe_helpers import MoELM  # noqa: E402

_CACHE: dict = {}


def _step(groups: int = 4, optimizer: str = "sgd"):
    key = (groups, optimizer)
    if key not in _CACHE:
        torch.manual_seed(0)
        model = MoELM(groups=groups).eval()
        ids, target = torch.randint(0, 32, (4, 6)), torch.randint(0, 32, (4, 6))
        fwd = partita.import_torch(model, (ids,))
        kw = {"lr": 0.1} if optimizer == "sgd" else {"eps": 1e-6}
        step = partita.training_step(fwd, loss="cross_entropy", optimizer=optimizer, **kw)
        _CACHE[key] = step, {"ids": ids.numpy(), "target": target.numpy()}
    return _CACHE[key]


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _collectives(prog) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for n in prog.local.nodes:
        if n.op in ("all_to_all", "all_gather", "all_reduce", "reduce_scatter"):
            key = (n.op, n.attrs["axis"])
            out[key] = out.get(key, 0) + 1
    return out


@pytest.mark.parametrize("mesh,strategy", [("ep=2", "ep"), ("ep=4", "ep"), ("dp=2,ep=2", "dp+ep"),
                                           ("ep=2,dp=2", "dp+ep"), ("ep=2,tp=2", "ep+megatron")])
def test_expert_parallel_step_matches_one_device(mesh, strategy):
    step, feed = _step()
    prog = parallelize(step, mesh, strategy)
    partita.verify(prog.local)
    want = partita.run(step, feed, step.weights)
    got = prog.simulate(feed, step.weights)
    for v, g, w in zip(step.outputs, got, want):
        assert _rel(g, w) <= 1e-5, f"{strategy} on {mesh}: %{v.name} differs by {_rel(g, w):.2e}"
    comm = _collectives(prog)
    # Two MoE layers: dispatch and return forward, and both again backward.
    assert comm.get(("all_to_all", "ep")) == 8, comm
    assert not any(op == "all_gather" for op, _ in comm), comm
    ep = prog.mesh.axis_size("ep")
    local = {v.name: v.type.shape for v in prog.local.inputs}
    assert local["layers.0.experts.gate_up_proj"][0] == 4 // ep
    assert local["layers.1.experts.down_proj"][0] == 4 // ep
    assert any("expert weight(s) split over 'ep'" in n for n in prog.plan.notes), prog.plan.notes


def test_expert_gradients_are_reduced_over_dp_only():
    step, _ = _step()
    comm = _collectives(parallelize(step, "dp=2,ep=2", "dp+ep"))
    assert comm[("all_reduce", "dp")] >= 1 and comm[("all_reduce", "ep")] >= 1
    prog = parallelize(step, "ep=2", "ep")
    names = {id(v): v.name for v in prog.local.inputs}
    # The bucket all-reduced over ep holds the non-expert gradients only: its size says so.
    (bucket,) = [n for n in prog.local.nodes if n.op == "all_reduce"]
    params = [v for v in step.inputs if v.role == "param"]
    dense = sum(v.type.numel for v in params if "experts" not in v.name)
    smallest_expert = min(v.type.numel for v in params if "experts" in v.name)
    assert dense <= bucket.operands[0].type.numel < dense + smallest_expert, names


def test_adamw_state_of_the_experts_is_split_too():
    step, feed = _step(optimizer="adamw")
    prog = parallelize(step, "ep=2", "ep")
    local = {v.name: v.type.shape for v in prog.local.inputs}
    moments = [n for n in local if "gate_up_proj" in n and n != "layers.0.experts.gate_up_proj"]
    assert moments and all(local[n][0] == 2 for n in moments), local
    want = partita.run(step, feed, step.weights)
    got = prog.simulate(feed, step.weights)
    assert max(_rel(g, w) for g, w in zip(got, want)) <= 1e-5


def test_expert_parallel_runs_on_gloo_processes():
    step, feed = _step()
    prog = parallelize(step, "ep=2", "ep")
    res = partita.launch(prog, 2, feed, steps=2, check=True, timeout_s=120)
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]


@pytest.mark.parametrize("mesh,strategy,groups,message", [
    ("ep=8", "ep", 8, "holds 4 experts, which the mesh axis 'ep' of size 8 does not divide"),
    ("ep=2", "ep", 3, "routes its tokens in 3 groups, which ep = 2 does not divide; import the model with "
                      "moe_groups=2"),
    ("dp=2,ep=2", "dp+ep", 2, "routes its tokens in 2 groups, which dp x ep = 4 does not divide"),
])
def test_errors_name_the_fix(mesh, strategy, groups, message):
    step, _ = _step(groups)
    with pytest.raises(StrategyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parallelize(step, mesh, strategy)


def test_a_model_without_experts_is_refused():
    from test_strategy import grads

    step, _ = grads("mlp")
    with pytest.raises(StrategyError, match="has no mixture-of-experts layer"):
        parallelize(step, "ep=2", "ep")
