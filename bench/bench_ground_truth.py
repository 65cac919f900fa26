"""The simulator against real runs on this machine (issue 16, part 6).

``partita calibrate`` measures this machine as a cluster of ``nproc`` gloo ranks (compute
rates, gloo's alpha and beta); with that cluster file the simulator predicts the step time of
the per-rank programs ``parallelize`` emits, and ``partita.launch`` runs the same programs for
real on 4 processes (gloo on loopback, one torch thread each). The model: a GPT-2 of 4
layers, hidden 256, 4 heads, sequence 128, vocab 2048, batch 16, f32, AdamW, random weights
from the config. The plans: dp4, tp4, dp2 x tp2, zero3 on dp4, pp2 x dp2 and pp2 x tp2 (1F1B,
4 microbatches).

Each plan's measured step time is the median, over rounds, of the median step of a launch
(``LaunchResult.step_seconds``: the slowest rank's time inside its program, the steps after
the first two); the plans run interleaved, round after round, so that a slow spell of the host
touches every plan alike, after one launch that is not counted (the first launch of a
session runs 30-50% slower). Reported: each plan's simulated and measured step, the relative
error, and Spearman's rank correlation of the two orders.

    .venv/bin/python bench/bench_ground_truth.py                       # calibrate, then 3 rounds
    .venv/bin/python bench/bench_ground_truth.py --cluster this.toml   # with a cluster file
    .venv/bin/python bench/bench_ground_truth.py --simulate-only --cluster this.toml
    .venv/bin/python bench/bench_ground_truth.py --quick               # quick calibration, 1 round

Run it on a quiet machine: 4 ranks share this machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import partita  # noqa: E402

MODEL = dict(layers=4, hidden=256, heads=4, seq=128, vocab=2048, batch=16, dtype="f32")
PLANS = {
    "dp4": dict(mesh="dp=4", strategy="dp"),
    "tp4": dict(mesh="tp=4", strategy="megatron"),
    "dp2xtp2": dict(mesh="dp=2,tp=2", strategy="dp+megatron"),
    "zero3": dict(mesh="dp=4", strategy="zero3"),
    "pp2xdp2": dict(mesh="pp=2,dp=2", strategy="pp+dp", microbatches=4, schedule="1f1b"),
    "pp2xtp2": dict(mesh="pp=2,tp=2", strategy="pp+megatron", microbatches=4, schedule="1f1b"),
}


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (no ties expected; ties take their mean rank)."""
    def ranks(x: list[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return num / den if den else 0.0


def build() -> tuple[partita.Graph, dict, dict]:
    fwd = partita.models.gpt(**MODEL)
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    rng = np.random.default_rng(0)
    weights = {str(v.name): (rng.standard_normal(v.type.shape) * 0.02).astype(np.float32)
               for v in step.inputs if v.role == "param"}
    feed = {"ids": rng.integers(0, MODEL["vocab"], (MODEL["batch"], MODEL["seq"])),
            "target": rng.integers(0, MODEL["vocab"], (MODEL["batch"], MODEL["seq"]))}
    return step, weights, feed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", help="a cluster file of this machine (default: calibrate now)")
    ap.add_argument("--save-cluster", default=str(Path(__file__).parent / "results" / "this-machine.toml"),
                    help="where the calibration is written")
    ap.add_argument("--quick", action="store_true", help="quick calibration and one round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8, help="steps per launch (the first two are not counted)")
    ap.add_argument("--plans", nargs="*", choices=sorted(PLANS), help="only these plans")
    ap.add_argument("--simulate-only", action="store_true", help="no launches: the simulated steps alone")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_ground_truth.json"))
    args = ap.parse_args()

    from partita.cluster import load_cluster, simulate
    from partita.cluster.calibrate import calibrate, write_cluster

    if args.cluster:
        cluster = load_cluster(args.cluster)
    else:
        t0 = time.perf_counter()
        cluster = calibrate(nproc=4, threads=1, quick=args.quick, progress=lambda s: print(s, flush=True))
        Path(args.save_cluster).parent.mkdir(parents=True, exist_ok=True)
        write_cluster(cluster, args.save_cluster)
        print(f"calibrated in {time.perf_counter() - t0:.0f} s; wrote {args.save_cluster}", flush=True)
    step, weights, feed = build()
    names = args.plans or list(PLANS)
    progs, sim = {}, {}
    for name in names:
        progs[name] = partita.parallelize(step, **PLANS[name])
        res = simulate(progs[name], cluster, memory=False)
        sim[name] = res.step_time
        print(f"{name:>8}: simulated {res.step_time * 1e3:8.1f} ms", flush=True)
    if args.simulate_only:
        return
    rounds = 1 if args.quick else args.rounds
    # One launch not counted: the first of a session pays for starting up (seen 30-50% slower).
    partita.launch(progs[names[0]], inputs=feed, weights=weights, steps=3, timeout_s=300)
    got: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names:
            res = partita.launch(progs[name], inputs=feed, weights=weights, steps=args.steps, timeout_s=300)
            t = statistics.median(res.step_seconds[2:])
            got[name].append(t)
            print(f"round {r + 1}/{rounds} {name:>8}: measured {t * 1e3:8.1f} ms "
                  f"(steps {', '.join(f'{x * 1e3:.0f}' for x in res.step_seconds)})", flush=True)
    rows = []
    for name in names:
        m = statistics.median(got[name])
        rows.append({"plan": name, "simulated_ms": sim[name] * 1e3, "measured_ms": m * 1e3,
                     "error": sim[name] / m - 1, "rounds_ms": [x * 1e3 for x in got[name]]})
    rho = spearman([sim[n] for n in names], [statistics.median(got[n]) for n in names])
    print("\n| plan | simulated ms | measured ms | error |\n|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['plan']} | {row['simulated_ms']:.1f} | {row['measured_ms']:.1f} | {row['error']:+.1%} |")
    print(f"\nSpearman rank correlation: {rho:.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cluster": cluster.name, "rows": rows, "spearman": rho}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
