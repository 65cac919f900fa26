"""The parallel benchmark stays runnable and compares like with like: a quick run passes its
own equivalence checks (partita's data-parallel, tensor-parallel and zero3 steps train the
same model as DDP, DTensor and FSDP), counts the same bytes on both sides, and a step that differs from
its peer stops the benchmark instead of being timed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bench_parallel():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_parallel
    finally:
        sys.path.remove(str(BENCH))
    return bench_parallel


@pytest.mark.timeout(240)
def test_quick_run_passes_its_checks_and_counts_equal_bytes(bench_parallel, tmp_path, capsys) -> None:
    out = tmp_path / "bench_parallel.json"
    assert bench_parallel.main(["--quick", "--rounds", "2", "--models", "mlp", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert "equivalence check passed on both ranks" in printed

    c = res["compile"]
    assert c["step_nodes"] > 0 and c["local_nodes"] > 0 and c["median_s"]["total"] > 0
    # The plan's bytes and the per-rank program's nodes, counted independently, agree.
    assert c["plan_comm_bytes"] == pytest.approx(c["counted_ring_sent_bytes"])
    assert {g["phase"] for g in c["collectives"]} >= {"forward", "backward", "update"}

    (dp,) = res["dp"]
    assert all(ch["passed"] and ch["steps"] == 2 and ch["params"] == 6 for ch in dp["checks"])
    assert len(dp["rounds_ms"]["ddp"]) == 2 and dp["ratio"]["partita"] > 0
    # Gradient payload all-reduced per step: DDP's buckets hold exactly the gradients; partita
    # also reduces the 4-byte loss.
    grads = sum(4 * n for n in (256 * 784, 256, 128 * 256, 128, 10 * 128, 10))
    assert dp["ddp_comm"]["payload_bytes"] == grads
    assert dp["partita_comm"]["payload_bytes"] == grads + 4
    assert dp["plan_comm_bytes"] == pytest.approx(dp["partita_comm"]["ring_sent_bytes"])

    tp = res["tp"]
    assert all(ch["passed"] for ch in tp["checks"]) and tp["ratio"]["partita"] > 0
    tokens = 2 * 16 * 64 * 4  # the one forward all_reduce of the row-parallel output
    assert tp["partita_comm"]["calls"] == {"all_reduce": 1}
    assert tp["partita_comm"]["payload_bytes"] == tp["dtensor_comm"]["payload_bytes"] == tokens
    assert tp["dtensor_comm"]["all_reduce_calls"] == 1

    z = res["zero3"]
    assert all(ch["passed"] for ch in z["checks"]) and z["ratio"]["partita"] > 0
    assert set(z["median_ms"]) == {"partita", "partita just in time", "fsdp"}
    # The params gathered forward and backward and the gradients reduce-scattered: partita
    # sends no more than FSDP (its tied table is gathered once, as FSDP's root unit).
    assert 0 < z["partita_comm"]["ring_sent_bytes"] <= z["fsdp_comm"]["ring_sent_bytes"]
    assert z["partita_comm"]["calls"].get("all_gather", 0) >= 2


@pytest.mark.timeout(120)
def test_a_step_that_differs_from_ddp_fails_loudly(bench_parallel) -> None:
    with pytest.raises(bench_parallel.EquivalenceError, match="differs from the torch"):
        bench_parallel.bench_dp("mlp", bench_parallel.QUICK, rounds=1, torch_lr=0.02)
