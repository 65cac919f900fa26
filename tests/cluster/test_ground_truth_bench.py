"""bench/bench_ground_truth.py stays runnable: its rank correlation, and its six plans
simulated (no launches) on a cluster file of ranks that share their cores."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

SHARED = '''
name = "two-cores"
nodes = 1
gpus_per_node = 4
cores_per_node = 2

[device]
name = "a CPU rank"
memory = "6 GB"
memory_bandwidth = "25 GB/s"
cache = "8 MB"
cache_bandwidth = "90 GB/s"

[device.peak_flops]
f32 = "100 GFLOP/s"
f64 = "50 GFLOP/s"

[intra_node]
bandwidth = "2 GB/s"
latency = "75 us"

[intra_node.collectives]
all_reduce = { latency = "250 us", bandwidth = "600 MB/s" }
send_recv = { latency = "75 us", bandwidth = "1.5 GB/s" }

[inter_node]
bandwidth = "2 GB/s"
latency = "75 us"

[efficiency]
gemm = 1.0
gemm_knee = 12
attention = 0.8
memory = 0.13
op_overhead = "1.5 us"
network = 1.0
'''


@pytest.fixture(scope="module")
def gt():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_ground_truth
    finally:
        sys.path.remove(str(BENCH))
    return bench_ground_truth


def test_spearman(gt):
    assert gt.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert gt.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Two plans swapped among six: 1 - 6 * 2 / (6 * 35).
    assert gt.spearman([1, 2, 3, 4, 5, 6], [1, 2, 4, 3, 5, 6]) == pytest.approx(1 - 12 / 210)
    assert gt.spearman([1, 1, 2], [1, 1, 2]) == pytest.approx(1.0)   # ties take their mean rank


@pytest.mark.timeout(300)
def test_the_six_plans_simulate_on_shared_cores(gt, tmp_path, monkeypatch, capsys):
    path = tmp_path / "two-cores.toml"
    path.write_text(SHARED)
    out = tmp_path / "gt.json"
    monkeypatch.setattr(sys, "argv", ["bench_ground_truth.py", "--cluster", str(path), "--simulate-only",
                                      "--out", str(out)])
    gt.main()
    text = capsys.readouterr().out
    for plan in gt.PLANS:
        assert f"{plan}: simulated" in text
    times = {line.split(":")[0].strip(): float(line.split()[-2]) for line in text.splitlines() if "simulated" in line}
    assert set(times) == set(gt.PLANS) and all(t > 0 for t in times.values())
    assert not out.exists()   # --simulate-only writes no table of measurements
