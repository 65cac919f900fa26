"""On shared cores (CPU ranks on one node over loopback, ``cores_per_node``) a collective the
runtime overlaps with compute keeps a core busy for its whole measured time: the compute
beside it slows, and the step does not depend on how the smallest measured message's time
compares with the gathered size's (a zero3 step once fell 20% on one calibration because
the 4-byte all_gather, measured slower than a 1 MB one, was taken for pure latency)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

import partita
from partita.cluster import Efficiency, parse_cluster
from partita.cluster.simulator import simulate
from partita.ir.mesh import Mesh

TOY = '''
name = "toy"
nodes = 1
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
bandwidth = "1 GB/s"
latency = "1 us"
'''

# The gather is issued, then computed beside (exp), then read: the runtime's overlap.
GATHER = """graph @g(%x: f32[4096], %w: f32[2048]) -> (f32[4096]) mesh(dp=2) {
  %a = all_gather(%w) {axis="dp", group_size=2, dim=0} : f32[4096]
  %h = exp(%x) : f32[4096]
  %s = add(%h, %a) : f32[4096]
  return %s
}"""

COMPUTE_ONLY = """graph @g(%x: f32[4096], %w: f32[4096]) -> (f32[4096]) mesh(dp=2) {
  %h = exp(%x) : f32[4096]
  %s = add(%h, %w) : f32[4096]
  return %s
}"""


def cluster(small_s: float, cores: int | None = 1):
    """The toy node with an all_gather measured at 4 B (``small_s``) and 16 KB (20 us) on 2 ranks."""
    c = parse_cluster(TOY)
    link = dataclasses.replace(c.intra_node, measured=(("all_gather", 2, ((4.0, small_s), (16384.0, 2e-5))),))
    eff = Efficiency(gemm=1.0, gemm_knee=0.0, attention=1.0, memory=1.0, op_overhead=0.0, network=1.0)
    return dataclasses.replace(c, intra_node=link, inter_node=link, efficiency=eff, cores_per_node=cores)


def program(text: str):
    m = Mesh.of("dp=2")
    g = partita.parse(text)
    return SimpleNamespace(mesh=m, rank_graphs=lambda: [g] * m.size, single_device=None)


def step(text: str, c) -> float:
    return simulate(program(text), c, memory=False).step_time


def test_an_overlapped_gather_is_priced_alike_whatever_the_smallest_message_measured():
    # 4 B measured faster than the gathered 16 KB, or slower (a noisy calibration point):
    # the gather's 16 KB time is the same 20 us, and so must be the step.
    assert step(GATHER, cluster(1e-6)) == pytest.approx(step(GATHER, cluster(5e-5)), rel=1e-6)


def test_an_overlapped_gather_takes_a_core_on_shared_cores():
    shared = step(GATHER, cluster(5e-5))
    own_cores = step(GATHER, cluster(5e-5, cores=None))
    exp_t = 2 * 4096 * 4 / 1e9
    # Two ranks on one core compute at half speed; their gathers (20 us each, beside the exp)
    # take the core too, so the step is longer than the two computations alone would make it.
    alone_on_shared = step(COMPUTE_ONLY, cluster(5e-5))
    assert own_cores < alone_on_shared < shared
    assert shared > 2 * exp_t
