"""The import-time benchmark stays runnable, and the timing split it relies on
(``import_torch(..., timings=...)``) neither changes the import nor leaves a part out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import partita

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench_import():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_import
    finally:
        sys.path.remove(str(BENCH))
    return bench_import


def test_timings_split_export_from_conversion_without_changing_the_graph(bench_import) -> None:
    import time

    import torch

    from partita.frontend.torch_export import import_torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
    x = torch.randn(3, 4)
    plain = import_torch(model, (x,))
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    timed = import_torch(model, (x,), timings=timings)
    total = time.perf_counter() - t0
    assert partita.print_graph(timed) == partita.print_graph(plain)
    assert set(timings) == {"export", "convert"}
    assert 0 < timings["convert"] and 0 < timings["export"]
    assert timings["export"] + timings["convert"] <= total


def test_bench_writes_json_table_and_verdicts(bench_import, tmp_path, capsys) -> None:
    import torch

    out = tmp_path / "r.json"
    threads = torch.get_num_threads()
    try:
        assert bench_import.main(["--models", "mlp", "--repeats", "1", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)  # the script runs on one thread; later tests should not
    table = capsys.readouterr().out
    assert "| MLP 784-256-128-10 |" in table and "torch.export + run_decompositions" in table
    (r,) = json.loads(out.read_text())["results"]
    assert r["nodes"] > 5 and len(r["runs"]) == 1
    assert r["partita_s"] == pytest.approx(r["convert_s"] + r["verify_s"])
    assert r["framework_s"] > 0


def test_verdicts_judge_each_target(bench_import) -> None:
    rows = [{"model": "gpt2", "title": "GPT-2", "share": 0.05, "partita_s": 0.1},
            {"model": "bert", "title": "BERT", "share": 0.2, "partita_s": 0.1},
            {"model": "onnx-resnet50", "title": "R50", "share": 9.0, "partita_s": 0.7},
            {"model": "mlp", "title": "MLP", "share": 0.5, "partita_s": 0.01}]
    lines = bench_import.verdicts(rows)
    assert lines == ["GPT-2: partita's part is 5.0% of torch.export (target <= 10%): met",
                     "BERT: partita's part is 20.0% of torch.export (target <= 10%): NOT met",
                     "R50: partita's part takes 0.700 s (target < 0.5 s): NOT met"]
