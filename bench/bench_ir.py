"""Benchmark of the IR core: parse, print, verify, and a pass pipeline, at 10^3..10^5 nodes.

    .venv/bin/python bench/bench_ir.py                 # sizes 1000, 10000, 100000; 5 runs each
    .venv/bin/python bench/bench_ir.py --sizes 1000 --repeats 3

The graphs are synthetic but shaped like real ones: chains of elementwise ops with
broadcasting (a [B, D] activation and [D] parameters), reductions with attributes, matmuls,
splits with two results, and redundancies for the passes to remove (multiplications by a
constant 1, additions of 0, duplicated subexpressions, dead branches), and source locations
on every node, as a frontend writes them. Tensors are small,
because only the IR is measured, never execution.

Every figure is the median of ``--repeats`` runs on one thread. The pipeline is timed on a
fresh copy of the graph each run (the copy is not timed). The script prints a table and
writes JSON to bench/results/.
"""

from __future__ import annotations

import os

# One thread everywhere, set before NumPy (and its BLAS) is imported.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import partita  # noqa: E402
from partita.ir import Builder, Graph, Location, TensorType, f32, parse, print_graph, verify  # noqa: E402
from partita.ops.registry import OPS  # noqa: E402

PIPELINE = "canonicalize,cse,dce"
RESULTS_DIR = ROOT / "bench" / "results"
B, D = 4, 16


def build_graph(target_nodes: int, seed: int = 0) -> Graph:
    """A valid graph of about ``target_nodes`` nodes (a little over, never under)."""
    rng = np.random.default_rng(seed)
    g = Graph("bench")
    b = Builder(g)
    x = b.input("x", TensorType((B, D), f32))
    n_params = max(4, min(64, target_nodes // 200))
    biases = [b.param(f"b{i}", TensorType((D,), f32)) for i in range(n_params)]
    weights = [b.param(f"w{i}", TensorType((D, D), f32)) for i in range(max(2, n_params // 4))]
    have = set(OPS)
    has_const = "constant" in have
    b.loc = Location("model.py", 1)
    if has_const:
        one = b.constant(value=np.ones((), np.float32))
        zero = b.constant(value=np.zeros((D,), np.float32))
    outputs = []
    block = 0
    while len(g) < target_nodes:
        bias = biases[block % len(biases)]
        b.loc = Location("model.py", 10 + block % 90)        # frontends record source lines
        h = b.add(x, bias)                                  # [B,D] + [D] broadcasts
        h = b.mul(h, one) if has_const else h               # x * 1: canonicalize
        a = b.gelu(h, approximate="tanh") if block % 3 == 0 else b.relu(h)
        ms = b.mean(b.mul(a, a), axes=(1,), keepdim=True)   # [B,1]
        m = b.mul(a, b.rsqrt(ms))                           # [B,D] * [B,1] broadcasts
        dup = b.mul(h, b.sigmoid(h))                        # silu by hand ...
        dup2 = b.mul(h, b.sigmoid(h))                       # ... twice: cse
        e = b.add(dup, dup2)
        if has_const:
            e = b.add(e, zero)                              # x + 0: canonicalize
        dead = b.neg(b.tanh(m))                             # never used: dce
        del dead
        c = b.where(b.greater(m, e), m, e)
        if block % 4 == 3:
            c = b.matmul(c, weights[block % len(weights)])
        if "split" in have and block % 5 == 4:
            lo, hi = b.split(c, axis=1, sizes=(D // 2, D // 2))
            c = b.concat(hi, lo, axis=1) if "concat" in have else b.add(c, b.sum(lo, axes=(1,), keepdim=True))
        if "softmax" in have and block % 7 == 6:
            c = b.softmax(c, axis=-1)
        if rng.random() < 0.02:
            outputs.append(b.mean(c, axes=(0,)))
        x = c
        block += 1
    b.ret(x, *outputs)
    verify(g)
    return g


def run_times(fn: Callable, repeats: int, setup: Callable[[], object] | None = None) -> tuple[list[float], list[float]]:
    """Wall and CPU times of ``repeats`` calls of ``fn`` (each after an untimed ``setup``).

    CPU time (this process, one thread) is the work done on one core; wall time also counts
    the moments the shared host lends this machine less than a core.
    """
    wall, cpu = [], []
    for _ in range(repeats):
        arg = setup() if setup is not None else None
        # Start each run from a clean heap; collections during the run are part of the cost
        # a user sees, so the collector stays on.
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        fn(arg) if setup is not None else fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def bench_size(n: int, repeats: int, pipeline: str = PIPELINE) -> dict:
    """Time every stage on a graph of about ``n`` nodes."""
    from partita.passes.manager import PassManager

    g = build_graph(n)
    nodes = len(g)
    text = print_graph(g)
    parsed = parse(text, "bench.pir")
    assert print_graph(parsed) == text, "print -> parse -> print must be the identity"
    fast_pm = lambda: PassManager.parse(pipeline, verify_each=False, snapshot=False, reproducer_dir=None)  # noqa: E731
    safe_pm = lambda: PassManager.parse(pipeline, reproducer_dir=None)  # noqa: E731
    after = fast_pm().run(parsed.clone())
    stages = {
        "parse": run_times(lambda: parse(text, "bench.pir"), repeats),
        "print": run_times(lambda: print_graph(parsed), repeats),
        "verify": run_times(lambda: verify(parsed), repeats),
        pipeline: run_times(lambda gr: fast_pm().run(gr), repeats, setup=parsed.clone),
        f"{pipeline} (defaults)": run_times(lambda gr: safe_pm().run(gr), repeats, setup=parsed.clone),
    }
    return {
        "nodes": nodes,
        "nodes_after_pipeline": len(after),
        "text_bytes": len(text.encode()),
        "stages": {k: {"median_s": statistics.median(w), "runs_s": w,
                       "cpu_median_s": statistics.median(c), "cpu_runs_s": c,
                       "nodes_per_s": nodes / statistics.median(w),
                       "cpu_nodes_per_s": nodes / statistics.median(c)} for k, (w, c) in stages.items()},
    }


def profile_stages(n: int, pipeline: str, top: int) -> str:
    """cProfile of each stage once on a graph of about ``n`` nodes: the ``top`` functions
    by own time, to show where the time goes."""
    import cProfile
    import io
    import pstats

    from partita.passes.manager import PassManager

    g = build_graph(n)
    text = print_graph(g)
    parsed = parse(text, "bench.pir")
    stages = {
        "parse": lambda: parse(text, "bench.pir"),
        "print": lambda: print_graph(parsed),
        "verify": lambda: verify(parsed),
        pipeline: (lambda gr: lambda: PassManager.parse(pipeline, verify_each=False, snapshot=False,
                                                        reproducer_dir=None).run(gr))(parsed.clone()),
        f"{pipeline} (defaults)": (lambda gr: lambda: PassManager.parse(pipeline, reproducer_dir=None)
                                   .run(gr))(parsed.clone()),
    }
    out = io.StringIO()
    for name, fn in stages.items():
        prof = cProfile.Profile()
        prof.enable()
        fn()
        prof.disable()
        buf = io.StringIO()
        st = pstats.Stats(prof, stream=buf)
        total = st.total_tt  # type: ignore[attr-defined]
        out.write(f"\n{name} ({len(g)} nodes, {total:.2f} s under the profiler): top {top} by own time\n")
        rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]  # type: ignore[attr-defined]
        for (file, line, func), (cc, nc, tt, ct, _) in rows:
            where = f"{Path(file).name}:{line}" if line else file
            out.write(f"  {100 * tt / total:5.1f}%  {tt:6.2f} s  {nc:>9} calls  {func} ({where})\n")
    return out.getvalue()


def machine_info() -> dict:
    """CPU model, core count and software versions, for the record."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "load_average_1_5_15min": list(os.getloadavg()),
            "python": platform.python_version(),
            "platform": platform.platform(), "numpy": np.__version__, "partita": partita.__version__}


def format_report(results: list[dict], repeats: int) -> str:
    """The table of medians, the scaling ratios, and a line for each stage below 100k nodes/s."""
    stages = list(results[0]["stages"])
    lines = []
    head = (f"{'stage':<34} {'nodes':>8} {'wall ms':>9} {'best ms':>9} {'nodes/s':>10} "
            f"{'cpu ms':>9} {'nodes/s cpu':>12}")
    lines.append(head)
    lines.append("-" * len(head))
    for st in stages:
        for r in results:
            s = r["stages"][st]
            lines.append(f"{st:<34} {r['nodes']:>8} {s['median_s'] * 1e3:>9.1f} {min(s['runs_s']) * 1e3:>9.1f} "
                         f"{s['nodes_per_s']:>10,.0f} {s['cpu_median_s'] * 1e3:>9.1f} {s['cpu_nodes_per_s']:>12,.0f}")
    if len(results) > 1:
        lo, hi = results[0], results[-1]
        lines.append("")
        lines.append(f"scaling: time per node at {hi['nodes']} nodes / time per node at {lo['nodes']} nodes "
                     "(1.0 = linear)")
        for st in stages:
            per_lo = lo["stages"][st]["median_s"] / lo["nodes"]
            per_hi = hi["stages"][st]["median_s"] / hi["nodes"]
            lines.append(f"  {st:<32} {per_hi / per_lo:.2f}")
    lines.append(f"\nnodes/s from the median of {repeats} runs (wall clock, and CPU time of this one-thread "
                 f"process); pipeline graphs: "
                 + ", ".join(f"{r['nodes']} -> {r['nodes_after_pipeline']}" for r in results))
    slow = [(st, r["nodes"], r["stages"][st]) for r in results[-1:] for st in stages
            if r["nodes"] >= 100_000 and min(r["stages"][st]["nodes_per_s"], r["stages"][st]["cpu_nodes_per_s"]) < 100_000]
    for st, n, s in slow:
        lines.append(f"BELOW 100,000 nodes/s at {n} nodes: {st} ({s['nodes_per_s']:,.0f} wall, "
                     f"{s['cpu_nodes_per_s']:,.0f} cpu)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write JSON to bench/results/."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--repeats", type=int, default=5, help="runs per figure (median reported; default 5)")
    ap.add_argument("--pipeline", default=PIPELINE, help=f"pass pipeline to time (default: {PIPELINE})")
    ap.add_argument("--profile", action="store_true",
                    help="also print a cProfile summary of each stage at the largest size")
    ap.add_argument("--out", type=Path, default=None, help="JSON file (default: bench/results/bench_ir-TIME.json)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    results = []
    for n in sorted(args.sizes):
        print(f"benchmarking {n} nodes ...", file=sys.stderr, flush=True)
        results.append(bench_size(n, args.repeats, args.pipeline))
    report = format_report(results, args.repeats)
    print(report)
    print(f"load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    profile = profile_stages(max(args.sizes), args.pipeline, top=8) if args.profile else None
    if profile:
        print(profile)
    out = args.out or RESULTS_DIR / f"bench_ir-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join([Path(sys.executable).name, *sys.argv]),
                               "pipeline": args.pipeline, "repeats": args.repeats, "machine": machine_info(),
                               "results": results, "profile": profile}, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
