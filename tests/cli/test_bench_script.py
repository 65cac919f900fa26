"""The IR benchmark script stays runnable: a tiny run of bench/bench_ir.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import partita

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench_ir():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_ir
    finally:
        sys.path.remove(str(BENCH))
    return bench_ir


def test_synthetic_graph_is_valid_and_has_the_promised_mix(bench_ir):
    g = bench_ir.build_graph(400)
    assert 400 <= len(g) < 450
    partita.verify(g)
    ops = {n.op for n in g.nodes}
    assert {"add", "mul", "matmul", "mean", "where", "split", "constant"} <= ops
    assert any(len(n.results) == 2 for n in g.nodes)
    assert all(n.loc is not None for n in g.nodes)
    text = partita.print_graph(g)
    assert partita.print_graph(partita.parse(text)) == text


def test_bench_writes_json_and_table(bench_ir, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert bench_ir.main(["--sizes", "200", "400", "--repeats", "1", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "parse" in table and "scaling" in table
    data = json.loads(out.read_text())
    assert [r["nodes"] >= n for r, n in zip(data["results"], (200, 400))] == [True, True]
    stages = data["results"][0]["stages"]
    assert set(stages) == {"parse", "print", "verify", "canonicalize,cse,dce", "canonicalize,cse,dce (defaults)"}
    assert all(s["median_s"] > 0 and len(s["runs_s"]) == 1 for s in stages.values())
    # The pipeline removes the planted redundancies.
    assert data["results"][1]["nodes_after_pipeline"] < data["results"][1]["nodes"]
