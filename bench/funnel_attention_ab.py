"""A/B of Funnel's relative attention as one ``attention`` node on one zoo model's import path.

The import path (bench_zoo's IMPORT_PIPELINE, ``CompiledProgram(freeze=True)``) built twice:
with ``funnel_blocks.unit_axis_transpose`` and ``reshape_of_unsqueeze`` (or the rules named by
``--rules``) replaced by no-ops
("before": einsum's unit-axis moves stay, so the spelled attention is not matched) and with them
("after"); each checked against eager, then called in turn in interleaved rounds of thread CPU
time (one thread), medians printed with the ratio.

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/funnel_attention_ab.py funnel [--rounds 11]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bench_zoo as Z  # noqa: E402
import zoo_models as ZM  # noqa: E402
from zoo_rewrite_ab import report_ab  # noqa: E402


RULES = ["unit_axis_transpose", "reshape_of_unsqueeze"]   # --rules replaces them


def build(case: Any, after: bool) -> tuple[Any, list, dict]:
    """The import path's program of ``case`` with or without the two view rules, checked."""
    import partita
    import partita.codegen.funnel_blocks as F
    from partita.codegen import CompiledProgram

    saved = {r: getattr(F, r) for r in RULES}
    if not after:
        for r in RULES:
            setattr(F, r, lambda g, n: False)
    try:
        with Z.quiet():
            g = partita.optimize(partita.import_torch(case.model, (), case.kwargs), Z.IMPORT_PIPELINE)
    finally:
        for r, f in saved.items():
            setattr(F, r, f)
    prog = CompiledProgram(g, freeze=True)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    args = [case.tensors[str(v.name)] for v in g.inputs if v.role == "input"]
    ref = case.eager().double().numpy()
    err = float(np.abs(np.asarray(prog(args, weights)[0]) - ref).max() / max(np.abs(ref).max(), 1e-30))
    name = "after" if after else "before"
    if err > Z.TOL:
        raise AssertionError(f"{name}: error {err:.1e} > {Z.TOL:.0e}")
    n_att = sum(1 for n in g.nodes if n.op == "attention")
    print(f"{name}: {len(prog.program.steps)} steps, {n_att} attention nodes, error {err:.1e}")
    return prog, args, weights


def main(argv: list[str] | None = None) -> int:
    """Build both programs, time them in interleaved rounds, print the medians."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="funnel")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rules", help="comma-separated funnel_blocks rules turned off for 'before' "
                    "(default: unit_axis_transpose,reshape_of_unsqueeze)")
    a = ap.parse_args(argv)
    if a.rules:
        RULES[:] = a.rules.split(",")
    torch.set_num_threads(1)
    case = Z.Case(ZM.BY_NAME[a.model], tempfile.mkdtemp())
    progs = {"before": build(case, False), "after": build(case, True)}
    report_ab(a.model, progs, a.rounds, a.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
