"""bench/bench_plan.py --quick: one Table 1 row planned and set beside its published plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_plan_quick(tmp_path):
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_plan.py"), "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    data = json.loads(out.read_text())
    row = data["rows"][0]
    assert row["model"] == "1.7B" and row["plan_step_s"] > 0 and row["published_step_s"] > 0
    assert row["plan_memory_GiB"] <= 80.0
    assert r.returncode == (1 if data["missed"] else 0), r.stdout[-2000:] + r.stderr[-2000:]
