"""Efficiency.stream: the streaming ops (optimizer updates, concat, split) priced at their own
fraction of the memory bandwidth where a cluster file measured it, everything else as before;
files without it (every shipped accelerator file) price exactly as before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import partita
from partita.cluster import Cluster, ClusterError, Device, Efficiency, Link, load_cluster, parse_cluster
from partita.cluster.calibrate import cluster_toml, measure_stream, write_cluster
from partita.cluster.cost import STREAM_OPS, CostModel

SHIPPED = ("selene", "dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "dgx-h200", "meta-h100-roce",
           "grand-teton-h100-500w")


def _cpu(stream: float | None) -> Cluster:
    device = Device("a CPU, 1 thread(s)", {"f32": 1e11}, 2e10, 6e9, 8e6, 9e10)
    link = Link(1e9, 8e-5)
    eff = Efficiency(gemm=1.0, gemm_knee=12.0, attention=0.8, memory=0.14, op_overhead=1.4e-6, network=1.0,
                     stream=stream)
    return Cluster("cpu", device, 1, 4, link, link, efficiency=eff, cores_per_node=2)


def _step() -> partita.Graph:
    fwd = partita.models.gpt(layers=1, hidden=64, heads=2, seq=16, vocab=128, batch=2, dtype="f32")
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")


def test_stream_prices_the_streaming_ops_and_nothing_else():
    step = _step()
    base, fast = CostModel(_cpu(None)), CostModel(_cpu(0.56))
    seen = set()
    for n in step.nodes:
        if n.op in ("input", "output", "constant"):
            continue
        a, b = base.compute_time(n), fast.compute_time(n)
        if n.op in STREAM_OPS and a.kind == "memory":
            seen.add(n.op)
            assert b.seconds - 1.4e-6 == pytest.approx((a.seconds - 1.4e-6) * 0.14 / 0.56), n.op
        else:
            assert a == b, n.op
    assert "adamw_update" in seen


def test_no_stream_is_memory_for_every_op():
    m = CostModel(_cpu(None))
    assert all(m.memory_efficiency(op) == 0.14 for op in (*STREAM_OPS, "gelu", "add"))
    m = CostModel(_cpu(0.5))
    assert m.memory_efficiency("adamw_update") == 0.5 and m.memory_efficiency("gelu") == 0.14


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_accelerator_files_have_no_stream(name: str):
    assert load_cluster(name).efficiency.stream is None


def test_stream_round_trips_through_the_cluster_file(tmp_path: Path):
    c = _cpu(0.6183)
    back = load_cluster(write_cluster(c, tmp_path / "m.toml"))
    assert replace(back, source="") == c and back.efficiency.stream == 0.6183
    none = _cpu(None)
    assert "stream" not in cluster_toml(none)
    assert replace(load_cluster(write_cluster(none, tmp_path / "n.toml")), source="") == none


def test_a_bad_stream_is_refused_with_its_place():
    text = cluster_toml(_cpu(0.5)).replace("stream = 0.5", "stream = 7.0")
    with pytest.raises(ClusterError, match="stream"):
        parse_cluster(text)


def test_measure_stream_gives_a_fraction():
    torch = pytest.importorskip("torch")
    frac, spread = measure_stream(torch, 2 ** 16, 2, 0.001, 2e10)
    assert 0 < frac <= 1.0 and spread >= 0
