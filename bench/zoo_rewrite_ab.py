"""A/B of fuse-library's Mix-FFN and Funnel rewrites on one zoo model's import path.

The import path (bench_zoo's IMPORT_PIPELINE, ``CompiledProgram(freeze=True)``) built twice: with
``mix_ffn.hoist_activations`` and ``funnel_blocks.tidy_view_writes`` replaced by no-ops
("before") and with them ("after"); each checked against eager, then the two called in turn in
interleaved rounds of thread CPU time (one thread), medians printed with the ratio.

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/zoo_rewrite_ab.py funnel [--rounds 11]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bench_zoo as Z  # noqa: E402
import zoo_models as ZM  # noqa: E402


def build(case: Any, with_rewrites: bool) -> tuple[Any, list, dict]:
    """The import path's program of ``case`` with or without the two rewrites, checked."""
    import partita
    import partita.codegen.library as L
    from partita.codegen import CompiledProgram

    saved = (L.hoist_activations, L.tidy_view_writes)
    if not with_rewrites:
        L.hoist_activations, L.tidy_view_writes = (lambda g: 0), (lambda g: 0)
    try:
        with Z.quiet():
            g = partita.optimize(partita.import_torch(case.model, (), case.kwargs), Z.IMPORT_PIPELINE)
    finally:
        L.hoist_activations, L.tidy_view_writes = saved
    prog = CompiledProgram(g, freeze=True)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    args = [case.tensors[str(v.name)] for v in g.inputs if v.role == "input"]
    ref = case.eager().double().numpy()
    err = float(np.abs(np.asarray(prog(args, weights)[0]) - ref).max() / max(np.abs(ref).max(), 1e-30))
    if err > Z.TOL:
        raise AssertionError(f"{'after' if with_rewrites else 'before'}: error {err:.1e} > {Z.TOL:.0e}")
    print(f"{'after' if with_rewrites else 'before'}: {len(prog.program.steps)} steps, error {err:.1e}")
    return prog, args, weights


def report_ab(model: str, progs: dict[str, tuple[Any, list, dict]], rounds: int, calls: int) -> None:
    """Time the "before" and "after" programs in interleaved rounds of ``calls`` calls each (20
    untimed first), in the thread's CPU time, and print the medians and their ratio."""
    res: dict[str, list[float]] = {k: [] for k in progs}
    for _ in range(rounds):
        for k, (p, args, w) in progs.items():
            for _ in range(20):
                p(args, w)
            t = time.thread_time()
            for _ in range(calls):
                p(args, w)
            res[k].append((time.thread_time() - t) / calls * 1e3)
    b, af = statistics.median(res["before"]), statistics.median(res["after"])
    print(f"{model}: before {b:.3f} ms, after {af:.3f} ms CPU (median of {rounds} rounds), "
          f"after/before {af / b:.3f}")


def main(argv: list[str] | None = None) -> int:
    """Build both programs, time them in interleaved rounds, print the medians."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    case = Z.Case(ZM.BY_NAME[a.model], tempfile.mkdtemp())
    progs = {"before": build(case, False), "after": build(case, True)}
    report_ab(a.model, progs, a.rounds, a.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
