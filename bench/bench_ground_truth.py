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
    .venv/bin/python bench/bench_ground_truth.py --planner --cluster this.toml   # issue 39 item 5

``--planner`` (issue 39, item 5): ``partita.plan(step, cluster, devices=4)`` plans the same
step; its plan is mapped to one of the six when it is one, else run as a seventh candidate
("planner"), and the report gives the planner's choice measured / the fastest measured (target
<= 1.10). Then each candidate runs once more, in its own launch, with each rank's peak of live
tensor bytes measured (partita/runtime/memory_peak.py: params, optimizer state and batch as
given, plus the largest running sum of the step's allocations), set beside each rank's
``memory_report`` peak from ``simulate`` (target: within 15% on each rank). The MLP of the
``--model mlp``: the same for an MLP (256-1024-1024-256, GELU, batch 512, MSE, AdamW); the
planner plans transformers only and says so, and the hand plans that apply to it (no pipeline:
it has no layers to cut between) are measured all the same.

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


def build(model: str = "gpt") -> tuple[partita.Graph, dict, dict]:
    """The training step, its random weights and one batch: the GPT-2 of ``MODEL`` or the MLP (``build_mlp``)."""
    if model == "mlp":
        return build_mlp_run()
    fwd = partita.models.gpt(**MODEL)
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    rng = np.random.default_rng(0)
    weights = {str(v.name): (rng.standard_normal(v.type.shape) * 0.02).astype(np.float32)
               for v in step.inputs if v.role == "param"}
    feed = {"ids": rng.integers(0, MODEL["vocab"], (MODEL["batch"], MODEL["seq"])),
            "target": rng.integers(0, MODEL["vocab"], (MODEL["batch"], MODEL["seq"]))}
    return step, weights, feed


PLANNER = "planner"


def plan_key(options: dict) -> tuple:
    """The parts of ``parallelize``'s keywords that make two plans the same run (mesh axes in
    order, strategy words as a set, and for a pipeline its microbatches, schedule, virtual stages,
    even stage cut and recomputation)."""
    mesh = tuple(a.strip() for a in str(options["mesh"]).split(",") if a.strip())
    words = frozenset(w for w in str(options.get("strategy") or "").split("+") if w)
    if "pp" not in words:
        return mesh, words
    stages = options.get("stages")
    even = stages is None or len(set(stages)) == 1
    return (mesh, words, int(options.get("microbatches", 1)), options.get("schedule") or "1f1b",
            int(options.get("virtual_stages", 1)), even, str(options.get("recompute", "none")))


def map_plan(plan: "partita.Plan", plans: dict[str, dict]) -> str | None:
    """The name of the hand plan in ``plans`` that ``plan`` is, or None when it is none of them."""
    if plan.sharding != "words" or plan.annotations or plan.stage_recompute or plan.recompute != "none":
        return None
    mine = plan_key(plan.parallelize_options())
    return next((name for name, kw in plans.items() if plan_key(kw) == mine), None)


def planner_candidates(step: partita.Graph, cluster, memory,
                       names: list[str]) -> tuple[str | None, "partita.Plan | None", dict]:
    """Plan ``step`` on 4 devices; returns (the name it maps to, or PLANNER; the plan; the programs
    of the candidates, the planner's added when it is none of the six). Where the planner has no
    plan (it plans transformers), or a hand plan does not apply, it says why and goes on without."""
    from partita.ir import PartitaError

    progs = {}
    for n in names:
        try:
            progs[n] = partita.parallelize(step, **PLANS[n])
        except PartitaError as e:
            print(f"{n:>8}: not a candidate: {str(e)[:160]}", flush=True)
    t0 = time.perf_counter()
    try:
        plan = partita.plan(step, cluster, memory, devices=4)
    except PartitaError as e:
        print(f"the planner has no plan: {e}", flush=True)
        return None, None, progs
    print(f"planned in {time.perf_counter() - t0:.1f} s: {plan.describe()} (simulated "
          f"{(plan.step_time or 0) * 1e3:.1f} ms, {(plan.memory or 0) / 2**20:.1f} MiB per device)", flush=True)
    for nxt in plan.report.get("next", [])[:3]:
        print(f"  next: {nxt['plan']} (simulated {nxt['step_s'] * 1e3:.1f} ms)", flush=True)
    name = map_plan(plan, {n: PLANS[n] for n in progs})
    if name is None:
        name = PLANNER
        progs[PLANNER] = partita.parallelize(step, plan=plan)
        print(f"the planner's plan is none of {', '.join(names)}: run as a seventh candidate", flush=True)
    else:
        print(f"the planner's plan is {name}", flush=True)
    return name, plan, progs


def measure_times(progs: dict, feed: dict, weights: dict, rounds: int, steps: int) -> dict[str, list[float]]:
    """Each program's median step per launch, the programs interleaved round after round, after one
    launch that is not counted."""
    names = list(progs)
    # One launch not counted: the first of a session pays for starting up (seen 30-50% slower).
    partita.launch(progs[names[0]], inputs=feed, weights=weights, steps=3, timeout_s=300)
    got: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names:
            res = partita.launch(progs[name], inputs=feed, weights=weights, steps=steps, timeout_s=300)
            t = statistics.median(res.step_seconds[2:])
            got[name].append(t)
            print(f"round {r + 1}/{rounds} {name:>8}: measured {t * 1e3:8.1f} ms "
                  f"(steps {', '.join(f'{x * 1e3:.0f}' for x in res.step_seconds)})", flush=True)
    return got


def predicted_peaks(prog, cluster) -> list[int]:
    """Each rank's ``memory_report`` peak (bytes) as ``simulate`` gives it, in rank order."""
    from partita.cluster import simulate

    res = simulate(prog, cluster, trace=False, memory=True, dedup=False)
    ranks = sorted(res.ranks, key=lambda r: r.rank)
    return [int(r.memory.peak) if r.memory is not None else 0 for r in ranks]


def measure_memory(prog, feed: dict, weights: dict, steps: int = 3) -> list[int]:
    """Each rank's measured peak (bytes) in a launch of its own with ``PARTITA_MEMORY_DIR`` set:
    per rank the largest peak of the steps after the first (which computes the constants)."""
    import tempfile

    from partita.runtime.memory_peak import ENV, read_peaks

    with tempfile.TemporaryDirectory(prefix="partita-mem-") as folder:
        was = os.environ.get(ENV)
        os.environ[ENV] = folder
        try:
            res = partita.launch(prog, inputs=feed, weights=weights, steps=steps, timeout_s=300)
        finally:
            if was is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = was
        per_rank = read_peaks(folder, res.run.mesh.size)
    return [max(s["peak"] for s in (steps_[1:] or steps_)) for steps_ in per_rank]


def memory_rows(progs: dict, feed: dict, weights: dict, cluster) -> list[dict]:
    """Per candidate and rank: predicted and measured peak bytes and the relative error."""
    rows = []
    for name, prog in progs.items():
        pred, got = predicted_peaks(prog, cluster), measure_memory(prog, feed, weights)
        for r, (p, m) in enumerate(zip(pred, got)):
            rows.append({"plan": name, "rank": r, "predicted_MiB": p / 2**20, "measured_MiB": m / 2**20,
                         "error": p / m - 1 if m else None})
        worst = max(abs(p / m - 1) for p, m in zip(pred, got) if m)
        print(f"{name:>8}: predicted {', '.join(f'{p / 2**20:.1f}' for p in pred)} MiB; measured "
              f"{', '.join(f'{m / 2**20:.1f}' for m in got)} MiB; worst error {worst:.1%}", flush=True)
    return rows


def build_mlp(batch: int = 512, widths: tuple[int, ...] = (256, 1024, 1024, 256)) -> partita.Graph:
    """An MLP (linear layers with GELU between them) as a training step, MSE and AdamW."""
    dims = list(widths)
    params = ", ".join(f"%w{i}: f32[{a}, {b}] param" for i, (a, b) in enumerate(zip(dims, dims[1:])))
    lines, x = [], "%x"
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        lines.append(f"  %h{i} = matmul({x}, %w{i}) : f32[{batch}, {b}]")
        x = f"%h{i}"
        if i < len(dims) - 2:
            lines.append(f"  %g{i} = gelu({x}) : f32[{batch}, {b}]")
            x = f"%g{i}"
    text = (f"graph @mlp(%x: f32[{batch}, {dims[0]}] input, {params}) -> (f32[{batch}, {dims[-1]}]) {{\n"
            + "\n".join(lines) + f"\n  return {x}\n}}")
    return partita.training_step(partita.parse(text), loss="mse", optimizer="adamw")


def build_mlp_run() -> tuple[partita.Graph, dict, dict]:
    """The MLP's step, random weights and one batch."""
    step = build_mlp()
    rng = np.random.default_rng(0)
    def arrays(role: str) -> dict[str, np.ndarray]:
        return {str(v.name): (rng.standard_normal(v.type.shape) * 0.05).astype(np.float32)
                for v in step.inputs if v.role == role}
    return step, arrays("param"), arrays("input")


def run_planner(args, cluster, step, weights, feed, names: list[str]) -> dict:
    """``--planner``: the planner's choice against the candidates measured, and memory measured."""
    from partita.cluster import simulate

    chosen, plan, progs = planner_candidates(step, cluster, args.memory, names)
    sim = {n: simulate(p, cluster, memory=False).step_time for n, p in progs.items()}
    got = measure_times(progs, feed, weights, 1 if args.quick else args.rounds, args.steps)
    med = {n: statistics.median(v) for n, v in got.items()}
    fastest = min(med, key=lambda n: med[n])
    ratio = med[chosen] / med[fastest] if chosen is not None else None
    print("\n| plan | simulated ms | measured ms |\n|---|---:|---:|")
    for n in progs:
        print(f"| {n}{' (planner)' if n == chosen else ''} | {sim[n] * 1e3:.1f} | {med[n] * 1e3:.1f} |")
    if ratio is not None:
        print(f"\nplanner's choice {chosen}: measured / fastest ({fastest}) = {ratio:.3f} (target <= 1.10)", flush=True)
    mem = memory_rows(progs, feed, weights, cluster) if not args.no_memory else []
    chosen_mem = [r for r in mem if r["plan"] == chosen]
    plan_error = None
    if chosen_mem and plan is not None:
        worst = max(abs(r["error"]) for r in chosen_mem if r["error"] is not None)
        # The plan's own figure (the search's, for the whole plan) against each rank's measured peak.
        plan_error = max(abs((plan.memory or 0) / 2**20 / r["measured_MiB"] - 1) for r in chosen_mem)
        print(f"planner's choice: each rank's memory_report / measured, worst {worst:.1%}; the plan's "
              f"{(plan.memory or 0) / 2**20:.1f} MiB / each rank's measured, worst {plan_error:.1%} "
              "(target <= 15%)", flush=True)
    return {"model": args.model, "plan": plan.describe() if plan else None,
            "plan_json": json.loads(plan.to_json()) if plan else None, "chosen": chosen, "fastest": fastest,
            "ratio": ratio, "simulated_ms": {n: v * 1e3 for n, v in sim.items()},
            "measured_ms": {n: [x * 1e3 for x in v] for n, v in got.items()}, "memory": mem,
            "plan_memory_MiB": (plan.memory or 0) / 2**20 if plan else None, "plan_memory_error": plan_error}


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
    ap.add_argument("--planner", action="store_true", help="the planner's choice against the candidates, measured")
    ap.add_argument("--memory", default=None, help="--planner: the memory cap per device (default: the cluster's)")
    ap.add_argument("--no-memory", action="store_true", help="--planner: no memory measurement")
    ap.add_argument("--model", choices=("gpt", "mlp"), default="gpt",
                    help="--planner: the GPT-2 of 4 layers or the MLP (256-1024-1024-256, batch 512)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_ground_truth.json"))
    args = ap.parse_args()

    cluster = load_or_calibrate(args)
    step, weights, feed = build(args.model if args.planner else "gpt")
    names = args.plans or list(PLANS)
    if args.planner:
        out = run_planner(args, cluster, step, weights, feed, names)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"cluster": cluster.name, "planner": out}, indent=1))
        print(f"wrote {args.out}")
        return
    simulate_and_measure(args, cluster, step, weights, feed, names)


def load_or_calibrate(args):
    """The cluster file given, or this machine calibrated now as 4 gloo ranks (written to --save-cluster)."""
    from partita.cluster import load_cluster
    from partita.cluster.calibrate import calibrate, write_cluster

    if args.cluster:
        return load_cluster(args.cluster)
    t0 = time.perf_counter()
    cluster = calibrate(nproc=4, threads=1, quick=args.quick, progress=lambda s: print(s, flush=True))
    Path(args.save_cluster).parent.mkdir(parents=True, exist_ok=True)
    write_cluster(cluster, args.save_cluster)
    print(f"calibrated in {time.perf_counter() - t0:.0f} s; wrote {args.save_cluster}", flush=True)
    return cluster


def simulate_and_measure(args, cluster, step, weights, feed, names: list[str]) -> None:
    """The six plans simulated and measured (the simulator against real runs)."""
    from partita.cluster import simulate

    progs, sim = {}, {}
    for name in names:
        progs[name] = partita.parallelize(step, **PLANS[name])
        res = simulate(progs[name], cluster, memory=False)
        sim[name] = res.step_time
        print(f"{name:>8}: simulated {res.step_time * 1e3:8.1f} ms", flush=True)
    if args.simulate_only:
        return
    got = measure_times(progs, feed, weights, 1 if args.quick else args.rounds, args.steps)
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
