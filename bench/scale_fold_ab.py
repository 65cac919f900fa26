"""The zoo's models on the import path with and without ``scale-fold`` (PARTITA_SCALE_FOLD=0),
interleaved in one process (docs/codegen.md, "Scales folded into frozen weights").

Both programs are ``CompiledProgram(freeze=True)`` of the same imported graph, the second built
with the pass turned off. Each round calls each ``--calls`` times after 5 warm-up calls; printed
are the program's nodes, the largest error against eager of each, and per call the median wall
and thread CPU time (us; the CPU time leaves out the moments the machine gives the core to
another process) with the median of the per-round ratios after / before in brackets.

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/scale_fold_ab.py [--models convnext,t5] [--rounds 15] [--calls 40]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bench_zoo as Z  # noqa: E402
import zoo_models as ZM  # noqa: E402

MODELS = "convnext,convnext_v2,t5,llama,gemma2,qwen3,bert,vit"


def build(case: Any, g: Any, fold: bool) -> tuple[Callable[[], Any], float, int]:
    """(a call of the frozen program, its largest relative error against eager, its nodes)."""
    from partita.codegen import CompiledProgram
    from partita.codegen.scale_fold import ENV

    old = os.environ.get(ENV)
    os.environ[ENV] = "1" if fold else "0"
    try:
        prog = CompiledProgram(g, freeze=True)
    finally:
        if old is None:
            os.environ.pop(ENV)
        else:
            os.environ[ENV] = old
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    args = [case.tensors[str(v.name)] for v in g.inputs if v.role == "input"]
    with torch.inference_mode():
        for _ in range(3):
            out = prog(args, weights)[0]
    want = case.eager()
    err = float((out - want).abs().max() / want.abs().max())
    nodes = sum(n.op != "constant" for n in prog.graph.nodes)
    return (lambda: prog(args, weights)), err, nodes


def main() -> None:
    import partita

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=40)
    o = ap.parse_args()
    for name in o.models.split(","):
        case = Z.Case(ZM.BY_NAME[name], Path(tempfile.mkdtemp()))
        with Z.quiet():
            g = partita.optimize(partita.import_torch(case.model, (), case.kwargs), Z.IMPORT_PIPELINE)
        after, e_after, n_after = build(case, g, True)
        before, e_before, n_before = build(case, g, False)
        cands = {"before": before, "after": after}
        t: dict[str, list[float]] = {k: [] for k in cands}
        cpu: dict[str, list[float]] = {k: [] for k in cands}
        with torch.inference_mode():
            for _ in range(o.rounds):
                for k, f in cands.items():
                    for _ in range(5):
                        f()
                    t0, c0 = time.perf_counter(), time.thread_time()
                    for _ in range(o.calls):
                        f()
                    cpu[k].append((time.thread_time() - c0) / o.calls * 1e6)
                    t[k].append((time.perf_counter() - t0) / o.calls * 1e6)

        def med(d: dict[str, list[float]]) -> str:
            r = statistics.median(a / b for a, b in zip(d["after"], d["before"]))
            return f"{statistics.median(d['before']):.0f} -> {statistics.median(d['after']):.0f} us ({r:.3f})"

        print(f"{name}: nodes {n_before} -> {n_after}; error against eager {e_before:.1e} -> {e_after:.1e}; "
              f"wall {med(t)}; thread CPU {med(cpu)}", flush=True)


if __name__ == "__main__":
    main()
