"""The per-op sharding integer program (partita/planning/milp.py): its choices run on the
in-process mesh equal to one device, Megatron's layout where links are fast against compute,
replicated where they are slow or the layer tiny, identical layers sharing variables."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import partita
from partita.cluster.hardware import load_cluster
from partita.models.gpt import gpt
from partita.models.llama import llama
from partita.planning.milp import shard_layer
from partita.planning.shape import PlanError

LAYER = "transformer.h.{}."
MEGATRON = {"attn.c_attn.weight.split0": "[-, tp]", "attn.c_attn.weight.split2": "[-, tp]",
            "attn.c_proj.weight": "[tp, -]", "mlp.c_fc.weight": "[-, tp]", "mlp.c_proj.weight": "[tp, -]"}


def slow_compute(factor: float):
    """selene with devices ``factor`` times slower (links as they are)."""
    cl = load_cluster("selene")
    d = cl.device
    return replace(cl, device=replace(d, peak_flops={k: v / factor for k, v in d.peak_flops.items()},
                                      memory_bandwidth=d.memory_bandwidth / factor),
                   efficiency=replace(cl.efficiency, op_overhead=0.0))


def step_of(g):
    return partita.training_step(g, loss="cross_entropy", optimizer="sgd")


def feed_of(step, seed: int = 0):
    rng = np.random.default_rng(seed)
    feed = {}
    for v in step.inputs:
        t = v.type
        if str(t.dtype).startswith("i"):
            feed[v.name] = rng.integers(0, 8, size=t.shape).astype(np.int64)
        else:
            feed[v.name] = (0.1 * rng.standard_normal(t.shape)).astype(np.float32)
    return feed


def test_megatron_where_links_are_fast_against_compute():
    step = step_of(gpt(2, 2048, 16, 1024, 1024, dtype="bf16"))
    ch = shard_layer(step, 4, "selene")
    for i in (0, 1):
        for name, want in MEGATRON.items():
            assert ch.annotations[LAYER.format(i) + name] == want, (i, name)
    assert ch.lp_bound <= ch.objective * (1 + 1e-9)
    assert "LP bound" in ch.report() and "variables" in ch.report()


def test_replicated_when_the_layer_is_tiny_or_links_slow():
    tiny = shard_layer(step_of(gpt(2, 64, 4, 16, 128, dtype="bf16")), 4, "selene")
    assert set(tiny.choices.values()) == {None}
    cl = load_cluster("selene")
    slow = replace(cl, intra_node=replace(cl.intra_node, bandwidth=cl.intra_node.bandwidth / 1e5,
                                          latency=cl.intra_node.latency * 1e4))
    ch = shard_layer(step_of(gpt(1, 2048, 16, 1024, 1024, dtype="bf16")), 4, slow)
    for name in MEGATRON:
        assert ch.annotations[LAYER.format(0) + name] == "replicated"


def test_identical_layers_share_variables():
    one = shard_layer(step_of(gpt(1, 64, 4, 16, 128, dtype="bf16")), 2, "selene")
    many = shard_layer(step_of(gpt(6, 64, 4, 16, 128, dtype="bf16")), 2, "selene")
    assert many.items > 5 * one.items // 2
    assert many.variables <= one.variables * 1.5
    assert many.variables_unshared > 4 * many.variables


def test_memory_cap_is_a_constraint():
    step = step_of(gpt(1, 256, 4, 64, 256, dtype="bf16"))
    free = shard_layer(step, 4, "selene")
    capped = shard_layer(step, 4, "selene", memory=free.memory * 0.6)
    assert capped.memory <= free.memory * 0.6 + 1 and capped.objective >= free.objective - 1e-12
    with pytest.raises(PlanError, match="fits the memory cap"):
        shard_layer(step, 4, "selene", memory=1024)


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_choice_runs_on_the_mesh_equal_to_one_device(model):
    if model == "gpt":
        g = gpt(1, 32, 4, 8, 64, batch=2, dtype="f32")
    else:
        g = llama(1, 32, 4, 8, 64, kv_heads=2, batch=2, dtype="f32")
    step = step_of(g)
    ch = shard_layer(step, 2, slow_compute(1e6))
    assert any(lab is not None for lab in ch.choices.values())
    feed = feed_of(step)
    want = partita.run(step, feed)
    prog = partita.parallelize(step, mesh=ch.mesh, annotations=ch.annotations)
    weights = {v.name: feed[v.name] for v in step.inputs if v.role == "param"}
    got = prog.simulate({k: a for k, a in feed.items() if k not in weights}, weights)
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5, err_msg=f"output {i}")


def test_bad_input_is_named():
    with pytest.raises(PlanError, match="tp must be"):
        shard_layer(step_of(gpt(1, 32, 4, 8, 64)), 0, "selene")
    with pytest.raises(PlanError, match="must be a partita Graph"):
        shard_layer("model", 2, "selene")
