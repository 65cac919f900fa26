"""``partita calibrate`` (partita/cluster/calibrate.py): the fits recover known alpha, beta,
gemm and knee from synthetic timings; a calibrated cluster's file reads back equal; and a
quick calibration on 2 gloo ranks runs and writes a cluster file with positive figures. No
assertion depends on how fast this machine is."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from partita.cluster import Cluster, ClusterError, Device, Efficiency, Link, load_cluster, parse_cluster
from partita.cluster.calibrate import (COLLECTIVE_MODELS, CalibrationError, cluster_toml, fit_alpha_beta,
                                       fit_collectives, fit_gemm_knee, gemm_model, measure, measure_gloo,
                                       message_sizes, summary_rows, write_cluster)

SIZES = [4 * 4 ** i for i in range(13)]          # 4 B .. 64 MiB, as a full calibration


def _noisy(x: np.ndarray, seed: int, spread: float = 0.02) -> np.ndarray:
    return x * np.exp(np.random.default_rng(seed).normal(0.0, spread, x.shape))


@pytest.mark.parametrize("collective, n", [("all_reduce", 4), ("all_gather", 4), ("reduce_scatter", 8),
                                           ("send_recv", 2), ("broadcast", 4)])
def test_fit_alpha_beta_recovers_the_link_of_each_model(collective, n):
    alpha, beta = 50e-6, 2e9
    a, b = COLLECTIVE_MODELS[collective](n)
    s = np.array(SIZES, dtype=float)
    t = _noisy(a * alpha + b * s / beta, seed=n)
    fit = fit_alpha_beta(s, t, [a] * len(s), [b] * len(s))
    assert fit.alpha == pytest.approx(alpha, rel=0.05)
    assert fit.beta == pytest.approx(beta, rel=0.05)
    assert fit.error < 0.05 and fit.points == len(s)


def test_fit_alpha_beta_exact_data_is_fitted_exactly():
    s = np.array(SIZES, dtype=float)
    fit = fit_alpha_beta(s, 2 * 3 * 10e-6 + 2 * 3 / 4 * s / 1e9, [6.0] * len(s), [1.5] * len(s))
    assert fit.alpha == pytest.approx(10e-6, rel=1e-9) and fit.beta == pytest.approx(1e9, rel=1e-9)
    assert fit.error < 1e-9


def test_fit_alpha_beta_keeps_alpha_and_beta_positive():
    s = np.array(SIZES, dtype=float)
    # Pure bandwidth: no latency shows, and alpha must not go negative to fit the noise.
    bw = fit_alpha_beta(s, _noisy(s / 1e9 + 1e-12, seed=1), [2.0] * len(s), [1.0] * len(s))
    assert bw.alpha >= 0 and bw.beta == pytest.approx(1e9, rel=0.1)
    # Pure latency (tiny messages, the same time each): a finite bandwidth, alpha recovered.
    small = np.array([4.0, 8.0, 16.0, 32.0])
    lat = fit_alpha_beta(small, np.full(4, 1e-4) * np.array([1.0, 0.98, 1.01, 0.97]), [1.0] * 4, [1.0] * 4)
    assert lat.alpha == pytest.approx(1e-4, rel=0.05)
    assert 0 < lat.beta < math.inf


def test_fit_alpha_beta_refuses_too_few_or_bad_timings():
    with pytest.raises(ValueError, match="at least two positive"):
        fit_alpha_beta([4.0], [1e-5], [1.0], [1.0])
    with pytest.raises(ValueError, match="at least two positive"):
        fit_alpha_beta([4.0, 8.0], [1e-5, 0.0], [1.0, 1.0], [1.0, 1.0])


def test_fit_collectives_fits_each_and_the_link_together():
    n, alpha, beta = 4, 80e-6, 1.5e9
    medians = {}
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv"):
        a, b = COLLECTIVE_MODELS[name](2 if name == "send_recv" else n)
        medians[name] = {s: a * alpha + b * s / beta for s in SIZES}
    fits = fit_collectives(medians, n)
    assert set(fits) == set(medians) | {"link"}
    for fit in fits.values():
        assert fit.alpha == pytest.approx(alpha, rel=1e-6) and fit.beta == pytest.approx(beta, rel=1e-6)
    # The link is fitted to the ring-like collectives and send/recv, not to broadcast's tree.
    assert fits["link"].points == 4 * len(SIZES)


def _knee_shapes() -> list[tuple[int, int, int]]:
    shapes = [(n, n, n) for n in (512, 1024, 2048)]
    for d in (8, 16, 32, 64, 128, 256, 512):
        shapes += [(d, 1024, 1024), (1024, d, 1024), (1024, 1024, d)]
    return shapes


def test_fit_gemm_knee_recovers_gemm_and_knee():
    shapes = _knee_shapes()
    effs = _noisy(np.array([gemm_model(s, 0.8, 40.0) for s in shapes]), seed=3, spread=0.01)
    fit = fit_gemm_knee(shapes, effs)
    assert fit.gemm == pytest.approx(0.8, rel=0.03)
    assert fit.knee == pytest.approx(40.0, rel=0.05)
    assert fit.error < 0.02


def test_fit_gemm_knee_keeps_gemm_a_fraction():
    # Efficiencies relative to the best square matmul: the squares are 1.0, more than the
    # model reaches at a finite size, so gemm would exceed 1 unbounded; it stops at 1.
    shapes = _knee_shapes()
    effs = [1.0 if s[0] == s[1] == s[2] else gemm_model(s, 1.0, 20.0) / gemm_model((1024,) * 3, 1.0, 20.0)
            for s in shapes]
    fit = fit_gemm_knee(shapes, effs)
    assert fit.gemm == 1.0 and 0 < fit.knee < 40
    with pytest.raises(ValueError):
        fit_gemm_knee([(8, 8, 8)], [0.5])


def _cluster() -> Cluster:
    device = Device("a CPU, 1 thread(s)", {"f32": 9.876543210987e10, "f64": 4.5e10, "bf16": 3.3333333333e11},
                    12.5e9, 3.7e10)
    link = Link(1.2345678e9, 8.7654321e-5)
    return Cluster("this-machine", device, 1, 4, link, link, description='measured "here", on loopback',
                   sources=("how: one", "gloo all_reduce: alpha 1 us"),
                   efficiency=Efficiency(gemm=0.93, gemm_knee=9.75, attention=0.77, memory=0.071,
                                         op_overhead=1.86e-6, network=1.0))


def test_write_cluster_reads_back_equal(tmp_path: Path):
    c = _cluster()
    path = write_cluster(c, tmp_path / "m.toml")
    back = load_cluster(path)
    assert back.source == str(path)
    assert replace(back, source="") == c
    text = cluster_toml(c)
    assert "# how: one" in text and "# gloo all_reduce: alpha 1 us" in text   # the sources as comments too


def test_a_calibrated_file_says_its_runtime_runs_no_fused_groups(tmp_path: Path):
    # The gloo ranks partita calibrate measures run each op as its own ATen call, so their
    # file turns simulate's fused-group pricing off by default; it reads back so.
    c = replace(_cluster(), fused_groups=False)
    text = cluster_toml(c)
    assert "fused_groups = false" in text
    back = load_cluster(write_cluster(c, tmp_path / "m.toml"))
    assert back.fused_groups is False and replace(back, source="") == c
    assert "fused_groups" not in cluster_toml(replace(c, fused_groups=True))
    with pytest.raises(ClusterError, match="fused_groups must be true or false"):
        parse_cluster(text.replace("fused_groups = false", 'fused_groups = "no"'))


def test_cores_per_node_and_cache_read_back_equal(tmp_path: Path):
    c = _cluster()
    c = replace(c, cores_per_node=2, device=replace(c.device, cache=8.25e6, cache_bandwidth=9.125e10))
    back = load_cluster(write_cluster(c, tmp_path / "m.toml"))
    assert replace(back, source="") == c
    assert back.cores_per_node == 2 and back.device.cache == 8.25e6 and back.device.cache_bandwidth == 9.125e10


def test_each_collectives_own_fit_reads_back_and_prices_it(tmp_path: Path):
    from partita.cluster.cost import CostModel

    c = _cluster()
    link = replace(c.intra_node, collectives=(("all_reduce", 1.25e-4, 8.5e8), ("send_recv", 6.5e-5, 3.25e9)))
    c = replace(c, intra_node=link, inter_node=link)
    back = load_cluster(write_cluster(c, tmp_path / "m.toml"))
    assert replace(back, source="") == c
    m = CostModel(back)
    n, s = 4, 2 ** 20
    assert m.collective("all_reduce", s, n, back.intra_node) == pytest.approx(2 * 3 * 1.25e-4 + 1.5 * s / 8.5e8)
    # Not listed: the link's own figures.
    a, b = link.latency, link.bandwidth
    assert m.collective("all_gather", s, n, back.intra_node) == pytest.approx(3 * a + 0.75 * s / b)
    assert m.transfer(back.intra_node, s) == pytest.approx(6.5e-5 + s / 3.25e9)
    bad = cluster_toml(c).replace("all_reduce = {", "all_reduse = {", 1)
    with pytest.raises(ClusterError, match="unknown collective 'all_reduse'.*all_reduce"):
        parse_cluster(bad)


def test_measured_collective_times_read_back_and_are_interpolated(tmp_path: Path):
    from partita.cluster.cost import CostModel

    c = _cluster()
    pts = ((4.0, 5e-4), (65536.0, 6e-3), (1048576.0, 6.5e-3), (8388608.0, 1.3e-2))
    link = replace(c.intra_node, collectives=(("all_reduce", 2.5e-4, 6e8),), measured=(("all_reduce", 4, pts),))
    c = replace(c, intra_node=link, inter_node=link)
    back = load_cluster(write_cluster(c, tmp_path / "m.toml"))
    assert replace(back, source="") == c
    m = CostModel(back)
    L = back.intra_node
    assert m.collective("all_reduce", 65536, 4, L) == pytest.approx(6e-3)        # a measured size
    assert m.collective("all_reduce", 1, 4, L) == pytest.approx(5e-4)            # below: the smallest
    mid = m.collective("all_reduce", 2 ** 18, 4, L)                               # log-log between
    assert mid == pytest.approx(math.exp((math.log(6e-3) + math.log(6.5e-3)) / 2))
    # Above the largest: the last two points' slope in bytes.
    assert m.collective("all_reduce", 2 * 8388608, 4, L) == pytest.approx(1.3e-2 + (1.3e-2 - 6.5e-3) / 7340032 * 8388608)
    # Two ranks: scaled by the ring formula's ratio, with the collective's own alpha and beta.
    ring = lambda n, s: 2 * (n - 1) * 2.5e-4 + 2 * (n - 1) / n * s / 6e8
    assert m.collective("all_reduce", 65536, 2, L) == pytest.approx(6e-3 * ring(2, 65536) / ring(4, 65536))
    bad = cluster_toml(c).replace("ranks = 4", "ranks = 1", 1)
    with pytest.raises(ClusterError, match="ranks \\(2 or more\\)"):
        parse_cluster(bad)


def test_cache_needs_its_bandwidth(tmp_path: Path):
    text = cluster_toml(replace(_cluster(), device=replace(_cluster().device, cache=1e6, cache_bandwidth=1e10)))
    bad = "\n".join(line for line in text.splitlines() if not line.startswith("cache_bandwidth"))
    with pytest.raises(ClusterError, match="cache without cache_bandwidth"):
        parse_cluster(bad)


def test_gloo_needs_two_ranks():
    with pytest.raises(CalibrationError, match="at least 2 processes"):
        measure_gloo(1, 1, True, lambda s: None)


def test_message_sizes_span_4_bytes_to_64_mib():
    assert message_sizes(False)[0] == 4 and message_sizes(False)[-1] == 64 * 2 ** 20
    assert len(message_sizes(True)) < len(message_sizes(False))


# Multi-process: 2 gloo ranks on loopback (as tests/runtime's gloo tests), bounded in time.
@pytest.mark.timeout(240)
def test_quick_calibration_on_two_gloo_ranks_writes_a_cluster_file(tmp_path: Path):
    lines: list[str] = []
    cal = measure(nproc=2, threads=1, quick=True, progress=lines.append)
    c = cal.cluster
    assert c.nodes == 1 and c.gpus_per_node == 2
    path = write_cluster(c, tmp_path / "this-machine.toml")
    back = load_cluster(path)
    assert replace(back, source="") == c
    d = back.device
    assert {"f32", "f64"} <= set(d.peak_flops) and all(v > 0 for v in d.peak_flops.values())
    assert d.memory > 0 and d.memory_bandwidth > 0
    for link in (back.intra_node, back.inter_node):
        assert link.bandwidth > 0 and link.latency > 0
    assert back.intra_node == back.inter_node
    e = back.efficiency
    assert 0 < e.gemm <= 1 and e.gemm_knee > 0 and 0 < e.attention <= 1 and 0 < e.memory <= 1
    assert e.op_overhead > 0 and e.network == 1.0
    assert {"all_reduce", "all_gather", "broadcast", "send_recv", "link"} <= set(cal.fits)
    assert {"all_reduce", "all_gather", "send_recv"} <= {op for op, _, _ in back.intra_node.collectives}
    assert {"all_reduce", "all_gather", "send_recv"} <= {op for op, _, _ in back.intra_node.measured}
    text = path.read_text()
    assert "gloo all_reduce: alpha" in text and "measured by partita calibrate" in text
    assert any("gloo" in line for line in lines)
    # Two ranks on this machine's cores (2 or more): they compute at full speed at once.
    assert any(m.name == "contention" and 0 < m.value <= 1 for m in cal.measurements)
    assert c.cores_per_node is None or c.cores_per_node >= 1
    assert (d.cache is None) == (d.cache_bandwidth is None)
    if d.cache is not None:
        assert d.cache > 0 and d.cache_bandwidth > 0
    assert [r[0] for r in summary_rows(cal)][:1] == ["peak_flops.f32"]


# Multi-process: a rank that fails stops the measurement with its error, and nothing is left running.
@pytest.mark.timeout(120)
def test_a_failing_gloo_rank_stops_the_measurement_with_its_error():
    import multiprocessing

    with pytest.raises(CalibrationError, match=r"gloo rank \d failed:(.|\n)*set_num_threads"):
        measure_gloo(2, 0, True, lambda s: None)      # torch.set_num_threads(0) raises in every rank
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("partita-calibrate-")]


# Multi-process: the port chosen is taken before rank 0 binds it; calibrate chooses another.
@pytest.mark.timeout(180)
def test_a_port_taken_meanwhile_is_chosen_again(monkeypatch):
    import socket

    import partita.runtime.launch as launch

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real = launch.free_port
    ports = iter([taken.getsockname()[1]])
    monkeypatch.setattr(launch, "free_port", lambda: next(ports, None) or real())
    lines: list[str] = []
    try:
        medians, _ = measure_gloo(2, 1, True, lines.append)
    finally:
        taken.close()
    assert any("port was taken" in line for line in lines)
    assert medians["all_reduce"] and all(t > 0 for t in medians["all_reduce"].values())
