"""The cost model, the simulator and the memory report (partita/cluster/cost.py, simulator.py,
memory.py): timings worked out by hand on small programs, the overlap rules of the runtime,
point-to-point pipelines, alike ranks simulated once against every rank simulated, the
memory arithmetic of ZeRO, the Chrome trace, and bad input."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest

import partita
from partita.cluster import Efficiency, parse_cluster
from partita.cluster.cost import CostModel
from partita.cluster.memory_report import memory_report
from partita.cluster.simulator import SimulationError, simulate
from partita.ir.mesh import Mesh

# A made-up cluster with round figures: 1 GB/s memory, 1 GFLOP/s f32, links of 1 GB/s with
# 1 us (inside a node) and 10 us (across nodes) latency; efficiencies 1 and no op overhead,
# so that every time below is bytes / 1e9 or flops / 1e9.
TOY = '''
name = "toy"
nodes = 2
gpus_per_node = 2

[device]
name = "T1"
memory = "1 MB"
memory_bandwidth = "1 GB/s"

[device.peak_flops]
f32 = 1e9

[intra_node]
bandwidth = "1 GB/s"
latency = "1 us"

[inter_node]
bandwidth = "0.5 GB/s"
latency = "10 us"
'''


def toy(**eff):
    c = parse_cluster(TOY)
    base = dict(gemm=1.0, gemm_knee=0.0, attention=1.0, memory=1.0, op_overhead=0.0, network=1.0)
    base.update(eff)
    return dataclasses.replace(c, efficiency=Efficiency(**base))


def ranks_program(mesh: str, *texts: str):
    """A stand-in ParallelProgram: one graph per rank (or one for every rank)."""
    m = Mesh.of(mesh)
    graphs = [partita.parse(t) for t in texts]
    per_rank = graphs * m.size if len(graphs) == 1 else graphs
    return SimpleNamespace(mesh=m, rank_graphs=lambda: per_rank, single_device=None)


# --- the cost model ------------------------------------------------------------------------


def test_a_transpose_that_only_matrix_products_read_is_read_in_place():
    from partita.cluster.cost import operand_transpose, price_key

    g = partita.parse("""graph @g(%a: f32[4,64,32], %b: f32[4,64,32]) -> (f32[4,64,64], f32[4,32,64], f32[32,4,64]) {
      %t = transpose(%b) {perm=[0, 2, 1]} : f32[4,32,64]
      %m = matmul(%a, %t) : f32[4,64,64]
      %u = transpose(%b) {perm=[0, 2, 1]} : f32[4,32,64]
      %e = exp(%u) : f32[4,32,64]
      %p = transpose(%u) {perm=[1, 0, 2]} : f32[32,4,64]
      return %m, %e, %p
    }""")
    t, _m, u, _e, p = g.nodes
    cm = CostModel(toy())
    assert operand_transpose(t) and cm.compute_time(t).seconds == 0.0   # the GEMM reads it transposed
    assert not operand_transpose(u) and cm.compute_time(u).seconds > 0  # exp reads it too: a copy
    assert not operand_transpose(p) and cm.compute_time(p).seconds > 0  # not the last two dims
    assert price_key(t) != price_key(u)                                 # alike nodes priced apart

def test_compute_ops_are_priced_by_their_records_and_the_efficiencies():
    g = partita.parse("""graph @g(%a: f32[64,128], %b: f32[128,32]) -> (f32[64,32]) {
      %m = matmul(%a, %b) : f32[64,32]
      %e = exp(%m) : f32[64,32]
      %r = reshape(%e) {shape=[32,64]} : f32[32,64]
      %q = reshape(%r) {shape=[64,32]} : f32[64,32]
      return %q
    }""")
    mm, ex, rs, _ = g.nodes
    cm = CostModel(toy())
    assert cm.compute_time(mm).seconds == pytest.approx(2 * 64 * 128 * 32 / 1e9)
    assert cm.compute_time(ex).seconds == pytest.approx(2 * 64 * 32 * 4 / 1e9)   # read + write
    assert cm.compute_time(rs).seconds == 0.0                                      # a view
    # The shape factor: each dim d scales by d / (d + knee); the overhead comes on top.
    cm2 = CostModel(toy(gemm=0.5, gemm_knee=64.0, op_overhead=3e-6))
    f = (64 / 128) * (128 / 192) * (32 / 96)
    assert cm2.compute_time(mm).seconds == pytest.approx(2 * 64 * 128 * 32 / (1e9 * 0.5 * f) + 3e-6)
    assert cm2.compute_time(rs).seconds == 0.0


def test_collectives_follow_the_alpha_beta_formulas_of_their_algorithms():
    c = toy()
    cm = CostModel(c)
    intra, inter = c.intra_node, c.inter_node
    S = 4096.0
    ring = 2 * 1 * 1e-6 + 2 * (1 / 2) * S / 1e9
    tree = 2 * 1 * 1e-6 + 2 * S / 1e9
    assert cm.collective("all_reduce", S, 2, intra) == pytest.approx(min(ring, tree))
    assert cm.collective("all_gather", S, 4, inter) == pytest.approx(3 * 10e-6 + 3 / 4 * S / 0.5e9)
    assert cm.collective("broadcast", S, 4, intra) == pytest.approx(2 * 1e-6 + S / 1e9)
    # Large buffers on many ranks: the ring wins; tiny ones: the tree's log latency.
    n = 64
    big = cm.collective("all_reduce", 1e9, n, inter)
    assert big == pytest.approx(2 * (n - 1) * 10e-6 + 2 * (n - 1) / n * 1e9 / 0.5e9)
    small = cm.collective("all_reduce", 8, n, inter)
    assert small == pytest.approx(2 * math.log2(n) * 10e-6 + 2 * 8 / 0.5e9)
    # A group inside one node uses NVLink, across nodes the network.
    assert c.link([0, 1]) is intra and c.link([1, 2]) is inter


# --- the simulator: overlap as the runtime does it -----------------------------------------

DP_ASYNC = """graph @g(%x: f32[1024], %w: f32[1024]) -> (f32[1024]) mesh(dp=2) {
  %a = all_reduce(%w) {axis="dp", group_size=2} : f32[1024]
  %h = exp(%x) : f32[1024]
  %s = add(%h, %a) : f32[1024]
  return %s
}"""


def test_an_async_all_reduce_overlaps_the_compute_until_its_result_is_read():
    # Each op priced alone (fuse_groups=False): exp runs while the all_reduce does.
    r = simulate(ranks_program("dp=2", DP_ASYNC), toy(), memory=False, fuse_groups=False)
    exp_t = 2 * 4096 / 1e9                      # 8.192 us
    ar = 2 * 1e-6 + 4096 / 1e9                 # ring on 2 ranks: 6.096 us, under exp's
    add_t = 3 * 4096 / 1e9
    assert r.step_time == pytest.approx(exp_t + add_t)
    assert r.ranks[0].waiting == pytest.approx(0.0)
    # A slower network: the add waits for the all_reduce.
    slow = dataclasses.replace(toy(), intra_node=dataclasses.replace(toy().intra_node, latency=20e-6))
    r2 = simulate(ranks_program("dp=2", DP_ASYNC), slow, memory=False, fuse_groups=False)
    ar2 = 2 * 20e-6 + 4096 / 1e9
    assert r2.step_time == pytest.approx(ar2 + add_t)
    assert r2.ranks[0].waiting == pytest.approx(ar2 - exp_t)
    assert r2.ranks[0].comm["dp"] == pytest.approx(ar2)
    assert ar < exp_t


def test_a_fused_group_waits_for_every_input_it_reads():
    # By default exp and add are one fused kernel (fused_groups.py): x and a read once, s
    # written once, run where the add is, so the whole kernel waits for the all_reduce.
    r = simulate(ranks_program("dp=2", DP_ASYNC), toy(), memory=False)
    ar = 2 * 1e-6 + 4096 / 1e9
    group_t = 3 * 4096 / 1e9
    assert r.step_time == pytest.approx(ar + group_t)
    assert r.ranks[0].waiting == pytest.approx(ar)


def test_a_blocking_collective_stops_the_compute_stream():
    # all_to_all has no asynchronous form in the runtime (reduce_scatter has one now:
    # tests/cluster/test_overlap.py).
    text = DP_ASYNC.replace('%a = all_reduce(%w) {axis="dp", group_size=2} : f32[1024]',
                            '%a = all_to_all(%w) {axis="dp", group_size=2, split_dim=0, concat_dim=0} : f32[1024]')
    r = simulate(ranks_program("dp=2", text), toy(), memory=False, fuse_groups=False)    # exp and add apart
    a2a = 1e-6 + 0.5 * 4096 / 1e9
    assert r.step_time == pytest.approx(a2a + 2 * 4096 / 1e9 + 3 * 4096 / 1e9)


def test_a_collective_starts_when_the_last_member_reaches_it():
    # Rank 1 computes longer before the all_reduce: rank 0 waits for it.
    fast = """graph @g(%x: f32[256], %w: f32[1024]) -> (f32[1024]) mesh(dp=2) {
      %h = exp(%x) : f32[256]
      %a = all_reduce(%w) {axis="dp", group_size=2} : f32[1024]
      %s = add(%a, %a) : f32[1024]
      return %s
    }"""
    slow = fast.replace("f32[256]", "f32[2048]")
    r = simulate(ranks_program("dp=2", fast, slow), toy(), memory=False, dedup=False)
    ar = 2 * 1e-6 + 4096 / 1e9
    t_slow = 2 * 8192 / 1e9
    assert r.step_time == pytest.approx(t_slow + ar + 3 * 4096 / 1e9)
    assert r.ranks[0].waiting == pytest.approx(t_slow + ar - 2 * 1024 / 1e9)


# --- point to point ------------------------------------------------------------------------

STAGE0 = """graph @s0(%x: f32[1024]) -> (f32[1024]) mesh(pp=2) {
  %h = exp(%x) : f32[1024]
  send(%h) {axis="pp", group_size=2, peer=1}
  %g = recv() {axis="pp", group_size=2, peer=1, shape=[1024], dtype=f32} : f32[1024]
  %o = neg(%g) : f32[1024]
  return %o
}"""
STAGE1 = """graph @s1(%y: f32[1024]) -> (f32[1024]) mesh(pp=2) {
  %h = recv() {axis="pp", group_size=2, peer=0, shape=[1024], dtype=f32} : f32[1024]
  %e = exp(%h) : f32[1024]
  send(%e) {axis="pp", group_size=2, peer=0}
  %o = add(%e, %y) : f32[1024]
  return %o
}"""


def test_sends_and_recvs_chain_the_stages():
    c = toy()
    r = simulate(ranks_program("pp=2", STAGE0, STAGE1), c, memory=False)
    op = 2 * 4096 / 1e9
    p2p = 1e-6 + 4096 / 1e9          # one node: ranks 0 and 1
    # stage 0: exp, send; stage 1: recv, exp, send back; stage 0: neg.
    assert r.ranks[0].end == pytest.approx(op + p2p + op + p2p + op)
    assert r.ranks[1].end == pytest.approx(op + p2p + op + 3 * 4096 / 1e9)
    assert r.ranks[1].waiting == pytest.approx(op + p2p)


def test_programs_that_cannot_finish_are_named():
    # A recv is posted where it stands and waited for where it is read; rank 0 reads its
    # recv before it sends, and rank 1 waits for that send: neither can go on.
    deadlock = """graph @s0(%x: f32[1024]) -> (f32[1024]) mesh(pp=2) {
  %g = recv() {axis="pp", group_size=2, peer=1, shape=[1024], dtype=f32} : f32[1024]
  %h = exp(%g) : f32[1024]
  send(%h) {axis="pp", group_size=2, peer=1}
  return %h
}"""
    with pytest.raises(SimulationError, match="cannot finish.*rank 0 waits at %g = recv"):
        simulate(ranks_program("pp=2", deadlock, STAGE1), toy(), memory=False)
    lonely = DP_ASYNC.replace('%a = all_reduce(%w) {axis="dp", group_size=2} : f32[1024]', "%a = neg(%w) : f32[1024]")
    with pytest.raises(SimulationError, match="fewer collectives over 'dp'"):
        simulate(ranks_program("dp=2", DP_ASYNC, lonely), toy(), memory=False, dedup=False)


# --- real programs: alike ranks once, and the pipeline's timeline --------------------------

@pytest.fixture(scope="module")
def gpt_step():
    fwd = partita.models.gpt(layers=4, hidden=64, heads=4, seq=16, vocab=128, batch=16, dtype="f32")
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")


@pytest.mark.parametrize("mesh,strategy,extra", [
    ("dp=4", "dp", {}),
    ("dp=2,tp=2", "dp+megatron", {}),
    ("dp=4", "zero3", {}),
    ("pp=2,dp=2", "pp+dp", {"microbatches": 4, "schedule": "1f1b"}),
    ("pp=2,tp=2", "pp+megatron", {"microbatches": 4, "schedule": "interleaved", "virtual_stages": 2}),
])
def test_alike_ranks_simulated_once_give_what_every_rank_simulated_gives(gpt_step, mesh, strategy, extra):
    prog = partita.parallelize(gpt_step, mesh=mesh, strategy=strategy, **extra)
    # Selene: the 4 ranks share a node; the toy cluster: 2 nodes of 2, groups cross the network.
    for cluster in ("selene", toy()):
        once = simulate(prog, cluster, memory=False)
        every = simulate(prog, cluster, memory=False, dedup=False)
        assert once.step_time == pytest.approx(every.step_time, rel=1e-9)
        assert len(every.ranks) == 4 and len(once.ranks) <= 4
        by = {r.rank: r for r in every.ranks}
        for r in once.ranks:
            assert r.end == pytest.approx(by[r.rank].end, rel=1e-9)
            assert r.compute == pytest.approx(by[r.rank].compute, rel=1e-9)


def test_a_pipeline_with_data_parallel_keeps_its_schedule(gpt_step):
    # Its dp collectives must not pull a later microbatch's forward above the backward the
    # schedule runs first: the step is the schedule's, compute plus the bubble, not a stall
    # per microbatch (order_collectives(keep_order=True) in the pipeline).
    S, M = 4, 8
    step = partita.training_step(partita.models.gpt(layers=8, hidden=64, heads=4, seq=16, vocab=128, batch=32,
                                                    dtype="f32"), loss="cross_entropy", optimizer="sgd")
    prog = partita.parallelize(step, mesh=f"pp={S},dp=2", strategy="pp+dp", microbatches=M, schedule="1f1b")
    r = simulate(prog, "selene", memory=False)
    compute = max(x.compute for x in r.ranks)
    assert r.step_time < 1.25 * compute * (M + S - 1) / M, (r.step_time, compute)


def test_results_report_utilization_tokens_memory_and_a_chrome_trace(gpt_step, tmp_path):
    prog = partita.parallelize(gpt_step, mesh="dp=2,tp=2", strategy="dp+megatron")
    r = simulate(prog, "selene")
    assert r.tokens == 16 * 16 and r.tokens_per_second == pytest.approx(r.tokens / r.step_time)
    assert r.mfu is not None and 0 < r.mfu <= r.hfu < 1
    assert r.model_flops == pytest.approx(r.hardware_flops, rel=0.02)    # no recomputation here
    assert set(r.comm_bytes) == {"dp", "tp"} and all(b > 0 for b in r.comm_bytes.values())
    assert r.peak_memory() > 0 and "MFU" in r.text() and "peak" in r.text()
    doc = r.chrome_trace(tmp_path / "t.json")
    doc2 = json.loads((tmp_path / "t.json").read_text())
    assert doc2 == json.loads(json.dumps(doc))
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"compute", "comm:dp", "comm:tp"} <= names
    assert all(e["dur"] >= 0 for e in spans)
    # One rank's compute spans never overlap.
    for pid in {e["pid"] for e in spans}:
        comp = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["pid"] == pid and e["tid"] == 0)
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(comp, comp[1:]))


def test_recomputation_counts_in_hfu_not_in_mfu():
    fwd = partita.models.gpt(layers=2, hidden=64, heads=4, seq=16, vocab=128, batch=8, dtype="f32")
    full = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", recompute="full")
    r = simulate(full, "selene", memory=False)
    assert r.hardware_flops > 1.1 * r.model_flops
    assert r.hfu > r.mfu


# --- memory --------------------------------------------------------------------------------

def test_zero_stages_shard_the_model_states_as_zero_counts_them():
    fwd = partita.models.gpt(layers=2, hidden=64, heads=4, seq=16, vocab=128, batch=8, dtype="bf16")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", master_weights=True)
    single = memory_report(step)
    P = single.params // 2                                      # bf16 params
    assert single.optimizer == pytest.approx(12 * P, rel=0.01)  # f32 master, m, v (K = 12)
    got = {}
    for s in ("dp", "zero1", "zero2", "zero3"):
        prog = partita.parallelize(step, mesh="dp=4", strategy=s)
        got[s] = memory_report(prog.rank_graphs()[0] if hasattr(prog, "rank_graphs") else prog.local)
    assert got["dp"].params == single.params and got["dp"].optimizer == single.optimizer
    assert got["zero1"].optimizer == pytest.approx(single.optimizer / 4, rel=0.02)
    assert got["zero1"].grads == pytest.approx(got["dp"].grads, rel=0.02)
    assert got["zero2"].grads == pytest.approx(got["dp"].grads / 4, rel=0.02)
    assert got["zero3"].params == pytest.approx(single.params / 4, rel=0.02)
    assert got["zero3"].model_states < got["zero2"].model_states < got["zero1"].model_states \
        < got["dp"].model_states


# --- bad input -----------------------------------------------------------------------------

def test_a_mesh_the_cluster_cannot_hold_and_a_tp_axis_across_nodes_are_refused(gpt_step):
    prog = partita.parallelize(gpt_step, mesh="dp=8", strategy="dp")
    with pytest.raises(SimulationError, match=r"needs 8 devices but the cluster 'toy' has 4"):
        simulate(prog, toy())
    tp = partita.parallelize(gpt_step, mesh="tp=4", strategy="megatron")
    with pytest.raises(SimulationError, match=r"tensor-parallel axis tp=4 .* more than the 2 devices of a node"):
        simulate(tp, toy())


def test_a_rank_over_its_device_memory_is_named_with_the_excess(gpt_step):
    prog = partita.parallelize(gpt_step, mesh="dp=2", strategy="dp")
    tiny = dataclasses.replace(toy(), device=dataclasses.replace(toy().device, memory=100_000))
    with pytest.raises(SimulationError, match=r"rank 0 does not fit in the memory of a T1: it needs .* more than"):
        simulate(prog, tiny, check_memory=True)
    # Without the check it simulates and says how full the device is.
    r = simulate(prog, tiny)
    assert r.peak_memory() > 100_000


# --- ranks that share their node's cores (this machine: 4 gloo ranks on 2 cores) -------------

def test_slowdowns_share_the_cores_between_the_ranks_computing_at_once():
    from partita.cluster.simulator import _slowdowns

    spans = {0: [(0.0, 2.0)], 1: [(1.0, 3.0)], 2: [(10.0, 11.0)]}
    got = _slowdowns(spans, lambda r: 0, 1)
    # [1, 2]: two ranks on one core, each at half speed.
    assert got[0] == pytest.approx(1.5) and got[1] == pytest.approx(1.5) and got[2] == pytest.approx(1.0)
    assert _slowdowns(spans, lambda r: 0, 2) == {0: 1.0, 1: 1.0, 2: 1.0}
    # A running collective takes a core too: rank 2 computes beside rank 0's all_reduce.
    got = _slowdowns({0: [(0.0, 1.0)], 2: [(10.0, 12.0)]}, lambda r: 0, 1, {0: [(10.0, 11.0)]})
    assert got[2] == pytest.approx(1.5) and got[0] == pytest.approx(1.0) and -1 not in got
    # On different nodes nobody shares.
    assert _slowdowns(spans, lambda r: r, 1) == {0: 1.0, 1: 1.0, 2: 1.0}


COMPUTE = """graph @g(%x: f32[1024]) -> (f32[1024]) mesh(dp=2) {
  %h = exp(%x) : f32[1024]
  return %h
}"""

STAGGERED = """graph @g(%x: f32[1024]) -> (f32[1024]) mesh(pp=2) {
  %r = recv() {axis="pp", group_size=2, peer=0, shape=[1024], dtype="f32"} : f32[1024]
  %h = exp(%r) : f32[1024]
  return %h
}"""


def test_ranks_computing_at_once_on_shared_cores_run_slower():
    alone = simulate(ranks_program("dp=2", COMPUTE), toy(), memory=False)
    shared = simulate(ranks_program("dp=2", COMPUTE), dataclasses.replace(toy(), cores_per_node=1), memory=False)
    exp_t = 2 * 4096 / 1e9
    assert alone.step_time == pytest.approx(exp_t)
    # Both ranks compute the whole time: each at half speed.
    assert shared.step_time == pytest.approx(2 * exp_t, rel=1e-3)
    assert not shared.dedup and len(shared.ranks) == 2
    # One core per rank: nothing changes.
    assert simulate(ranks_program("dp=2", COMPUTE), dataclasses.replace(toy(), cores_per_node=2),
                    memory=False).step_time == pytest.approx(exp_t)


def test_a_rank_that_waits_leaves_the_cores_to_the_others():
    first = """graph @g(%x: f32[1024]) -> (f32[1024]) mesh(pp=2) {
  %h = exp(%x) : f32[1024]
  send(%h) {axis="pp", group_size=2, peer=1}
  return %h
}"""
    prog = ranks_program("pp=2", first, STAGGERED)
    alone = simulate(prog, toy(), memory=False)
    shared = simulate(prog, dataclasses.replace(toy(), cores_per_node=1), memory=False)
    # The second stage computes only after the first: never together, no slowdown.
    assert shared.step_time == pytest.approx(alone.step_time, rel=1e-6)


def test_a_memory_bound_op_that_fits_in_the_cache_moves_at_its_bandwidth():
    c = toy()
    fast = dataclasses.replace(c, device=dataclasses.replace(c.device, cache=64e3, cache_bandwidth=4e9))
    g = partita.parse(COMPUTE)
    node = next(iter(g.nodes))
    assert CostModel(c).compute_time(node).seconds == pytest.approx(8192 / 1e9)
    assert CostModel(fast).compute_time(node).seconds == pytest.approx(8192 / 4e9)
    small = dataclasses.replace(c, device=dataclasses.replace(c.device, cache=4e3, cache_bandwidth=4e9))
    assert CostModel(small).compute_time(node).seconds == pytest.approx(8192 / 1e9)   # 8 KB do not fit in 4 KB


def test_simulate_checks_its_options():
    import partita
    from partita.cluster import SimulationError, simulate

    g = partita.models.gpt(1, 8, 2, 4, 8)
    for kw, message in [({"tokens": "x"}, "tokens must be a positive int"), ({"tokens": 0}, "tokens must be"),
                        ({"model_flops": float("nan")}, "model_flops must be a positive finite"),
                        ({"dedup": "no"}, "dedup must be True or False"), ({"trace": 2}, "trace must be True"),
                        ({"check_memory": "x"}, "check_memory must be"), ({"progress": 3}, "progress must be a function")]:
        with pytest.raises(SimulationError, match="simulate: " + message):
            simulate(g, "selene", **kw)
    with pytest.raises(partita.PartitaError, match="load_cluster: give a shipped cluster's name"):
        simulate(g, 123)
