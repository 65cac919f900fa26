"""bench/bench_library.py runs in its quick mode: every linear path agrees with addmm, the
generated GEMM and attention agree with their peers, and every partita program of both models
matches eager (the script asserts all of it) and prints its table."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_library.py"


def test_quick_mode_runs_and_checks_every_candidate(capsys, monkeypatch):
    for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.setenv(v, os.environ.get(v, "1"))  # restored after: the script sets them
    spec = importlib.util.spec_from_file_location("bench_library", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "| [4,64]x[64,128] |" in out
    assert "cold weights, [4,64]x[64,128]" in out
    assert "| 1 x 2 x 16, 16 | yes | - |" in out and "rotary, 1 x 2 x 16, 16, causal" in out
    assert "| ResNet-style CNN 2x3x16x16 |" in out and "| MLP 64-128-128-64 GELU, batch 4 |" in out
    assert "ops after the passes: conv2d_pointwise, linear_pointwise, mean, reshape" in out
