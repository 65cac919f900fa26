"""The long fuzzing campaign: every target for a share of the time, then a table and JSON.

    python tools/fuzz.py --minutes 5 --seed 0
        [--targets pir,onnx,api,graphs,cli,cluster,simulate,compile,pipeline]
        [--out bench/results/fuzz.json] [--repro-dir bench/results/fuzz-repro]

The targets and what they check are in tests/fuzz/campaign.py and docs/reliability.md. The
minutes are split evenly over the targets; cases are deterministic in the seed, so the same
seed and the same number of cases give the same findings. Each distinct violation's
reproducer is written to the reproducer folder (a .pir, .onnx or .toml file where there is
one, a .py script for a compile case, and a .txt with the whole record). Exit status: 0 with
no violations, 1 otherwise.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "fuzz"))
sys.path.insert(0, str(REPO))

import campaign  # noqa: E402


def save_reproducers(results: dict, folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    for target, counts in results.items():
        for i, v in enumerate(counts.violations.values()):
            stem = folder / f"{target}-{i:03d}-{re.sub(r'[^a-z-]', '', v.kind)}"
            stem.with_suffix(".txt").write_text(v.render() + "\n")
            rep = v.reproducer
            # The cluster target's text is a cluster file; the others' a .pir graph.
            suffix = ".toml" if target == "cluster" else ".pir"
            if "text" in rep:
                stem.with_suffix(suffix).write_text(rep["text"], errors="surrogatepass")
            if "text (base64)" in rep:
                stem.with_suffix(suffix).write_bytes(base64.b64decode(rep["text (base64)"]))
            if "program" in rep:  # compile: a script that replays the case
                options = f", options={rep['options']!r}" if "options" in rep else ""
                stem.with_suffix(".py").write_text(
                    "import torch\nimport partita.codegen.dynamo\n\n" + rep["program"] +
                    f"\ninputs = [{rep['inputs']}]\nprint(fn(*inputs))\n"
                    f"print(torch.compile(fn, backend='partita', dynamic=False{options})(*inputs))\n")
            if "model_b64" in rep:
                stem.with_suffix(".onnx").write_bytes(base64.b64decode(rep["model_b64"]))
            n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="total time, split evenly over the targets")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--targets", default=",".join(campaign.TARGETS),
                    help=f"comma-separated, from {','.join(campaign.TARGETS)}")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "fuzz.json"), help="JSON results")
    ap.add_argument("--repro-dir", default=str(REPO / "bench" / "results" / "fuzz-repro"),
                    help="where reproducers of violations go")
    args = ap.parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    bad = [t for t in targets if t not in campaign.TARGET_FUNCS]
    if bad or not targets or args.minutes <= 0:
        ap.error(f"unknown target(s) {', '.join(bad)}; choose from {', '.join(campaign.TARGETS)}" if bad
                 else "give at least one target and a positive --minutes")
    share = args.minutes * 60.0 / len(targets)
    started = datetime.datetime.now(datetime.timezone.utc)
    results = {}
    for t in targets:
        print(f"[fuzz] {t}: {share:.0f} s, seed {args.seed} ...", flush=True)
        t0 = time.monotonic()
        counts = campaign.TARGET_FUNCS[t](seed=args.seed, cases=None, seconds=share)
        results[t] = counts
        print(f"[fuzz] {t}: {counts.cases} cases, {counts.accepted} accepted, {counts.clean} clean errors, "
              f"{counts.n_violations} violations ({len(counts.violations)} distinct) in "
              f"{time.monotonic() - t0:.0f} s", flush=True)
        for v in counts.violations.values():
            print(f"    {v.kind} x{v.count}: {v.message.splitlines()[0][:160]}", flush=True)
    print()
    print(campaign.table(results))
    command = "python tools/fuzz.py " + " ".join(argv if argv is not None else sys.argv[1:])
    record = {"command": command.strip(), "date": started.isoformat(timespec="seconds"), "seed": args.seed,
              "minutes": args.minutes, "targets": {t: c.to_json() for t, c in results.items()}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, default=repr) + "\n")
    n = save_reproducers(results, Path(args.repro_dir))
    print(f"\nresults: {out}" + (f"\nreproducers: {args.repro_dir} ({n})" if n else ""))
    return 1 if any(c.violations for c in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
