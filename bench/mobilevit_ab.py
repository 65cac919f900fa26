"""A/B of ``move_chain``'s rules on a zoo model's import path (MobileViT's patch unfold and fold).

``fold_move_chains`` (reshape/transpose chains as one transpose) and any rule of
``codegen/library.py`` called by name in fuse-library; ``--rules`` names those "before" goes
without (default ``fold_move_chains``).

The import path (bench_zoo's IMPORT_PIPELINE, ``CompiledProgram(freeze=True)``) is built twice:
with the rules replaced by no-ops ("before") and with it ("after"); each is checked
against eager, then the two are called in turn in interleaved rounds of thread CPU time (one
thread), medians printed with the ratio. ``--count`` only builds both graphs of each named model
and prints their node and transpose counts (no timing).

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/mobilevit_ab.py mobilevit [--rounds 11] [--rules fold_move_chains]
      .venv/bin/python bench/mobilevit_ab.py mobilevit,mobilevit_v2,swin --count
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bench_zoo as Z  # noqa: E402
import zoo_models as ZM  # noqa: E402
from zoo_rewrite_ab import report_ab  # noqa: E402

RULES = ("fold_move_chains",)
OFF: list[str] = list(RULES)   # the rules "before" goes without (--rules)


@contextlib.contextmanager
def folding(after: bool) -> Iterator[None]:
    """The rules of ``OFF`` as they are (``after``) or no-ops, for the passes run inside."""
    import partita.codegen.library as L

    saved = {r: getattr(L, r) for r in OFF}
    if not after:
        for r in OFF:
            setattr(L, r, lambda g: 0)
    try:
        yield
    finally:
        for r, f in saved.items():
            setattr(L, r, f)


def graph(case: Any, after: bool) -> Any:
    """The import path's graph of ``case`` with the chains folded (``after``) or not."""
    import partita

    with folding(after), Z.quiet():
        return partita.optimize(partita.import_torch(case.model, (), case.kwargs), Z.IMPORT_PIPELINE)


def build(case: Any, after: bool) -> tuple[Any, list, dict]:
    """The import path's program of ``case`` (the program's own passes with the same choice),
    checked against eager."""
    from partita.codegen import CompiledProgram

    g = graph(case, after)
    with folding(after):
        prog = CompiledProgram(g, freeze=True)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    args = [case.tensors[str(v.name)] for v in g.inputs if v.role == "input"]
    ref = case.eager().double().numpy()
    err = float(np.abs(np.asarray(prog(args, weights)[0]) - ref).max() / max(np.abs(ref).max(), 1e-30))
    tag = "after" if after else "before"
    if err > Z.TOL:
        raise AssertionError(f"{tag}: error {err:.1e} > {Z.TOL:.0e}")
    steps = prog.program.steps
    print(f"{tag}: {len(steps)} steps ({sum(st[7].op == 'transpose' for st in steps)} transposes), error {err:.1e}")
    return prog, args, weights


def count(names: list[str]) -> None:
    """Node and transpose counts of each model's graph, before and after."""
    for name in names:
        case = Z.Case(ZM.BY_NAME[name], Path(tempfile.mkdtemp()))
        row = []
        for after in (False, True):
            nodes = list(graph(case, after).nodes)
            row.append(f"{len(nodes)} nodes, {sum(n.op == 'transpose' for n in nodes)} transposes")
        print(f"{name}: before {row[0]}; after {row[1]}")


def main(argv: list[str] | None = None) -> int:
    """Build both programs, time them in interleaved rounds, print the medians."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a zoo model (with --count: names separated by commas)")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--count", action="store_true", help="node counts only, no timing")
    ap.add_argument("--rules", default=",".join(RULES), help="the rules 'before' goes without")
    a = ap.parse_args(argv)
    OFF[:] = a.rules.split(",")
    torch.set_num_threads(1)
    if a.count:
        count(a.model.split(","))
        return 0
    case = Z.Case(ZM.BY_NAME[a.model], Path(tempfile.mkdtemp()))
    progs = {"before": build(case, False), "after": build(case, True)}
    report_ab(a.model, progs, a.rounds, a.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
