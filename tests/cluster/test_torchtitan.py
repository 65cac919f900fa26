"""TorchTitan's published FSDP2 rows as simulator checks (bench/bench_simulate.py --table
torchtitan): the cluster files they run on, the multi-rail pricing of a dp group that holds
every device of its nodes, the two checkpointing policies TorchTitan names (selective layer,
selective op) equal to no recomputation on a tiny Llama, and one row's config built and
simulated."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import partita
from partita.autodiff.recompute import recomputed_nodes
from partita.autodiff.training import Trainer
from partita.cluster import load_cluster, simulate

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_simulate.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_simulate_tt", _BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_cluster_files_hold_the_published_figures():
    a = load_cluster("dgx-a100-80gb")
    assert a.devices == 64 and a.device.memory == 80 * 2 ** 30 and a.device.memory_bandwidth == 2039e9
    assert a.efficiency == load_cluster("selene").efficiency          # carried over, not fitted
    h = load_cluster("grand-teton-h100-500w")
    assert h.gpus_per_node == 8 and h.device.memory == 96 * 2 ** 30 and h.device.memory_bandwidth == 2.4e12
    assert h.inter_node.bandwidth == 400e9 / 8                          # "400 Gb/s per GPU"
    # meta-h100-roce's efficiencies carried over, but attention: FlashAttention-2's published
    # H100 figures (the kernel TorchTitan's SDPA ran there), 322 of 989.4 TFLOP/s.
    assert h.efficiency == replace(load_cluster("meta-h100-roce").efficiency, attention=0.33)


def test_a_group_on_every_device_of_its_nodes_uses_every_nic():
    c = load_cluster("dgx-a100-80gb")
    assert c.link(range(8)) is c.intra_node
    assert c.link([0, 8]) is c.inter_node                               # one a node: one NIC
    assert c.link(list(range(0, 64, 8))) is c.inter_node                # dp over nodes, tp inside
    whole = c.link(range(64))                                           # 8 a node: 8 rails
    assert whole.bandwidth == min(8 * c.inter_node.bandwidth, c.intra_node.bandwidth) == 200e9
    assert c.link([0, 1, 8, 9]).bandwidth == 2 * c.inter_node.bandwidth
    h = load_cluster("grand-teton-h100-500w")
    assert h.link(range(16)).bandwidth == 8 * h.inter_node.bandwidth == 400e9     # under NVLink's 450 GB/s
    measured = replace(c, inter_node=replace(c.inter_node, collectives=(("all_gather", 1e-5, 1e9),)))
    assert measured.link(range(64)) is measured.inter_node              # measured figures stay


@pytest.mark.parametrize("ac", ["layer", "op"])
def test_torchtitan_checkpointing_is_the_same_step(ac):
    bench = _bench()
    rng = np.random.default_rng(0)
    fwd = partita.models.llama(4, 32, 4, 8, 64, kv_heads=2, ffn=64, batch=2, dtype="f32")
    plain = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    made = (bench.recompute_every_other_layer if ac == "layer" else bench.recompute_torchtitan_op_policy)(step)
    rec = recomputed_nodes(step)
    assert made == len(rec) > 0
    products = sorted({n.loc.scope.rsplit(".", 1)[-1] for n in rec if n.op == "matmul"})
    layers = {n.loc.scope.split(".")[2] for n in rec}
    if ac == "layer":
        assert layers == {"1", "3"} and "q_proj" in products                       # blocks 2 and 4, whole
        assert any(n.op == "attention" for n in rec)
    else:
        assert layers == {"0", "1", "2", "3"} and products == ["k_proj", "o_proj", "up_proj"]
        assert not any(n.op == "attention" for n in rec)
    weights = {str(v.name): (rng.standard_normal(v.type.shape) * 0.1).astype(np.float32)
               for v in plain.inputs if v.role == "param"}
    batch = {"ids": rng.integers(0, 64, (2, 8)), "target": rng.integers(0, 64, (2, 8))}
    want, got = Trainer(plain, weights, backend="numpy"), Trainer(step, weights, backend="numpy")
    assert got.step(batch) == pytest.approx(want.step(batch), rel=1e-6)
    for name, value in want.values.items():
        np.testing.assert_allclose(got.values[name], value, rtol=1e-5, atol=1e-6)


def test_the_h100_row_builds_and_simulates_with_its_memory():
    bench = _bench()
    row = next(r for r in bench.TORCHTITAN if r[0] == "8b-h100-op")
    rows = bench.torchtitan_table([row[0]])
    assert len(rows) == 1 and rows[0]["published_tps"] == 5762 and rows[0]["published_memory_GiB"] == 82.4
    assert rows[0]["simulated_tps"] > 0 and rows[0]["simulated_peak_GiB"] > 0 and rows[0]["step_s"] > 0
