"""Gradient buckets and the collective order (partita/parallel/bucket.py).

Every rewrite is checked by meaning: the per-rank programs run with ``run_mesh`` before and
after the pass, on the same inputs and weights, and must give the same outputs (1e-6).
"""

from __future__ import annotations

import heapq
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import partita
from partita.ir.builder import Builder
from partita.ir.diagnostics import PassError
from partita.ir.dtypes import f32
from partita.ir.graph import Graph, Node
from partita.ir.printer import print_graph
from partita.ir.types import TensorType
from partita.parallel import Mesh, Placement
from partita.parallel.bucket import (MB, BucketError, CollectiveOrderError, bucket_gradients,
                                     check_collective_order, order_collectives)
from partita.parallel.partition import local_piece, partition, shard_weights
from partita.parallel.propagate import propagate
from partita.parallel.interpreter import run_mesh
from partita.passes.manager import PassManager

ATOL = 1e-6


# --- programs ------------------------------------------------------------------------------

def _mlp_forward():
    import torch

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = torch.nn.Linear(16, 32)
            self.l2 = torch.nn.Linear(32, 32)
            self.l3 = torch.nn.Linear(32, 10)

        def forward(self, x):
            return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))

    torch.manual_seed(0)
    return partita.import_torch(MLP(), (torch.randn(8, 16),))


@pytest.fixture(scope="module")
def forward() -> Graph:
    return _mlp_forward()


def training_program(forward: Graph, zero2: bool = False) -> tuple[Graph, Graph]:
    """The SGD training step of the MLP on mesh(dp=2) with the batch split over dp: the
    global graph and its per-rank program. ``zero2``: the new params are split on dim 0,
    so each gradient goes from a pending sum to a dim-0 shard (a reduce_scatter)."""
    step = partita.training_step(forward, loss="cross_entropy", optimizer="sgd")
    for v in step.inputs:
        if v.role == "input":
            v.placement = Placement.split(v.type.rank, {0: "dp"})
        elif zero2:
            v.placement = Placement.replicated(v.type.rank)
    if zero2:
        for o in step.outputs:
            if o.producer is not None and o.producer.op == "sgd_update":
                o.placement = Placement.split(o.type.rank, {0: "dp"})
    step.mesh = Mesh.of("dp=2")
    propagate(step)
    local = partition(step)
    partita.verify(local)
    return step, local


def feeds(step: Graph, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Per-rank inputs and weights of the global training step, cut per their placements."""
    rng = np.random.default_rng(seed)
    mesh = step.mesh
    inputs = {}
    for v in step.inputs:
        if v.role == "input":
            if v.type.dtype.is_float:
                inputs[v.name] = rng.standard_normal(v.type.shape).astype(np.float32)
            else:
                inputs[v.name] = rng.integers(0, 10, v.type.shape).astype(np.int64)
    weights = {v.name: rng.standard_normal(v.type.shape).astype(np.float32)
               for v in step.inputs if v.role == "param"}
    by_rank = [{k: local_piece(a, step.input(k).placement, mesh, r) for k, a in inputs.items()}
               for r in range(mesh.size)]
    return by_rank, shard_weights(step, weights, mesh)


def random_feeds(g: Graph, mesh: Mesh, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs}
            for _ in range(mesh.size)]


def assert_same_outputs(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> None:
    assert len(a) == len(b)
    for r, (xs, ys) in enumerate(zip(a, b)):
        assert len(xs) == len(ys)
        for i, (x, y) in enumerate(zip(xs, ys)):
            assert x.shape == y.shape and x.dtype == y.dtype, f"rank {r}, output {i}"
            np.testing.assert_allclose(x, y, rtol=0, atol=ATOL, err_msg=f"rank {r}, output {i}")


def ops(g: Graph, op: str) -> list[Node]:
    return [n for n in g.nodes if n.op == op]


def greedy_buckets(g: Graph, op: str, limit: int) -> list[list[int]]:
    """The expected buckets of independent collectives with one fusion key: operand bytes in
    ready order, a new bucket whenever the next would pass the limit."""
    nodes = list(g.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    members = sorted(ops(g, op), key=lambda n: (pos.get(n.operands[0].producer, -1), pos[n]))
    buckets: list[list[int]] = []
    total = limit + 1
    for n in members:
        size = n.operands[0].type.nbytes
        if total + size > limit:
            buckets.append([])
            total = 0
        buckets[-1].append(size)
        total += size
        if total >= limit:
            total = limit + 1
    return buckets


def rebuilt_in_order(g: Graph, priority) -> tuple[Graph, dict[Node, Node]]:
    """A copy of ``g`` whose nodes are appended in another valid order: a topological sort
    that takes, among the ready nodes, the one with the smallest ``priority(position)``."""
    nodes = list(g.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    indeg = {n: len({v.producer for v in n.operands if v.producer is not None}) for n in nodes}
    heap = [(priority(pos[n]), pos[n]) for n in nodes if indeg[n] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        n = nodes[heapq.heappop(heap)[1]]
        order.append(n)
        for u in sorted({u for r in n.results for u in r.users}, key=pos.__getitem__):
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (priority(pos[u]), pos[u]))
    new = Graph(g.name)
    new.mesh, new.loc = g.mesh, g.loc
    vmap = {v: new.add_input(v.name, v.type, v.role) for v in g.inputs}
    node_map = {}
    for n in order:
        m = Node(n.op, [vmap[v] for v in n.operands], dict(n.attrs), [r.type for r in n.results], n.loc,
                 [r.name for r in n.results])
        new.append(m)
        node_map[n] = m
        vmap.update(zip(n.results, m.results))
    new.set_outputs([vmap[v] for v in g.outputs], [None if a is None else vmap[a] for a in g.output_aliases])
    partita.verify(new)
    return new, node_map


# --- bucket-gradients on a data-parallel training step ----------------------------------------

def test_dp_training_step_buckets_match_the_unbucketed_program(forward):
    step, local = training_program(forward)
    inputs, weights = feeds(step)
    want = run_mesh(local, step.mesh, inputs, weights)
    grads = [n for n in ops(local, "all_reduce") if any(u.op == "sgd_update" for u in n.results[0].users)]
    assert len(grads) == 6  # one per param of the three layers
    size_mb = 5000 / MB
    expected = greedy_buckets(local, "all_reduce", int(size_mb * MB))
    before = len(ops(local, "all_reduce"))

    report = bucket_gradients(local, size_mb=size_mb)
    partita.verify(local)
    assert_same_outputs(run_mesh(local, step.mesh, inputs, weights), want)

    assert [len(b.members) for b in report.buckets] == [len(b) for b in expected], report.text()
    assert [b.bytes for b in report.buckets] == [sum(b) for b in expected]
    assert len(report.buckets) >= 3 and len(report.fused) >= 2, report.text()
    assert report.before["all_reduce"] == before
    assert report.after["all_reduce"] == len(report.buckets) == len(ops(local, "all_reduce"))
    for b in report.buckets:
        assert b.bytes <= report.size_limit or len(b.members) == 1
        assert b.op == "all_reduce" and b.axis == "dp" and b.dtype == f32
    # Gradients fill buckets in reverse layer order, as they come out of the backward pass.
    named = [m for b in report.buckets for m in b.members if m.endswith(".grad")]
    assert named == ["l3.bias.grad", "l2.bias.grad", "l1.bias.grad"], report.text()
    # Each fused collective sits right after the last of its members' operands.
    for n in ops(local, "all_reduce"):
        if n.operands[0].producer.op == "concat":
            concat = n.operands[0].producer
            last = max((v.producer for v in concat.operands if v.producer is not None), key=lambda p: p._order)
            between = []
            m = last.next
            while m is not n:
                between.append(m.op)
                m = m.next
            assert set(between) <= {"reshape", "concat"}, between


def test_one_large_bucket_and_no_bucket(forward):
    step, local = training_program(forward)
    inputs, weights = feeds(step, seed=1)
    want = run_mesh(local, step.mesh, inputs, weights)
    n = len(ops(local, "all_reduce"))

    big = local.clone()
    report = bucket_gradients(big, size_mb=25.0)
    partita.verify(big)
    assert report.after["all_reduce"] == 1 and len(report.buckets[0].members) == n
    assert_same_outputs(run_mesh(big, step.mesh, inputs, weights), want)

    # A limit below every tensor: each gets a bucket of its own, and nothing changes.
    tiny = local.clone()
    report = bucket_gradients(tiny, size_mb=1 / MB)
    assert report.fused == [] and report.after == report.before
    assert tiny.diff(local) is None


def test_tensor_larger_than_the_bucket_gets_its_own():
    mesh = Mesh.of("dp=2")
    g = Graph("g")
    g.mesh = mesh
    b = Builder(g)
    xs = [b.input(f"x{i}", TensorType(s, f32)) for i, s in enumerate([(4,), (64, 4), (4,), (3, 2)])]
    outs = [b.all_reduce(x, axis="dp", group_size=2) for x in xs]
    b.ret(*outs)
    inputs = random_feeds(g, mesh)
    want = run_mesh(g, mesh, inputs)
    report = bucket_gradients(g, size_mb=100 / MB)  # 100 bytes: the 1024-byte x1 does not fit
    partita.verify(g)
    assert [b.members for b in report.buckets] == [("x0",), ("x1",), ("x2", "x3")], report.text()
    assert [b.bytes for b in report.buckets] == [16, 1024, 40]
    assert_same_outputs(run_mesh(g, mesh, inputs), want)


def test_trailing_division_and_avg_keep_their_meaning():
    # A gradient all_reduce followed by a division by the data-parallel degree, one followed
    # by a scale, and an avg all_reduce: the ops after the collective keep consuming the
    # member's piece; avg members are bucketed apart from sum members.
    mesh = Mesh.of("dp=2")
    g = partita.parse("""graph @g(%w1: f32[4,3] param, %w2: f32[5] param, %w3: f32[2,2] param,
                              %g1: f32[4,3], %g2: f32[5], %g3: f32[2,2])
                         -> (f32[4,3], f32[5], f32[2,2]) mesh(dp=2) {
      %r1 = all_reduce(%g1) {axis="dp", group_size=2} : f32[4,3]
      %two = constant() {value=dense<f32[], 2.0>} : f32[]
      %d1 = div(%r1, %two) : f32[4,3]
      %u1 = sgd_update(%w1, %d1) : f32[4,3]
      %r2 = all_reduce(%g2) {axis="dp", group_size=2} : f32[5]
      %s2 = mul(%r2, %two) : f32[5]
      %u2 = sgd_update(%w2, %s2) : f32[5]
      %r3 = all_reduce(%g3) {axis="dp", group_size=2, op="avg"} : f32[2,2]
      %u3 = sgd_update(%w3, %r3) : f32[2,2]
      return %u1, %u2, %u3
    }""")
    rng = np.random.default_rng(3)
    inputs = [{v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs if v.role == "input"}
              for _ in range(2)]
    weights = [{v.name: np.full(v.type.shape, 0.5, np.float32) for v in g.inputs if v.role == "param"}] * 2
    want = run_mesh(g, mesh, inputs, weights)
    report = bucket_gradients(g)
    partita.verify(g)
    assert [b.members for b in report.buckets] == [("g1", "g2"), ("g3",)], report.text()
    assert_same_outputs(run_mesh(g, mesh, inputs, weights), want)
    div = ops(g, "div")[0]
    assert div.operands[0].producer.op == "reshape" and div.operands[0].name == "r1"
    assert ops(g, "mul")[0].operands[0].producer.op == "split"


# --- dependencies ------------------------------------------------------------------------------

def test_dependent_all_reduces_never_share_a_bucket():
    mesh = Mesh.of("dp=2")
    g = partita.parse("""graph @g(%x: f32[4], %w: f32[4], %z: f32[3]) -> (f32[4], f32[3]) mesh(dp=2) {
      %a = all_reduce(%x) {axis="dp", group_size=2} : f32[4]
      %y = mul(%a, %w) : f32[4]
      %b = all_reduce(%y) {axis="dp", group_size=2} : f32[4]
      %c = all_reduce(%z) {axis="dp", group_size=2} : f32[3]
      %e = add(%b, %a) : f32[4]
      return %e, %c
    }""")
    inputs = random_feeds(g, mesh)
    want = run_mesh(g, mesh, inputs)
    report = bucket_gradients(g, size_mb=1.0)
    partita.verify(g)
    assert [b.members for b in report.buckets] == [("x", "z"), ("y",)], report.text()
    assert report.after["all_reduce"] == 2
    assert_same_outputs(run_mesh(g, mesh, inputs), want)


def test_buckets_over_two_axes_never_form_a_cycle():
    # a2 needs b1 and b2 needs a1: fusing {a1, a2} and {b1, b2} would make each fused
    # collective wait for the other. Only one of the two pairs may be fused.
    mesh = Mesh.of("dp=2, tp=2")
    g = partita.parse("""graph @g(%x1: f32[4], %y1: f32[4], %w: f32[4]) -> (f32[4], f32[4]) mesh(dp=2, tp=2) {
      %a1 = all_reduce(%x1) {axis="dp", group_size=2} : f32[4]
      %b1 = all_reduce(%y1) {axis="tp", group_size=2} : f32[4]
      %p = mul(%b1, %w) : f32[4]
      %a2 = all_reduce(%p) {axis="dp", group_size=2} : f32[4]
      %q = add(%a1, %w) : f32[4]
      %b2 = all_reduce(%q) {axis="tp", group_size=2} : f32[4]
      return %a2, %b2
    }""")
    inputs = random_feeds(g, mesh, seed=4)
    want = run_mesh(g, mesh, inputs)
    report = bucket_gradients(g, size_mb=1.0)
    partita.verify(g)
    assert sorted(len(b.members) for b in report.buckets) == [1, 1, 2], report.text()
    assert [b.members for b in report.buckets if len(b.members) == 2] == [("x1", "p")]
    assert_same_outputs(run_mesh(g, mesh, inputs), want)


def test_consumers_between_members_move_after_the_bucket():
    mesh = Mesh.of("dp=2")
    g = partita.parse("""graph @g(%x: f32[2,3], %w: f32[6]) -> (f32[6]) mesh(dp=2) {
      %a = all_reduce(%x) {axis="dp", group_size=2} : f32[2,3]
      %u = relu(%a) : f32[2,3]
      %v = reshape(%u) {shape=[6]} : f32[6]
      %late = mul(%w, %w) : f32[6]
      %b = all_reduce(%late) {axis="dp", group_size=2} : f32[6]
      %s = add(%v, %b) : f32[6]
      return %s
    }""")
    inputs = random_feeds(g, mesh, seed=5)
    want = run_mesh(g, mesh, inputs)
    bucket_gradients(g)
    partita.verify(g)
    order = [n.op for n in g.nodes]
    assert order.index("mul") < order.index("all_reduce") < order.index("relu"), order
    assert order.count("all_reduce") == 1
    assert_same_outputs(run_mesh(g, mesh, inputs), want)


# --- reduce_scatter (ZeRO-2 gradients) -------------------------------------------------------------

def test_reduce_scatter_fusion_by_hand():
    mesh = Mesh.of("dp=4")
    g = partita.parse("""graph @g(%a: f32[8], %b: f32[4,6], %c: f32[12,2,3], %d: f32[4,4], %e: f32[8])
        -> (f32[2], f32[1,6], f32[3,2,3], f32[4,1], f32[2]) mesh(dp=4) {
      %ra = reduce_scatter(%a) {axis="dp", group_size=4, dim=0} : f32[2]
      %rb = reduce_scatter(%b) {axis="dp", group_size=4, dim=-2} : f32[1,6]
      %rc = reduce_scatter(%c) {axis="dp", group_size=4, dim=0} : f32[3,2,3]
      %rd = reduce_scatter(%d) {axis="dp", group_size=4, dim=1} : f32[4,1]
      %re = reduce_scatter(%e) {axis="dp", group_size=4, dim=0, op="max"} : f32[2]
      return %ra, %rb, %rc, %rd, %re
    }""")
    inputs = random_feeds(g, mesh, seed=6)
    want = run_mesh(g, mesh, inputs)
    report = bucket_gradients(g)
    partita.verify(g)
    # A scatter of dim 1 is left alone (no bucket); max is bucketed apart from sum.
    assert sorted(b.members for b in report.buckets) == [("a", "b", "c"), ("e",)], report.text()
    assert report.before["reduce_scatter"] == 5 and report.after["reduce_scatter"] == 3
    fused = next(n for n in ops(g, "reduce_scatter") if n.operands[0].producer.op == "concat")
    assert fused.attrs["dim"] == 0 and fused.operands[0].type.shape == (4, 2 + 6 + 18)
    assert_same_outputs(run_mesh(g, mesh, inputs), want)


def test_zero2_training_step_reduce_scatters_are_bucketed(forward):
    step, local = training_program(forward, zero2=True)
    scatters = [n for n in ops(local, "reduce_scatter") if n.attrs["dim"] == 0]
    assert len(scatters) >= 3, print_graph(local)
    inputs, weights = feeds(step, seed=2)
    want = run_mesh(local, step.mesh, inputs, weights)
    report = bucket_gradients(local, size_mb=25.0)
    partita.verify(local)
    rs = [b for b in report.buckets if b.op == "reduce_scatter"]
    assert len(rs) == 1 and len(rs[0].members) == len(scatters), report.text()
    assert report.after["reduce_scatter"] == report.before["reduce_scatter"] - len(scatters) + 1
    assert_same_outputs(run_mesh(local, step.mesh, inputs, weights), want)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["all_reduce", "reduce_scatter"]),
                          st.lists(st.integers(1, 3), min_size=0, max_size=2),
                          st.booleans()), min_size=1, max_size=6),
       st.integers(8, 200), st.integers(0, 2 ** 31 - 1))
def test_random_buckets_keep_every_result(members, limit, seed):
    # Random collectives (some chained onto an earlier result) and a random byte limit: the
    # bucketed program gives every rank the same results.
    mesh = Mesh.of("dp=2")
    g = Graph("g")
    g.mesh = mesh
    b = Builder(g)
    outs = []
    for i, (op, rest, chain) in enumerate(members):
        shape = (2 * (1 + i % 2), *rest)
        x = b.input(f"x{i}", TensorType(shape, f32))
        if chain and outs and outs[-1].type.numel == x.type.numel and op == "all_reduce":
            x = b.add(x, b.reshape(outs[-1], shape=shape))
        if op == "all_reduce":
            outs.append(b.all_reduce(x, axis="dp", group_size=2))
        else:
            outs.append(b.reduce_scatter(x, axis="dp", group_size=2, dim=0))
    b.ret(*outs)
    inputs = random_feeds(g, mesh, seed=seed % 1000)
    want = run_mesh(g, mesh, inputs)
    report = bucket_gradients(g, size_mb=limit / MB)
    partita.verify(g)
    assert all(b.bytes <= limit or len(b.members) == 1 for b in report.buckets)
    assert sum(len(b.members) for b in report.buckets) == len(members)
    assert_same_outputs(run_mesh(g, mesh, inputs), want)


# --- order-collectives ------------------------------------------------------------------------------

def test_order_is_the_same_for_any_insertion_order(forward):
    step, local = training_program(forward)
    bucket_gradients(local, size_mb=5000 / MB)
    partita.verify(local)
    inputs, weights = feeds(step, seed=7)
    want = run_mesh(local, step.mesh, inputs, weights)
    # The same program with its nodes appended in another valid order: the latest ready
    # node first, which swaps independent collectives.
    other, node_map = rebuilt_in_order(local, lambda p: -p)
    seq = lambda g: [n for n in g.nodes if n.op in ("all_reduce", "all_gather", "shard_slice")]
    assert [node_map[n] for n in seq(local)] != seq(other)
    with pytest.raises(CollectiveOrderError):
        check_collective_order([local, other], step.mesh)

    order_a = order_collectives(local)
    partita.verify(local)
    order_b = order_collectives(other)
    partita.verify(other)
    assert [node_map[n] for n in order_a] == order_b
    assert order_a == seq(local) and order_b == seq(other)
    check_collective_order([local, other], step.mesh)
    # Rank 0 runs one build, rank 1 the other: they meet in every collective.
    assert_same_outputs(run_mesh([local, other], step.mesh, inputs, weights), want)
    # Idempotent: ordering an ordered graph changes nothing.
    before = local.clone()
    assert order_collectives(local) == order_a and local.diff(before) is None


def test_collectives_are_issued_as_early_as_their_operands_allow():
    g = partita.parse("""graph @g(%x: f32[4], %y: f32[4]) -> (f32[4]) mesh(dp=2) {
      %h = mul(%x, %x) : f32[4]
      %k = exp(%h) : f32[4]
      %m = add(%k, %h) : f32[4]
      %a = all_reduce(%y) {axis="dp", group_size=2} : f32[4]
      %b = all_reduce(%h) {axis="dp", group_size=2} : f32[4]
      %s = add(%m, %a) : f32[4]
      %t = add(%s, %b) : f32[4]
      return %t
    }""")
    mesh = Mesh.of("dp=2")
    inputs = random_feeds(g, mesh, seed=8)
    want = run_mesh(g, mesh, inputs)
    order = order_collectives(g)
    partita.verify(g)
    assert [n.operands[0].name for n in order] == ["y", "h"]
    assert [n.op for n in g.nodes] == ["all_reduce", "mul", "all_reduce", "exp", "add", "add", "add"]
    assert_same_outputs(run_mesh(g, mesh, inputs), want)


def test_keep_order_hoists_collectives_and_moves_nothing_else():
    # A pipeline rank's program: the compute follows the schedule (here: microbatch 1's
    # backward part %u before microbatch 2's forward %f2, whose all_gather is ready earlier).
    # Ordering by readiness would pull %f2 and its gather above %u; keep_order only moves the
    # collectives up, in their order, and leaves every other node where it was.
    g = partita.parse("""graph @g(%x: f32[4], %y: f32[4]) -> (f32[4], f32[8]) mesh(dp=2) {
      %h = mul(%x, %x) : f32[4]
      %u = exp(%h) : f32[4]
      %v = add(%u, %h) : f32[4]
      %f2 = mul(%y, %y) : f32[4]
      %a = all_reduce(%v) {axis="dp", group_size=2} : f32[4]
      %g2 = all_gather(%f2) {axis="dp", group_size=2, dim=0} : f32[8]
      %b = all_reduce(%h) {axis="dp", group_size=2} : f32[4]
      %s = add(%a, %b) : f32[4]
      return %s, %g2
    }""")
    mesh = Mesh.of("dp=2")
    inputs = random_feeds(g, mesh, seed=9)
    want = run_mesh(g, mesh, inputs)
    compute_before = [n.results[0].name for n in g.nodes if n.op not in ("all_reduce", "all_gather")]
    order = order_collectives(g, keep_order=True)
    partita.verify(g)
    assert [n.results[0].name for n in order] == ["a", "g2", "b"]
    assert [n.results[0].name for n in g.nodes if n.op not in ("all_reduce", "all_gather")] == compute_before
    # %a right after %v; %g2 (its operand is ready) keeps its place after %a; %b after %g2.
    assert [n.results[0].name for n in g.nodes] == ["h", "u", "v", "a", "f2", "g2", "b", "s"]
    assert_same_outputs(run_mesh(g, mesh, inputs), want)


def test_check_collective_order_names_the_swapped_pair():
    mesh = Mesh.of("dp=2")
    text = """graph @g(%x: f32[4], %y: f32[6]) -> (f32[4], f32[6]) mesh(dp=2) {
      %a = all_reduce(%x) {axis="dp", group_size=2} : f32[4]
      %b = all_reduce(%y) {axis="dp", group_size=2} : f32[6]
      return %a, %b
    }"""
    rank0 = partita.parse(text, "rank0.pir")
    rank1 = partita.parse(text.replace("%a = all_reduce(%x) {axis=\"dp\", group_size=2} : f32[4]\n", "")
                          .replace("return %a, %b", "%a = all_reduce(%x) {axis=\"dp\", group_size=2} : f32[4]\n"
                                   "      return %a, %b"), "rank1.pir")
    check_collective_order([rank0, rank0], mesh)
    with pytest.raises(CollectiveOrderError) as e:
        check_collective_order([rank0, rank1], mesh)
    msg = str(e.value)
    assert "ranks 0 and 1" in msg and "1st collective over 'dp' (position 0)" in msg, msg
    assert "rank 0 issues all_reduce(f32[4])" in msg and "rank 1 issues all_reduce(f32[6])" in msg, msg
    assert "rank0.pir" in msg and "rank1.pir" in msg and "order-collectives" in msg, msg

    missing = partita.parse("""graph @g(%x: f32[4], %y: f32[6]) -> (f32[4], f32[6]) mesh(dp=2) {
      %a = all_reduce(%x) {axis="dp", group_size=2} : f32[4]
      return %a, %y
    }""")
    with pytest.raises(CollectiveOrderError, match=r"2nd collective .* rank 1 issues no collective"):
        check_collective_order([rank0, missing], mesh)
    with pytest.raises(CollectiveOrderError, match=r"group_size=2, but axis 'dp' of mesh\(dp=4\) has 4 ranks"):
        check_collective_order(rank0, "dp=4")
    with pytest.raises(CollectiveOrderError, match="3 per-rank graphs for the 2 ranks"):
        check_collective_order([rank0] * 3, mesh)


def test_check_collective_order_per_axis_group():
    # On mesh(dp=2, tp=2) ranks 0 and 2 form a dp group, ranks 0 and 1 a tp group; a
    # different order across axes is fine, a different order along one axis is not.
    mesh = Mesh.of("dp=2, tp=2")
    a = partita.parse("""graph @g(%x: f32[4], %y: f32[6]) -> (f32[4], f32[6]) mesh(dp=2, tp=2) {
      %p = all_reduce(%x) {axis="dp", group_size=2} : f32[4]
      %q = all_reduce(%y) {axis="tp", group_size=2} : f32[6]
      return %p, %q
    }""")
    b = partita.parse("""graph @g(%x: f32[4], %y: f32[6]) -> (f32[4], f32[6]) mesh(dp=2, tp=2) {
      %q = all_reduce(%y) {axis="tp", group_size=2} : f32[6]
      %p = all_reduce(%x) {axis="dp", group_size=2} : f32[4]
      return %p, %q
    }""")
    check_collective_order([a, b, a, b], mesh)
    c = partita.parse("""graph @g(%x: f32[4], %y: f32[6]) -> (f32[4], f32[6]) mesh(dp=2, tp=2) {
      %p = all_reduce(%x) {axis="dp", group_size=2, op="max"} : f32[4]
      %q = all_reduce(%y) {axis="tp", group_size=2} : f32[6]
      return %p, %q
    }""")
    with pytest.raises(CollectiveOrderError, match=re.escape("ranks 1 and 3 (group [1, 3] of axis 'dp')")):
        check_collective_order([a, b, a, c], mesh)


# --- the passes ------------------------------------------------------------------------------------

def test_pipeline_runs_both_passes(forward):
    step, local = training_program(forward)
    inputs, weights = feeds(step, seed=9)
    want = run_mesh(local, step.mesh, inputs, weights)
    pm = PassManager.parse("bucket-gradients{size-mb=0.004},order-collectives", verify_each=True,
                           reproducer_dir=None)
    out = pm.run(local)
    partita.verify(out)
    bucket_pass, order_pass = pm.passes
    assert bucket_pass.report is not None and len(bucket_pass.report.fused) >= 1
    assert order_pass.order == [n for n in out.nodes if n.op in ("all_reduce", "all_gather", "shard_slice")]
    assert "bucket-gradients (limit 4194 bytes)" in bucket_pass.report.text()
    assert_same_outputs(run_mesh(out, step.mesh, inputs, weights), want)
    assert pm.pipeline_text() == "bucket-gradients{size-mb=0.004},order-collectives"


def test_bad_size_is_an_error():
    g = partita.parse("""graph @g(%x: f32[4]) -> (f32[4]) mesh(dp=2) {
      %a = all_reduce(%x) {axis="dp", group_size=2} : f32[4]
      return %a
    }""")
    with pytest.raises(BucketError, match=r"@g: bucket-gradients needs size_mb > 0 .* got 0"):
        bucket_gradients(g, size_mb=0)
    with pytest.raises(BucketError, match="got nan"):
        bucket_gradients(g, size_mb=float("nan"))
    with pytest.raises(PassError, match="size-mb must be a positive number"):
        PassManager.parse("bucket-gradients{size-mb=-1.0}")


# --- torch.distributed: the fused program on two gloo ranks -----------------------------------------

GLOO_PROGRAM = """graph @g(%a: f32[4,3], %b: f32[6], %c: f32[8], %d: f32[2,3,2]) -> (f32[4,3], f32[6], f32[4], f32[1,3,2])
    mesh(dp=2) {
  %ra = all_reduce(%a) {axis="dp", group_size=2} : f32[4,3]
  %rb = all_reduce(%b) {axis="dp", group_size=2} : f32[6]
  %rc = reduce_scatter(%c) {axis="dp", group_size=2, dim=0} : f32[4]
  %rd = reduce_scatter(%d) {axis="dp", group_size=2, dim=0} : f32[1,3,2]
  return %ra, %rb, %rc, %rd
}"""


def _gloo_worker(rank: int, port: int, results) -> None:
    try:
        import torch
        import torch.distributed as dist

        from partita.parallel import comm

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        failures = []
        mesh = Mesh.of("dp=2")
        g = partita.parse(GLOO_PROGRAM)
        inputs = random_feeds(g, mesh, seed=11)
        want = run_mesh(g, mesh, inputs)[rank]
        report = bucket_gradients(g)
        order_collectives(g)
        partita.verify(g)
        if report.after != {"all_reduce": 1, "reduce_scatter": 1}:
            failures.append(f"rank {rank}: unexpected buckets\n{report.text()}")
        with comm.use_groups(comm.new_mesh_groups(mesh)):
            got = partita.run(g, {k: torch.from_numpy(v.copy()) for k, v in inputs[rank].items()}, backend="torch")
        for i, (x, y) in enumerate(zip(got, want)):
            x = x.numpy()
            if x.shape != y.shape or not np.allclose(x, y, rtol=0, atol=ATOL):
                failures.append(f"rank {rank}, output {i}: got {x}, want {y}")
        dist.destroy_process_group()
        results.put((rank, failures))
    except BaseException:  # the parent must hear of any failure rather than wait for it
        import traceback
        results.put((rank, [traceback.format_exc()]))


@pytest.mark.timeout(120)
def test_fused_program_runs_on_two_gloo_ranks():
    from gloo_ranks import assert_all_ranks_passed, run_on_gloo_ranks

    assert_all_ranks_passed(run_on_gloo_ranks(_gloo_worker))


def test_an_all_gather_is_issued_where_its_result_is_read():
    # Issued early, a gathered tensor (a zero3 param) would be alive from the step's start:
    # all_gather is ordered by when it is read and sinks to just before its reader.
    g = partita.parse("""graph @g(%x: f32[4], %w: f32[2]) -> (f32[4]) mesh(dp=2) {
      %full = all_gather(%w) {axis="dp", group_size=2, dim=0} : f32[4]
      %h = mul(%x, %x) : f32[4]
      %k = exp(%h) : f32[4]
      %a = all_reduce(%k) {axis="dp", group_size=2} : f32[4]
      %m = add(%a, %h) : f32[4]
      %t = mul(%m, %full) : f32[4]
      return %t
    }""")
    mesh = Mesh.of("dp=2")
    inputs = random_feeds(g, mesh, seed=9)
    want = run_mesh(g, mesh, inputs)
    order = order_collectives(g)
    partita.verify(g)
    assert [n.op for n in order] == ["all_reduce", "all_gather"]
    assert [n.op for n in g.nodes] == ["mul", "exp", "all_reduce", "add", "all_gather", "mul"]
    assert_same_outputs(run_mesh(g, mesh, inputs), want)
