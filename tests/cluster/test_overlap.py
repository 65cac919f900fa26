"""The simulator prices the overlap the runtime implements (``TorchProgram(overlap=True)``):
zero3's prefetched param all_gathers run on the dp stream while the compute goes on, the
gradient reduce_scatters are started where they stand and waited for where they are read;
the compute stream waits only for what is not yet done."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

import partita
from partita.cluster import Efficiency, parse_cluster
from partita.cluster.simulator import simulate
from partita.ir.mesh import Mesh
from partita.models.gpt import gpt

# Round figures (1 GB/s links with 1 us latency, 1 GFLOP/s, 1 GB/s memory), as in
# test_simulator.py: every time below is bytes / 1e9 or flops / 1e9.
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

SCATTER = """graph @g(%x: f32[512], %w: f32[1024]) -> (f32[512]) mesh(dp=2) {
  %a = reduce_scatter(%w) {axis="dp", group_size=2, dim=0} : f32[512]
  %h = exp(%x) : f32[512]
  %s = add(%h, %a) : f32[512]
  return %s
}"""


def toy():
    c = parse_cluster(TOY)
    return dataclasses.replace(c, efficiency=Efficiency(gemm=1.0, gemm_knee=0.0, attention=1.0, memory=1.0,
                                                        op_overhead=0.0, network=1.0))


def one_program(mesh: str, text: str):
    m = Mesh.of(mesh)
    g = partita.parse(text)
    return SimpleNamespace(mesh=m, rank_graphs=lambda: [g] * m.size, single_device=None)


def test_a_reduce_scatter_overlaps_the_compute_until_its_result_is_read():
    r = simulate(one_program("dp=2", SCATTER), toy(), memory=False, fuse_groups=False)    # exp and add apart
    rs = 1e-6 + 0.5 * 4096 / 1e9            # 3.048 us on the dp stream
    exp_t, add_t = 2 * 2048 / 1e9, 3 * 2048 / 1e9
    assert rs < exp_t
    assert r.step_time == pytest.approx(exp_t + add_t)
    assert r.ranks[0].waiting == pytest.approx(0.0)
    assert r.ranks[0].comm["dp"] == pytest.approx(rs)


def _overlap(events, rank: int, op: str) -> float:
    """Seconds the ``op`` spans of rank's dp stream run while its compute stream computes."""
    comp = [(e.start, e.end) for e in events if e.rank == rank and e.stream == "compute"]
    comm = [(e.start, e.end) for e in events if e.rank == rank and e.stream == "comm:dp" and e.name == op]
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in comm for c, d in comp)


@pytest.fixture(scope="module")
def zero3_gpt():
    fwd = gpt(4, 256, 4, 128, 1024, batch=8, dtype="bf16")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    return step


def test_zero3_gathers_and_reduce_scatters_overlap_the_compute(zero3_gpt):
    """On a zero3 GPT, each kind of dp traffic runs partly while the compute stream computes,
    and the compute stream waits less than the dp stream is busy."""
    prog = partita.parallelize(zero3_gpt, "dp=8", "zero3")
    r = simulate(prog, "dgx-a100-40gb", memory=False)
    rank = r.ranks[0]
    assert rank.waiting < rank.comm["dp"]
    assert _overlap(r.events, rank.rank, "all_gather") > 0
    assert _overlap(r.events, rank.rank, "reduce_scatter") > 0


def test_prefetch_hides_more_of_the_gathers_than_just_in_time(zero3_gpt):
    """prefetch=1 (the default) issues each param gather one gather ahead: the step is no
    slower than just in time (prefetch=0), and the compute waits less."""
    got = {p: simulate(partita.parallelize(zero3_gpt, "dp=8", "zero3", prefetch=p), "dgx-a100-40gb", memory=False)
           for p in (0, 1)}
    assert got[1].step_time <= got[0].step_time * (1 + 1e-9)
    assert got[1].ranks[0].waiting < got[0].ranks[0].waiting
