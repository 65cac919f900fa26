"""The section-level simulation of pipelines built with ``parallelize(..., unroll=False)``
(partita/cluster/pipeline_sim.py) against the node-level simulation of the unrolled program:
the same step time, hardware FLOPs and bytes per axis, for 1F1B, GPipe, interleaved and
zero-bubble schedules on pp x dp x tp meshes inside one node and across nodes; and what a
not-unrolled program refuses to do."""

from __future__ import annotations

import pytest

import partita
from partita.cluster import parse_cluster
from partita.cluster.pipeline_sim import section_order
from partita.cluster.simulator import SimulationError, simulate
from partita.parallel.collective_order import order_collectives
from partita.parallel.pipeline.schedule import PipelineError

# 4 nodes of 2 devices: every dp group and pipeline neighbour below crosses the network.
SMALL_NODES = '''
name = "two-per-node"
nodes = 4
gpus_per_node = 2

[device]
name = "T1"
memory = "1 GB"
memory_bandwidth = "100 GB/s"

[device.peak_flops]
f32 = 1e12

[intra_node]
bandwidth = "50 GB/s"
latency = "2 us"

[inter_node]
bandwidth = "5 GB/s"
latency = "10 us"
'''


@pytest.fixture(scope="module")
def step():
    fwd = partita.models.gpt(layers=4, hidden=64, heads=4, seq=16, vocab=128, batch=16, dtype="f32")
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")


# The section-level steps are those prepare makes of the unrolled program: the same step time
# up to rounding (the sums run in another order). Under pp+dp+megatron the tied embedding's
# gradient, which the template reduces over dp where it is made, is reduced once per step on
# the microbatches' sum (driver._defer_grad_reductions); the sections issue that reduction at
# its once-per-step section, the unrolled program right after the last sum: the last stage
# ends one op (5 us of 5.6 ms) apart, within 1e-3.
CASES = [
    ("pp=2,dp=2", "pp+dp", "1f1b", 1, 4, 1e-9),
    ("pp=4,dp=2", "pp+dp", "gpipe", 1, 8, 1e-9),
    ("pp=2,dp=2", "pp+dp", "zero-bubble", 1, 4, 1e-9),
    ("pp=2,dp=4", "pp+dp", "interleaved", 2, 4, 1e-9),
    ("pp=4", "pp", "1f1b", 1, 8, 1e-9),
    ("pp=2,tp=2", "pp+megatron", "interleaved", 2, 4, 1e-9),
    ("pp=2,dp=2,tp=2", "pp+dp+megatron", "1f1b", 1, 4, 1e-3),
    ("pp=2,dp=2,tp=2", "pp+dp+megatron", "interleaved", 2, 8, 1e-3),
    ("pp=2,dp=2,tp=2", "pp+dp+megatron", "zero-bubble", 1, 4, 1e-3),
    ("pp=4,tp=2", "pp+megatron", "gpipe", 1, 4, 1e-9),
]


@pytest.mark.parametrize("mesh,strategy,schedule,virtual,M,rel", CASES)
def test_sections_simulate_what_the_unrolled_program_simulates(step, mesh, strategy, schedule, virtual, M, rel):
    kw = dict(mesh=mesh, strategy=strategy, schedule=schedule, virtual_stages=virtual, microbatches=M)
    full = partita.parallelize(step, **kw)
    tmpl = partita.parallelize(step, unroll=False, **kw)
    assert not tmpl.unrolled and tmpl.templates is not None and len(tmpl.templates) == full.schedule.stages
    for cluster in ("selene", parse_cluster(SMALL_NODES)):
        a = simulate(full, cluster, memory=False)
        b = simulate(tmpl, cluster)
        assert b.step_time == pytest.approx(a.step_time, rel=rel), (cluster, a.step_time, b.step_time)
        assert b.hardware_flops == pytest.approx(a.hardware_flops, rel=1e-12)
        assert b.model_flops == pytest.approx(a.model_flops, rel=1e-12) and b.tokens == a.tokens
        assert set(b.comm_bytes) == set(a.comm_bytes)
        for axis, nbytes in a.comm_bytes.items():
            assert b.comm_bytes[axis] == pytest.approx(nbytes, rel=1e-12), axis
        assert all(r.memory is None for r in b.ranks)
        # Alike ranks once (with tp-only stretches precomputed) against every rank simulated.
        every = simulate(tmpl, cluster, dedup=False)
        assert every.step_time == pytest.approx(b.step_time, rel=1e-9)
        assert every.hardware_flops == pytest.approx(b.hardware_flops, rel=1e-12)


def test_a_section_is_ordered_as_the_order_collectives_pass_orders_a_program(step):
    # The sections and the pass share one collective order (collective_order.kept_order): a
    # whole rank program taken as one section comes out in the order order_collectives(
    # keep_order=True) leaves it in (here zero3's prefetched gathers sink to their readers).
    local = partita.parallelize(step, mesh="dp=2", strategy="zero3").local.clone()
    nodes = list(local.nodes)
    got = section_order(nodes)
    order_collectives(local, prefetch=0, keep_order=True)
    assert got.nodes == list(local.nodes) and got.nodes != nodes


@pytest.mark.parametrize("strategy,rel", [("pp+zero1", 1e-2), ("pp+zero2", 1e-2), ("pp+zero3", 0.1)])
def test_zero_under_a_pipeline_is_approximated(step, strategy, rel):
    # The unrolled program buckets zero's param all_gathers across microbatches and prefetches
    # them (bucket_gathers, order_collectives' prefetch); the sections gather each param where
    # its section reads it: the same bytes, the step within 1% (zero1, zero2: 0.02%, 0.3% seen)
    # or 10% (zero3: 5.5% seen).
    kw = dict(mesh="pp=2,dp=2", strategy=strategy, microbatches=4)
    a = simulate(partita.parallelize(step, **kw), "selene", memory=False)
    b = simulate(partita.parallelize(step, unroll=False, **kw), "selene")
    assert b.step_time == pytest.approx(a.step_time, rel=rel)
    assert b.hardware_flops == pytest.approx(a.hardware_flops, rel=1e-12)
    assert b.comm_bytes == pytest.approx(a.comm_bytes, rel=1e-12)


def test_the_section_trace_names_the_sections(step):
    tmpl = partita.parallelize(step, mesh="pp=2,dp=2", strategy="pp+dp", microbatches=4, unroll=False)
    r = simulate(tmpl, "selene")
    names = {e.name for e in r.events if e.stream == "compute"}
    assert {"F0", "B3"} <= names or {"F0", "B0"} <= names, sorted(names)[:10]
    assert any(e.stream == "comm:pp" for e in r.events)


def test_a_not_unrolled_pipeline_says_it_cannot_run(step):
    prog = partita.parallelize(step, mesh="pp=2,dp=2", strategy="pp+dp", microbatches=4, unroll=False)
    for call in (prog.rank_graphs, lambda: prog.shard_weights(), lambda: prog.text(0),
                 lambda: prog.shard_inputs({})):
        with pytest.raises(PipelineError, match="unroll=False for simulation.*without unroll=False"):
            call()
    # The plan is built from the templates: each transfer once per microbatch.
    full = partita.parallelize(step, mesh="pp=2,dp=2", strategy="pp+dp", microbatches=4)
    assert [s.sends for s in prog.plan.per_stage] == [s.sends for s in full.plan.per_stage]
    assert [s.sent_bytes for s in prog.plan.per_stage] == [s.sent_bytes for s in full.plan.per_stage]


def test_unroll_false_is_for_training_pipelines(step):
    fwd = partita.models.gpt(layers=2, hidden=32, heads=2, seq=8, vocab=64, batch=4, dtype="f32")
    with pytest.raises(PipelineError, match="unroll=False"):
        partita.parallelize(fwd, mesh="pp=2", strategy="pp", microbatches=2, unroll=False)
    with pytest.raises(Exception, match="unroll"):
        partita.parallelize(step, mesh="dp=2", strategy="dp", unroll=False)


@pytest.mark.parametrize("mesh,strategy,schedule,virtual", [("pp=2,tp=2", "pp+megatron", "interleaved", 2),
                                                            ("pp=2,dp=2,tp=2", "pp+dp+megatron", "1f1b", 1)])
def test_each_rank_says_which_axis_it_waited_for(step, mesh, strategy, schedule, virtual):
    """RankResult.waits splits ``waiting`` by the axis waited for, in the section-level and in
    the unrolled simulation alike: the pipeline's recvs (its bubble) on pp, tp's collectives."""
    kw = dict(mesh=mesh, strategy=strategy, schedule=schedule, virtual_stages=virtual, microbatches=4)
    for prog in (partita.parallelize(step, **kw), partita.parallelize(step, unroll=False, **kw)):
        r = simulate(prog, "selene", memory=False)
        for rank in r.ranks:
            assert set(rank.waits) <= set(prog.mesh.names)
            assert sum(rank.waits.values()) == pytest.approx(rank.waiting, rel=1e-9, abs=1e-12)
        assert max(rank.waits.get("pp", 0.0) for rank in r.ranks) > 0      # the later stages wait for the first


def test_check_memory_walks_the_templates_of_a_not_unrolled_pipeline(step):
    """check_memory on a pipeline simulated section by section: each rank's memory walked from
    its stage's template in schedule order, its peak that of the unrolled program's rank (within
    a few bytes: docs/view.md), and a device too small is named with the rank."""
    import dataclasses

    from partita.cluster import load_cluster

    prog = partita.parallelize(step, mesh="pp=2,dp=2", strategy="pp+dp", microbatches=4, unroll=False)
    full = partita.parallelize(step, mesh="pp=2,dp=2", strategy="pp+dp", microbatches=4)
    walked = simulate(prog, "selene", check_memory=True, trace=False)
    unrolled = simulate(full, "selene", trace=False)
    assert walked.program is prog and all(r.memory is not None for r in walked.ranks)
    peak = {r.rank: r.memory.peak for r in unrolled.ranks}
    for r in walked.ranks:
        assert r.memory.peak == pytest.approx(peak[r.rank], abs=64), r.rank
    assert simulate(prog, "selene", trace=False).ranks[0].memory is None     # not walked unless asked
    selene = load_cluster("selene")
    tiny = dataclasses.replace(selene, device=dataclasses.replace(selene.device, memory=1000))
    with pytest.raises(SimulationError, match=r"rank \d+ does not fit in the memory"):
        simulate(prog, tiny, check_memory=True, trace=False)
