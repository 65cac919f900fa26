"""simulate's ``grad_sums``: a pipeline's per-microbatch gradient sums priced as adds (the
program as written) or in the epilogue of the matrix product that computes each gradient
(``"gemm"``, Megatron-LM's gradient-accumulation fusion): exactly the adds of the GEMM-made
gradients taken out and ``CostModel.sum_in_gemm`` put in, nothing else moved; and the values
and programs it refuses."""

from __future__ import annotations

import pytest

import partita
from partita.cluster import parse_cluster
from partita.cluster.cost import CostModel
from partita.cluster.simulator import SimulationError, simulate
from partita.ir.builder import Builder
from partita.ir.graph import Graph
from partita.ir.types import TensorType
from partita.ops.kinds import GEMM_OPS

# One node of 4 devices, slow memory: the adds of the gradient sums are worth pricing.
NODE = '''
name = "one-node"
nodes = 1
gpus_per_node = 4

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

M = 4


@pytest.fixture(scope="module")
def step():
    fwd = partita.models.gpt(layers=4, hidden=64, heads=4, seq=16, vocab=128, batch=8, dtype="f32")
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")


@pytest.fixture(scope="module")
def cluster():
    return parse_cluster(NODE)


def _pipeline(step, unroll: bool = False):
    return partita.parallelize(step, mesh="pp=2,tp=2", strategy="pp+megatron", microbatches=M, schedule="1f1b",
                               unroll=unroll)


def _add_time(model: CostModel, ty: TensorType) -> float:
    g = Graph("priced")
    x, y = g.add_input("x", ty, "input"), g.add_input("y", ty, "input")
    node = Builder(g).add(x, y).producer
    assert node is not None
    return model.compute_time(node).seconds


def test_gemm_sums_take_out_exactly_the_adds_of_gemm_gradients(step, cluster):
    prog = _pipeline(step)
    plain = simulate(prog, cluster, trace=False, memory=False)
    fused = simulate(prog, cluster, trace=False, memory=False, grad_sums="gemm")
    model = CostModel(cluster)
    for r0, r1 in zip(plain.ranks, fused.ranks):
        assert r0.rank == r1.rank
        t = prog.templates[prog.coords(r0.rank)[0]]
        saved = 0.0
        gemm_made = 0
        for gs in t.chunk_grads.values():
            for _, gv in gs:
                if gv.producer is not None and gv.producer.op in GEMM_OPS:
                    gemm_made += 1
                    extra = model.sum_in_gemm(gv.producer, gv.type).seconds
                    assert 0.0 <= extra < _add_time(model, gv.type)
                    saved += (M - 1) * (_add_time(model, gv.type) - extra)
        assert gemm_made > 0
        assert r0.compute - r1.compute == pytest.approx(saved, rel=1e-9)
        assert r1.flops == pytest.approx(r0.flops, rel=1e-12)
    assert fused.step_time < plain.step_time
    assert fused.hardware_flops == pytest.approx(plain.hardware_flops, rel=1e-12)


def test_sum_in_gemm_is_free_when_the_product_is_compute_bound(cluster):
    model = CostModel(cluster)
    g = Graph("priced")
    f32 = partita.ir.dtypes.f32
    x = g.add_input("a", TensorType((1024, 2048), f32), "input")
    w = g.add_input("b", TensorType((2048, 1024), f32), "input")
    mm = Builder(g).matmul(x, w).producer
    assert mm is not None and mm.op in GEMM_OPS
    assert model.sum_in_gemm(mm, mm.results[0].type).seconds == 0.0
    # On a device with slow memory the same product is memory-bound: the sum's read costs
    # what the fused kernel's extra bytes cost, beyond the product's own time.
    slow = CostModel(parse_cluster(NODE.replace('memory_bandwidth = "100 GB/s"', 'memory_bandwidth = "1 GB/s"')))
    x1, c = mm.operands[0], slow.record_cost(mm)
    own = slow.compute_time(mm).seconds - slow.eff.op_overhead
    moved = c.bytes_read + c.bytes_written + mm.results[0].type.nbytes
    extra = slow.sum_in_gemm(mm, mm.results[0].type)
    assert extra.seconds == pytest.approx(moved / (1e9 * slow.eff.memory) - own, rel=1e-12)
    assert extra.seconds > 0.0
    add = Builder(g).add(x1, x1).producer
    assert add is not None
    with pytest.raises(ValueError, match="not a matrix product"):
        model.sum_in_gemm(add, x1.type)


def test_grad_sums_refuses_what_it_cannot_price(step, cluster):
    with pytest.raises(SimulationError, match="grad_sums must be one of 'add', 'gemm', got 'fused'"):
        simulate(_pipeline(step), cluster, trace=False, memory=False, grad_sums="fused")
    with pytest.raises(SimulationError, match="unroll=False"):
        simulate(_pipeline(step, unroll=True), cluster, trace=False, memory=False, grad_sums="gemm")


def test_grad_sums_changes_nothing_without_a_pipeline(step, cluster):
    prog = partita.parallelize(step, mesh="tp=4", strategy="megatron")
    a = simulate(prog, cluster, trace=False, memory=False)
    b = simulate(prog, cluster, trace=False, memory=False, grad_sums="gemm")
    assert a.step_time == b.step_time
