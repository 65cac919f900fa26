"""Record the test tiers (tests/conftest.py): run the whole suite once with the recorder on,
then write ``tests/tiers.json``, the marks of every test that is slow (more than
``SLOW_CPU_S`` CPU seconds in the test process) or starts processes.

    .venv/bin/python tools/test_tiers.py              # about 20 minutes on 2 cores
    .venv/bin/python tools/test_tiers.py --from DIR   # only rebuild the table from recorded files

A function whose parametrized cases all carry the same marks is written once, by its id
without parameters; otherwise each marked case is written by its own id.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import SLOW_CPU_S, TIERS, function_key  # noqa: E402


def record(out_dir: Path, workers: int, timeout: int) -> int:
    env = dict(os.environ, PARTITA_RECORD_TIERS=str(out_dir / "tiers"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--timeout={timeout}", "tests"]
    if workers > 1:
        cmd[3:3] = ["-n", str(workers)]
    print("recording:", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def table(out_dir: Path) -> dict:
    rows: dict[str, dict] = {}
    for f in sorted(out_dir.glob("tiers.*.json")):
        rows.update(json.loads(f.read_text()))
    if not rows:
        raise SystemExit(f"no recorded tiers in {out_dir}")
    marks: dict[str, list[str]] = {}
    for nid, r in rows.items():
        m = set()
        if r["cpu"] > SLOW_CPU_S:
            m.add("slow")
        if r["spawned"]:
            m.add("multiprocess")
        marks[nid] = sorted(m)
    by_fn: dict[str, set[tuple[str, ...]]] = {}
    for nid, m in marks.items():
        by_fn.setdefault(function_key(nid), set()).add(tuple(m))
    out: dict[str, list[str]] = {}
    for nid, m in sorted(marks.items()):
        key = function_key(nid)
        if len(by_fn[key]) == 1:
            if m:
                out[key] = m
        elif m:
            out[nid] = m
    cpu = sum(r["cpu"] for r in rows.values())
    fast = sum(r["cpu"] for nid, r in rows.items() if not marks[nid])
    return {"about": "marks per test, recorded by tools/test_tiers.py (see tests/conftest.py)",
            "slow_cpu_s": SLOW_CPU_S, "tests": len(rows), "marked": sum(1 for m in marks.values() if m),
            "cpu_s_all": round(cpu, 1), "cpu_s_fast": round(fast, 1), "marks": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="src", help="a folder of recorded tiers.*.json files (skip the run)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=600)
    args = ap.parse_args()
    if args.src:
        src = Path(args.src)
    else:
        src = Path(tempfile.mkdtemp(prefix="partita-tiers."))
        rc = record(src, args.workers, args.timeout)
        if rc not in (0, 1):
            raise SystemExit(f"the recording run failed (pytest exit {rc}); see above")
    t = table(src)
    TIERS.write_text(json.dumps(t, indent=1, sort_keys=False) + "\n")
    print(f"wrote {TIERS}: {t['marked']} of {t['tests']} tests marked; CPU {t['cpu_s_all']} s in all, "
          f"{t['cpu_s_fast']} s in the fast tier (recorded in {src})")


if __name__ == "__main__":
    main()
