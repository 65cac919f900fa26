"""The single-device benchmark stays runnable and checks what it times: a quick run against
eager and ONNX Runtime prints a row for every model, with partita's outputs matching eager's
before any timing; a second quick run measures codegen's compile cold and warm and the peak
memory in fresh processes. The two runs go side by side (each is mostly one busy process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "bench_codegen.py"
MODELS = ("mlp", "cnn", "bert", "gpt2", "llama", "vit", "chain", "gpt2-train")


def _start(out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), "--quick", "--out", str(out), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    assert proc.returncode == 0, f"exit {proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
    assert "accuracy check passed" in stdout
    assert "ACCURACY CHECK FAILED" not in stdout and "MEASUREMENT FAILED" not in stdout
    return stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[str, dict]]:
    d = tmp_path_factory.mktemp("bench_codegen")
    main = _start(d / "main.json", "--peers", "eager,ort", "--profile")
    probe = _start(d / "probe.json", "--models", "chain,gpt2-train", "--executors", "codegen", "--peers", "eager",
                   "--compile-probe", "--compile-repeats", "1", "--memory", "--no-profile")
    out = {"main": _finish(main, 140), "probe": _finish(probe, 140)}
    return {k: (v, json.loads((d / f"{k}.json").read_text())) for k, v in out.items()}


@pytest.mark.timeout(150)
def test_quick_run_prints_every_model_and_passes_its_accuracy_check(runs) -> None:
    stdout, data = runs["main"]
    assert data["meta"]["threads"] == 1 and data["meta"]["quick"]
    assert not data["meta"]["compile_probe"] and not data["meta"]["memory"]
    executors = data["meta"]["executors"]
    assert "aten" in executors  # and codegen, once partita.codegen has CompiledProgram
    results = {r["model"]: r for r in data["results"]}
    assert tuple(results) == MODELS
    for key, r in results.items():
        for name in executors:
            # One table row per model and executor, with partita's time and its ratio to eager.
            rows = [line for line in stdout.splitlines() if line.startswith(f"| {r['label']} | {name} |")]
            assert len(rows) == 1, (key, name, stdout)
            e = r["executors"][name]
            assert e["check"]["rel"] <= 1e-3, (key, name, e["check"])
            assert e["ms"] > 0 and e["ratio"]["eager"] > 0
            assert len(r["runs_ms"][f"partita:{name}"]) == len(r["runs_ms"]["eager"]) == data["meta"]["rounds"]
            assert e["compile_s"] >= e["optimize_s"] > 0
            if not r.get("training"):
                assert e["ratio"]["ort"] > 0
            # The per-op profile accounts for the call: its ops and the rest add up.
            pr = e["profile"]
            assert pr["ops"] and pr["steps_ms"] > 0
            assert abs(sum(o["ms"] for o in pr["ops"].values()) + pr["outside_ms"] - pr["wall_ms"]) < 1e-6
        assert "profile" in r["peers"]["eager"]
        if r.get("training"):
            continue
        # ONNX Runtime ran every inference model (GPT-2 and Llama through the exporter's
        # fallback variant) and agrees with eager too; its profile has its nodes.
        ort = r["peers"]["ort"]
        assert "error" not in ort, (key, ort)
        assert ort["check"]["rel"] <= 1e-3
        assert ort["profile"]["ops"]
    if "codegen" in executors:
        assert "Targets (codegen):" in stdout
        assert "geometric mean over eager (7 inference models)" in stdout


@pytest.mark.timeout(150)
def test_compile_cold_and_warm_and_peak_memory_come_from_fresh_processes(runs) -> None:
    stdout, data = runs["probe"]
    if "codegen" not in data["meta"]["executors"]:
        pytest.skip("partita.codegen has no CompiledProgram here")
    assert data["meta"]["compile_probe"] and data["meta"]["memory"]
    for r in data["results"]:
        probe = r["compile_probe"]
        cold, warm = probe["cold"], probe["warm"]
        # Both models have generated kernels (the chain; AdamW): the cold process compiled
        # them into an empty cache, the warm one read every one of them from disk.
        assert cold["cache_entries_before"] == 0 and cold["cache"]["compiled"] > 0, cold
        assert cold["cache"]["disk_hits"] == 0
        assert warm["cache"]["compiled"] == 0 and warm["cache"]["disk_hits"] == cold["cache"]["compiled"], warm
        assert warm["cache_entries_before"] == cold["cache_entries_after"] > 0
        assert cold["compile_s"] >= cold["optimize_s"] > 0 and warm["compile_s"] > 0
        assert f"compile cold {cold['compile_s']:.3f} s" in stdout
        # The plan's peak, and a measured peak per candidate from its own process.
        plan = r["executors"]["codegen"]["plan"]
        assert plan["peak_bytes"] >= plan["arena_bytes"] >= 0
        for cand in ("eager", "codegen"):
            m = r["memory"][cand]
            assert "error" not in m, (r["model"], cand, m)
            assert m["hwm"] >= m["rss_before"] > 0 and m["peak_bytes"] == m["hwm"] - m["rss_before"]
            assert m["rss_before"] > m["rss_start"] - 2**20
    rows = [line for line in stdout.split("Peak memory", 1)[1].splitlines() if line.startswith("|")]
    assert len(rows) == 2 + len(data["results"])


def test_profile_nodes_lists_partitas_nodes_and_orts():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "profile_nodes.py"), "--model", "cnn", "--quick",
                        "--calls", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert any(ln.strip().startswith("conv2d_pointwise") for ln in lines)
    assert any(ln.strip().startswith("Conv ") for ln in lines) and any(ln.startswith("ORT:") for ln in lines)
