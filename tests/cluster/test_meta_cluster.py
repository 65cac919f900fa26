"""The meta-h100-roce cluster file (Llama 3 405B's cluster, Dubey et al. 2024, Sec. 3.3.1): its
figures as the paper and the H100 datasheet give them, and the simulator pricing a tiny Llama
on it, across the network and inside a server."""

from __future__ import annotations

import pytest

import partita
from partita.cluster import list_clusters, load_cluster, simulate


def test_meta_h100_roce_is_what_the_paper_and_the_datasheet_say():
    assert "meta-h100-roce" in list_clusters()
    c = load_cluster("meta-h100-roce")
    assert c.devices == 16384 and c.gpus_per_node == 8          # "up to 16K H100 GPUs", eight a server
    assert c.device.memory == 80 * 2 ** 30                         # 80GB HBM3
    assert c.device.flops("bf16") == pytest.approx(989.4e12) and c.device.memory_bandwidth == 3.35e12
    assert c.inter_node.bandwidth == 400e9 / 8                     # "400 Gbps interconnects between GPUs"
    assert c.intra_node.bandwidth == 450e9                         # NVLink 4, per direction
    assert c.link(range(8)) is c.intra_node and c.link([7, 8]) is c.inter_node
    assert any("2407.21783" in s for s in c.sources)


def test_a_tiny_llama_is_priced_on_it():
    fwd = partita.models.llama(2, 64, 4, 16, 128, kv_heads=2, batch=4, dtype="bf16")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", master_weights=True)
    prog = partita.parallelize(step, mesh="dp=2,tp=8", strategy="zero2+megatron")
    r = simulate(prog, "meta-h100-roce", trace=False, memory=False)
    assert r.step_time > 0 and r.cluster.name == "meta-h100-roce"
    rank = r.ranks[0]
    assert rank.compute > 0 and rank.comm["tp"] > 0 and rank.comm["dp"] > 0
    assert r.model_flops > 0 and 0 < r.mfu < 1
