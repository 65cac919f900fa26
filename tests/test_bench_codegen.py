"""The single-device benchmark stays runnable and checks what it times: a quick run against
eager and ONNX Runtime prints a row for every model, with partita's outputs matching eager's
before any timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("mlp", "cnn", "bert", "gpt2", "llama", "vit", "chain", "gpt2-train")


@pytest.mark.timeout(150)
def test_quick_run_prints_every_model_and_passes_its_accuracy_check(tmp_path) -> None:
    out = tmp_path / "codegen.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_codegen.py"), "--quick", "--peers", "eager,ort",
                           "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "accuracy check passed" in proc.stdout
    assert "ACCURACY CHECK FAILED" not in proc.stdout

    data = json.loads(out.read_text())
    assert data["meta"]["threads"] == 1 and data["meta"]["quick"]
    executors = data["meta"]["executors"]
    assert "aten" in executors  # and codegen, once partita.codegen has CompiledProgram
    results = {r["model"]: r for r in data["results"]}
    assert tuple(results) == MODELS
    for key, r in results.items():
        for name in executors:
            # One table row per model and executor, with partita's time and its ratio to eager.
            rows = [line for line in proc.stdout.splitlines() if line.startswith(f"| {r['label']} | {name} |")]
            assert len(rows) == 1, (key, name, proc.stdout)
            e = r["executors"][name]
            assert e["check"]["rel"] <= 1e-3, (key, name, e["check"])
            assert e["ms"] > 0 and e["ratio"]["eager"] > 0
            assert len(r["runs_ms"][f"partita:{name}"]) == len(r["runs_ms"]["eager"]) == data["meta"]["rounds"]
            assert e["compile_s"] >= e["optimize_s"] > 0
            if not r.get("training"):
                assert e["ratio"]["ort"] > 0
        if r.get("training"):
            continue
        # ONNX Runtime ran every inference model (GPT-2 and Llama through the exporter's
        # fallback variant) and agrees with eager too.
        ort = r["peers"]["ort"]
        assert "error" not in ort, (key, ort)
        assert ort["check"]["rel"] <= 1e-3
