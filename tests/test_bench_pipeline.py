"""The pipeline benchmark stays runnable and compares like with like: a quick run checks
partita's and torch.distributed.pipelining's first step against the single-device step
before timing, and both sides send the same bytes per step."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.timeout(280)
def test_quick_run_passes_its_checks_and_sends_the_peers_bytes(tmp_path) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import bench_pipeline
    finally:
        sys.path.remove(str(BENCH))
    out = tmp_path / "bench_pipeline.json"
    assert bench_pipeline.main(["--quick", "--out", str(out)]) == 0
    (case,) = json.loads(out.read_text())["pipeline"]["cases"]
    assert case["partita_check"]["passed"] and case["torch_check"]["passed"]
    assert case["partita_check"]["loss"] == pytest.approx(case["torch_check"]["loss"], rel=1e-5)
    assert case["partita_sent_bytes_per_rank"] == case["torch_sent_bytes_per_rank"]
    assert case["ratio"] > 0 and 0.0 <= case["predicted_bubble"] < 1.0
    assert case["partita_measured_bubble"] is not None
