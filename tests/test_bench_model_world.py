"""bench/bench_model_world.py runs end to end on one small architecture: its rows, its table
and its JSON (the full table is in docs/frontend.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_model_world as bmw  # noqa: E402


def test_one_architecture_through_a_torch_and_an_onnx_path_with_quantize(tmp_path):
    out = tmp_path / "mw.json"
    assert bmw.main(["--archs", "resnet", "--paths", "export-kwargs", "onnx-ts", "--quantize", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {r["path"]: r for r in data["rows"]}
    assert set(rows) == {"export-kwargs", "onnx-ts"}
    for r in rows.values():
        assert r["ok"] and r["error"] <= bmw.TOL, r
    assert rows["export-kwargs"]["export_s"] > 0 and rows["export-kwargs"]["convert_s"] > 0
    q = {r["mode"]: r for r in data["quantize"]}
    assert set(q) == {"weight-only", "dynamic"}
    assert all(r["after"] < r["before"] and not r["failure"] for r in q.values())


def test_a_failing_import_is_a_row_with_its_reason():
    arch = bmw.Arch("broken", lambda: None, lambda: (), lambda: {})
    rows, _ = bmw.run([arch], ["export-args"])
    assert len(rows) == 1 and not rows[0].ok and rows[0].failure
    assert "broken" in bmw.table(rows, ["export-args"])


def test_an_unknown_architecture_is_refused():
    with pytest.raises(SystemExit):
        bmw.main(["--archs", "nonesuch"])
