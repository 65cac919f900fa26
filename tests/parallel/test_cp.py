"""``cp``: context parallelism (the sequence split over the ``cp`` axis, k and v all-gathered
for attention, the causal load balanced by chunks i and 2cp-1-i). Each per-rank program is
checked against the single-device step on ``run_mesh`` for a tiny Llama and a tiny GPT
(fused attention) with adamw, alone and with dp, zero3, megatron and pp, and on gloo
processes; ``cp-ring`` (ring attention) likewise; its collectives and the simulator's pricing are inspected; bad sequences and
models are StrategyErrors naming the value and the fix."""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.autodiff.optim import initial_state
from partita.ir.graph import Graph
from partita.parallel.strategies.cp import balanced_positions
from partita.parallel.strategy import StrategyError, parallelize

SEQ = 16


def cp_step(kind: str, batch: int = 4, seq: int = SEQ) -> Graph:
    """A tiny Llama (grouped k/v heads, rotary) or GPT (fused attention) step with adamw."""
    if kind == "gpt":
        g = partita.models.gpt(layers=2, hidden=32, heads=4, seq=seq, vocab=64, batch=batch, dtype="f32",
                               attention="fused")
    else:
        g = partita.models.llama(2, 32, 4, seq, 64, kv_heads=2, batch=batch, dtype="f32")
    return partita.training_step(g, loss="cross_entropy", optimizer="adamw")


def feed_and_weights(step: Graph, batch: int = 4, seq: int = SEQ, seed: int = 0) -> tuple[dict, dict]:
    """Random ids and targets, random params and their optimizer state."""
    rng = np.random.default_rng(seed)
    w = {str(v.name): (rng.standard_normal(v.type.shape) * 0.2).astype(v.type.dtype.np)
         for v in step.inputs if v.role == "param"}
    full = dict(w, **{str(v.name): initial_state(str(v.name), v.type, w) for v in step.inputs if v.role == "state"})
    feed = {str(step.inputs[0].name): rng.integers(0, 64, (batch, seq)),
            "target": rng.integers(0, 64, (batch, seq))}
    return feed, full


def worst_error(step: Graph, prog, feed: dict, weights: dict) -> tuple[float, str]:
    """The largest relative difference of an output from the single-device step's."""
    worst = (0.0, "")
    for v, a, b in zip(step.outputs, prog.simulate(feed, weights), partita.run(step, feed, weights)):
        a64, b64 = np.float64(a), np.float64(b)
        err = float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(b64), 1e-4))
        worst = max(worst, (err, str(v.name)))
    return worst


def test_balanced_positions_give_each_rank_an_early_and_a_late_chunk():
    p = balanced_positions(16, 2)
    assert p.tolist() == [[0, 1, 2, 3, 12, 13, 14, 15], [4, 5, 6, 7, 8, 9, 10, 11]]
    assert sorted(balanced_positions(16, 4).reshape(-1).tolist()) == list(range(16))


@pytest.mark.parametrize("kind", ["llama", "gpt"])
@pytest.mark.parametrize("mesh,strategy", [
    ("cp=2", "cp"), ("cp=4", "cp"), ("dp=2,cp=2", "dp+cp"), ("cp=2,tp=2", "cp+megatron"),
])
def test_cp_adamw_step_matches_one_device(kind, mesh, strategy):
    """Loss, new params and moments of every rank, assembled, equal the single-device step's."""
    step = cp_step(kind)
    prog = parallelize(step, mesh, strategy)
    partita.verify(prog.local)
    feed, weights = feed_and_weights(step)
    err, name = worst_error(step, prog, feed, weights)
    assert err <= 1e-4, f"{strategy} on {mesh}: %{name} differs from one device by {err:.2e}"


def test_cp_composes_with_zero3():
    step = cp_step("gpt")
    prog = parallelize(step, "dp=2,cp=2", "zero3+cp")
    feed, weights = feed_and_weights(step)
    err, name = worst_error(step, prog, feed, weights)
    assert err <= 1e-4, f"zero3+cp: %{name} differs from one device by {err:.2e}"


def test_cp_rank_holds_its_tokens_and_gathers_k_and_v():
    """Activations hold S/cp tokens; attention reads k and v gathered over cp (one gather of
    each per layer, reused by the backward; of the k/v heads, repeated after the gather), their
    gradients are reduce-scattered; every cp
    collective's reason is in the plan's notes."""
    step = cp_step("llama")
    prog = parallelize(step, "cp=2", "cp")
    att = [n for n in prog.local.nodes if n.op == "attention"]
    assert len(att) == 2
    for n in att:
        q, k, v, mask = n.operands
        assert q.type.shape[-2] == SEQ // 2 and k.type.shape[-2] == SEQ and mask.type.shape == (SEQ // 2, SEQ)
        src = k.producer
        while src.op in ("reshape", "broadcast_to", "unsqueeze"):   # grouped-query attention's repeat
            src = src.operands[0].producer
        assert src.op == "all_gather" and src.attrs["axis"] == "cp"
        assert not n.attrs["causal"]
    ops = [(n.op, n.attrs.get("axis")) for n in prog.local.nodes]
    assert ops.count(("all_gather", "cp")) == 4
    assert ops.count(("reduce_scatter", "cp")) == 4
    notes = "\n".join(prog.plan.notes)
    assert "all_gather over cp: attention reads every key of the sequence" in notes
    # The plan lists every cp collective with its reason, phase and bytes, as partition's.
    plan = prog.plan
    assert plan.count("all_gather", "cp", "forward") == 4 and plan.count("reduce_scatter", "cp", "backward") == 4
    # 21 weight gradients and the loss summed over the tokens (the program buckets the 21).
    assert plan.count("all_reduce", "cp") == 22 and plan.count(axis="cp") == 30
    gathers = [c for c in plan.collectives if c["op"] == "all_gather" and c["axis"] == "cp"]
    # each rank's [4, 2, SEQ/2, 8] f32 gathered: the 2 k/v heads, not the 4 query heads they
    # are repeated to
    assert all(c["bytes"] == 4 * 2 * (SEQ // 2) * 8 * 4 and "attention reads every" in c["consumer"] for c in gathers)
    assert "all_gather over cp: inside" in plan.text()
    assert "reduce_scatter over cp: the gradient of the gathered keys" in notes
    assert "all_reduce over cp: the loss" in notes


def test_cp_simulated_on_a_cluster_shows_cp_traffic():
    from partita.cluster.hardware import load_cluster
    from partita.cluster.simulator import simulate

    step = cp_step("llama", batch=2, seq=32)
    sim = simulate(parallelize(step, "cp=4", "cp"), load_cluster("dgx-h100"))
    assert sim.comm_bytes.get("cp", 0) > 0 and sim.step_time > 0


@pytest.mark.parametrize("mesh,message", [
    ("cp=3", r"sequence length 16 .*not a multiple of 2 x cp = 6.*multiple of 6 or a smaller 'cp' axis"),
    ("cp=16", r"not a multiple of 2 x cp = 32"),
])
def test_cp_sequence_that_the_axis_does_not_divide(mesh, message):
    with pytest.raises(StrategyError, match=message):
        parallelize(cp_step("gpt"), mesh, "cp")


def test_cp_needs_a_sequence_and_attention():
    from partita.ir.builder import Builder
    from partita.ir.dtypes import f32
    from partita.ir.types import TensorType

    g = Graph("mlp")
    b = Builder(g)
    x = b.input("x", TensorType((4, 8), f32))
    w = b.param("w", TensorType((8, 8), f32))
    b.ret(b.sum(b.matmul(x, w)))
    with pytest.raises(StrategyError, match=r"no fused 'attention' op.*attention='fused'"):
        parallelize(g, "cp=2", "cp")
    eager = partita.models.gpt(layers=1, hidden=32, heads=4, seq=8, vocab=64, batch=2, dtype="f32",
                             attention="eager")
    with pytest.raises(StrategyError, match=r"no fused 'attention' op"):
        parallelize(partita.training_step(eager, loss="cross_entropy"), "cp=2", "cp")


@pytest.mark.parametrize("kind", ["llama", "gpt"])
@pytest.mark.parametrize("mesh,strategy,kw", [
    ("cp=2", "cp-ring", {}), ("cp=4", "cp-ring", {}), ("dp=2,cp=2", "dp+cp-ring", {}),
    ("cp=2,tp=2", "cp-ring+megatron", {}), ("pp=2,cp=2", "pp+cp-ring", {"microbatches": 2}),
])
def test_cp_ring_adamw_step_matches_one_device(kind, mesh, strategy, kw):
    """Ring attention: loss, new params and moments equal the single-device step's."""
    step = cp_step(kind)
    prog = parallelize(step, mesh, strategy, **kw)
    feed, weights = feed_and_weights(step)
    err, name = worst_error(step, prog, feed, weights)
    assert err <= 1e-4, f"{strategy} on {mesh}: %{name} differs from one device by {err:.2e}"


@pytest.mark.parametrize("strategy", ["pp+cp", "pp+cp-ring"])
def test_cp_with_pp_simulated_without_unrolling(strategy):
    from partita.cluster.hardware import load_cluster
    from partita.cluster.simulator import simulate

    prog = parallelize(cp_step("llama", seq=32), "pp=2,cp=4", strategy, microbatches=2, unroll=False)
    sim = simulate(prog, load_cluster("dgx-h100"))
    assert sim.comm_bytes["cp"] > 0 and sim.comm_bytes["pp"] > 0 and sim.step_time > 0


def test_cp_ring_passes_k_and_v_around_the_ring():
    """No all_gather over cp: each layer's attention runs once per block (cp blocks) with
    k and v shifted cp-1 times forward and cp-1 times again in the backward, where dk and
    dv travel with their block (cp shifts each); the plan's notes give each shift's reason."""
    cp = 4
    step = cp_step("llama")
    prog = parallelize(step, f"cp={cp}", "cp-ring")
    ops = [(n.op, n.attrs.get("axis")) for n in prog.local.nodes]
    assert ops.count(("all_gather", "cp")) == 0 and ops.count(("reduce_scatter", "cp")) == 0
    layers = 2
    assert ops.count(("attention", None)) == layers * cp
    assert ops.count(("attention_grad", None)) == layers * cp
    assert ops.count(("ring_shift", "cp")) == layers * (2 * (cp - 1) + 2 * (cp - 1) + 2 * cp)
    for n in prog.local.nodes:
        if n.op == "attention":
            q, k, v, mask = n.operands
            assert k.type.shape[-2] == SEQ // cp and mask.type.shape == (SEQ // cp, SEQ // cp)
    notes = "\n".join(prog.plan.notes)
    assert prog.plan.count("ring_shift", "cp") == ops.count(("ring_shift", "cp"))
    assert "ring_shift over cp: ring attention hands each rank's keys to the next rank" in notes
    assert "ring_shift over cp: the key gradients travel with their block around the ring" in notes


def test_ring_shift_hands_each_value_forward():
    from partita.ops.registry import OPS

    got = OPS["ring_shift"].collective([[np.array(1)], [np.array(2)], [np.array(3)]],
                                       {"axis": "cp", "group_size": 3, "shift": 1})
    assert [int(x) for x in got] == [3, 1, 2]


def test_cp_ring_simulated_on_a_cluster():
    from partita.cluster.hardware import load_cluster
    from partita.cluster.simulator import simulate

    from partita.ops.registry import OPS

    step = cp_step("llama", batch=2, seq=32)
    prog = parallelize(step, "cp=4", "cp-ring")
    sim = simulate(prog, load_cluster("dgx-h100"))
    sent = {}
    for n in prog.local.nodes:
        if n.attrs.get("axis") == "cp" and OPS[n.op].collective is not None:
            cost = OPS[n.op].cost([v.type for v in n.operands], [v.type for v in n.results], n.attrs)
            sent[n.op] = sent.get(n.op, 0) + cost.bytes_written
    # Every shift is priced as traffic on the cp axis: the four ranks' bytes, the shifts' among them.
    assert sent["ring_shift"] > 0 and sim.step_time > 0
    assert sim.comm_bytes["cp"] == pytest.approx(4 * sum(sent.values()))


@pytest.mark.multiprocess
def test_cp_on_gloo_processes_matches_one_device():
    """Four gloo ranks (dp=2 x cp=2) run the cp step through torch.distributed, step after
    step, each checked against the single-device step."""
    step = cp_step("llama")
    prog = parallelize(step, "dp=2,cp=2", "dp+cp")
    rng = np.random.default_rng(1)
    batches = [{"ids": rng.integers(0, 64, (4, SEQ)), "target": rng.integers(0, 64, (4, SEQ))} for _ in range(2)]
    _, weights = feed_and_weights(step)
    res = partita.launch(prog, 4, batches, weights=weights, check=True, timeout_s=120)
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]
    assert [c.step for c in res.checks] == [1, 2]


@pytest.mark.multiprocess
def test_cp_ring_on_gloo_processes_matches_one_device():
    """Four gloo ranks on one cp ring run ring attention (send and recv to the ring's
    neighbours each step) for two training steps, each checked against one device."""
    step = cp_step("llama")
    prog = parallelize(step, "cp=4", "cp-ring")
    rng = np.random.default_rng(2)
    batches = [{"ids": rng.integers(0, 64, (4, SEQ)), "target": rng.integers(0, 64, (4, SEQ))} for _ in range(2)]
    _, weights = feed_and_weights(step)
    res = partita.launch(prog, 4, batches, weights=weights, check=True, timeout_s=120)
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]
    assert [c.step for c in res.checks] == [1, 2]


def test_cp_with_sp_is_refused():
    """Not built yet: the message says so and names what cp composes with."""
    with pytest.raises(partita.PartitaError, match=r"strategy cp: cp with sp.*not supported"):
        parallelize(cp_step("gpt"), "cp=2,tp=2", "cp+megatron+sp")


@pytest.mark.parametrize("kind", ["llama", "gpt"])
@pytest.mark.parametrize("mesh,strategy,schedule,M", [
    ("pp=2,cp=2", "pp+cp", "1f1b", 2),
    ("pp=2,cp=2", "pp+cp", "gpipe", 4),
    ("pp=2,dp=2,cp=2", "pp+dp+cp", "1f1b", 2),
    ("pp=2,dp=2,cp=2", "pp+zero1+cp", "1f1b", 2),
    ("pp=2,cp=2,tp=2", "pp+cp+megatron", "zero-bubble", 2),
])
def test_cp_with_pp_matches_one_device(kind, mesh, strategy, schedule, M):
    """Each stage's program holds its rank's tokens: the activations and their gradients
    cross between stages at S/cp tokens, and the weight gradients' all_reduce over cp runs
    once per step on the microbatches' sum."""
    step = cp_step(kind)
    prog = parallelize(step, mesh, strategy, microbatches=M, schedule=schedule)
    feed, weights = feed_and_weights(step)
    err, name = worst_error(step, prog, feed, weights)
    assert err <= 1e-4, f"{strategy} on {mesh}: %{name} differs from one device by {err:.2e}"
    for g in prog.rank_graphs():
        for n in g.nodes:
            if n.op == "recv" and "activation" in n.attrs["tag"]:
                assert n.results[0].type.shape[1] == SEQ // 2


def test_cp_bf16_with_master_weights_matches_one_device():
    g = partita.models.llama(2, 32, 4, SEQ, 64, kv_heads=2, batch=4, dtype="bf16")
    step = partita.training_step(g, loss="cross_entropy", optimizer="adamw", master_weights=True)
    prog = parallelize(step, "cp=2", "cp")
    feed, weights = feed_and_weights(step)
    err, name = worst_error(step, prog, feed, weights)
    assert err <= 3e-2, f"bf16 cp: %{name} differs from one device by {err:.2e}"


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["pp+cp", "pp+cp-ring"])
def test_cp_with_pp_on_gloo_processes_matches_one_device(strategy):
    """Two pipeline stages of two cp ranks each: the stages' sends and receives carry each
    rank's tokens, for two training steps checked against one device."""
    step = cp_step("llama")
    prog = parallelize(step, "pp=2,cp=2", strategy, microbatches=2)
    rng = np.random.default_rng(3)
    batches = [{"ids": rng.integers(0, 64, (4, SEQ)), "target": rng.integers(0, 64, (4, SEQ))} for _ in range(2)]
    _, weights = feed_and_weights(step)
    res = partita.launch(prog, 4, batches, weights=weights, check=True, timeout_s=120)
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]
    assert [c.step for c in res.checks] == [1, 2]


# The pipeline passes the rotary tables between stages (rather than making them again) from
# this size on.
NAMED_SEQ = 64


def named_llama_step() -> Graph:
    """The named-model builder's Llama (rotary tables from the sequence) at a tiny size, in
    bf16 with f32 master weights as the Llama 3 rows of bench_simulate.py train."""
    from partita.models.named import NamedModel

    m = NamedModel("tiny-llama3", "llama", 8, 128, 8, 64, NAMED_SEQ, 4, kv_heads=4, ffn=256, rope_theta=500000.0)
    return partita.training_step(m.build(seq=NAMED_SEQ, batch=4, dtype="bf16"), loss="cross_entropy", optimizer="adamw",
                                 master_weights=True)


@pytest.mark.parametrize("mesh,strategy", [
    ("cp=2", "cp"), ("pp=2,cp=2", "pp+cp"), ("pp=2,cp=2,tp=2", "pp+megatron+cp"), ("pp=2,cp=2", "pp+cp-ring"),
    ("dp=2,pp=2,cp=2", "pp+zero2+cp"),
])
def test_named_llama_with_interleaved_pp_and_cp_matches_one_device(mesh, strategy):
    """The rotary cos/sin tables ([1, 1, seq, head_dim], made from the sequence's positions)
    are recomputed by every stage of the interleaved pipeline, never sent (a sent table would
    get a gradient nothing needs, reduced over dp every microbatch); cp takes the rank's rows
    of them, and the step equals one device's (bf16: within bf16's rounding)."""
    step = named_llama_step()
    kw = dict(microbatches=2, schedule="interleaved", virtual_stages=2) if "pp" in strategy else {}
    prog = parallelize(step, mesh, strategy, **kw)
    feed, weights = feed_and_weights(step, seq=NAMED_SEQ)
    err, name = worst_error(step, prog, feed, weights)
    assert err <= 3e-2, f"{strategy} on {mesh}: %{name} differs from one device by {err:.2e}"
    if "pp" in strategy:
        tables = [n.results[0].type.shape for g in prog.rank_graphs() for n in g.nodes
                  if n.op == "recv" and len(n.results[0].type.shape) == 4]
        assert not tables, tables


@pytest.mark.parametrize("mesh,strategy,kw", [("cp=2", "cp", {}), ("pp=2,cp=2", "pp+cp", {"microbatches": 2})])
def test_cp_constant_position_table_takes_the_rank_rows(mesh, strategy, kw):
    """A rotary table folded to a constant (whole along the sequence, made from positions
    alone) is cut to the rows of the rank's two chunks where it meets the rank's tokens."""
    from partita.passes.fold import FoldConstants

    g = partita.models.llama(2, 32, 4, SEQ, 64, kv_heads=2, batch=4, dtype="f32")
    FoldConstants().run(g)
    assert not any(n.op == "iota" for n in g.nodes)
    step = partita.training_step(g, loss="cross_entropy", optimizer="adamw")
    prog = parallelize(step, mesh, strategy, **kw)
    feed, weights = feed_and_weights(step)
    err, name = worst_error(step, prog, feed, weights)
    assert err <= 1e-4, f"{strategy} on {mesh}: %{name} differs from one device by {err:.2e}"


def test_cp_gathers_the_kv_heads_before_they_are_repeated():
    """Grouped-query attention (4 heads, 2 k/v heads): cp gathers the 2 k/v heads and repeats
    them after the gather, and folds the gradients of the repeated heads onto the k/v heads
    before the reduce-scatter: half the bytes over cp, the step still equal to one device's."""
    step = cp_step("llama")
    prog = parallelize(step, "cp=2", "cp")
    gathers = [n for n in prog.local.nodes if n.op == "all_gather" and n.attrs["axis"] == "cp"]
    scatters = [n for n in prog.local.nodes if n.op == "reduce_scatter" and n.attrs["axis"] == "cp"]
    assert gathers and all(n.results[0].type.shape == (4, 2, SEQ, 8) for n in gathers)
    assert scatters and all(n.operands[0].type.shape == (4, 2, SEQ, 8) for n in scatters)
    feed, weights = feed_and_weights(step)
    err, name = worst_error(step, prog, feed, weights)
    assert err <= 1e-4, f"%{name} differs from one device by {err:.2e}"
