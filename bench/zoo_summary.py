"""Per-model ratios and their distribution from bench_zoo.py --json files (one thread count):
import path and backend against the better of Inductor and ORT, against Inductor and against
eager, and the cold compile against Inductor's. Ratios are of the ms medians bench_zoo wrote.

    .venv/bin/python bench/zoo_summary.py bench/results/zoo_time.json [RERUN.json ...] [--threads 1]

A later file's rows replace an earlier one's (a re-run of some models).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

COLUMNS = ("import/better", "backend/better", "backend/inductor", "import/eager", "backend/eager", "cold/inductor")


def ratios(row: dict, threads: str) -> dict[str, float] | None:
    t = row.get("timing") or {}
    th = (t.get("threads") or {}).get(threads)
    if not th:
        return None
    ms = th["ms"]
    better = min(v for k, v in ms.items() if k in ("inductor", "ort"))
    out = {"backend/better": ms["partita"] / better, "backend/inductor": ms["partita"] / ms["inductor"],
           "backend/eager": ms["partita"] / ms["eager"]}
    if "import" in ms:
        out["import/better"] = ms["import"] / better
        out["import/eager"] = ms["import"] / ms["eager"]
    cold = t.get("cold_s") or {}
    if cold.get("inductor"):
        out["cold/inductor"] = cold["partita"] / cold["inductor"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--threads", default="1")
    ns = ap.parse_args()
    rows: dict[str, dict] = {}
    for f in ns.files:
        for r in json.loads(Path(f).read_text())["rows"]:
            if (r.get("timing") or {}).get("threads"):
                rows[r["model"]] = r
    table = {m: ratios(r, ns.threads) for m, r in rows.items()}
    table = {m: v for m, v in table.items() if v}
    print("| model | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---:|" * len(COLUMNS))
    for m, v in table.items():
        print(f"| {m} | " + " | ".join(f"{v[c]:.2f}" if c in v else "-" for c in COLUMNS) + " |")
    print()
    print(f"| column, {len(table)} models | geomean | median | worst five | over 1 |")
    print("|---|---:|---:|---|---:|")
    for c in COLUMNS:
        xs = {m: v[c] for m, v in table.items() if c in v}
        if not xs:
            continue
        g = math.exp(statistics.fmean(math.log(x) for x in xs.values()))
        worst = sorted(xs.items(), key=lambda kv: -kv[1])[:5]
        print(f"| {c} | {g:.2f} | {statistics.median(xs.values()):.2f} | "
              + ", ".join(f"{m} {x:.2f}" for m, x in worst) + f" | {sum(x > 1 for x in xs.values())} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
