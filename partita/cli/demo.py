"""``partita demo``: optimize the built-in example model and check it on both executors,
then train it and run a parallel training step."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..backend.common import as_numpy
from ..ir.graph import Graph
from .common import (DEFAULT_PIPELINE, DEMO_MODEL, EXIT_ERROR, EXIT_OK, CLIError, Section, compare,
                     display_name, format_table, pass_manager, random_inputs, require_weights, seed_arg, short,
                     summary_fields, weights_path)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    d = sub.add_parser("demo", parents=[common], help="optimize and run the built-in example model",
                       description="Load the built-in example (a small transformer block with "
                                   "redundancies), optimize it, and check the optimized graph against "
                                   "the original on both executors.")
    d.add_argument("--passes", default=DEFAULT_PIPELINE, metavar="PIPELINE",
                   help=f"the pipeline to run (default: {DEFAULT_PIPELINE})")
    d.add_argument("--seed", type=seed_arg, default=0, help="seed of the random inputs (default 0)")
    d.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """``partita demo``: optimize the example model and check it numerically."""
    from .. import run
    from ..ir.parser import parse_file
    from ..ir.printer import print_graph
    from ..ir.verifier import verify

    path = DEMO_MODEL
    if not path.exists():
        raise CLIError(f"the demo model {path} is missing from this installation; "
                       "reinstall partita (pip install -e .)")
    before = parse_file(path)
    verify(before)
    require_weights(before, path)
    w = before.weights
    say = Section()
    say.title(f"partita demo: @{before.name} from {short(path)}")
    print(f"{len(before)} nodes; weights: {len(w)} tensors, {w.nbytes / 1024:.1f} KiB "
          f"({short(weights_path(path))}). The file's comments say which redundancies it holds.")
    say.title(f"IR before ({len(before)} nodes)")
    sys.stdout.write(print_graph(before))

    pm = pass_manager(args.passes, verify_each=True)
    after = pm.run(before.clone())
    verify(after)
    say.title(f"pipeline {args.passes} (verifier after every pass)")
    for p in pm.passes:
        doc = (type(p).__doc__ or "").strip().split("\n", 1)[0]
        print(f"  {p.text():<16} {doc}")
    print()
    sys.stdout.write(pm.timing_table())
    say.title(f"IR after ({len(after)} nodes, {len(before) - len(after)} fewer)")
    sys.stdout.write(print_graph(after))
    say.title("op counts")
    print(format_table(["op", "before", "after"], _op_count_rows(before, after)))

    inputs = random_inputs(before, args.seed)
    results: dict[tuple[str, str], list[np.ndarray]] = {}
    for label, g in (("before", before), ("after", after)):
        for backend in ("numpy", "torch"):
            results[label, backend] = [as_numpy(o) for o in run(g, inputs, backend=backend)]
    say.title(f"outputs on the same random inputs (seed {args.seed})")
    rows = []
    for label, backend in results:
        for i, (v, a) in enumerate(zip(before.outputs, results[label, backend])):
            rows.append([f"%{display_name(v, i)}", label, backend, *summary_fields(a)])
    print(format_table(["output", "graph", "executor", "min", "max", "mean", "std", "first values"], rows))

    say.title("differences (max |a - b| over all outputs)")
    rtol, atol = 1e-4, 1e-5
    checks = [("before vs after", ("before", "numpy"), ("after", "numpy")),
              ("before vs after", ("before", "torch"), ("after", "torch")),
              ("numpy vs torch", ("before", "numpy"), ("before", "torch")),
              ("numpy vs torch", ("after", "numpy"), ("after", "torch"))]
    rows = []
    all_ok = True
    for what, key_a, key_b in checks:
        diff, ok = compare(results[key_a], results[key_b], rtol, atol)
        all_ok &= ok
        where = f"on {key_a[1]}" if key_a[1] == key_b[1] else f"{key_a[0]} graph"
        rows.append([what, where, f"{diff:.3g}", "agree" if ok else "DIFFER"])
    print(format_table(["comparison", "", "max |diff|", f"within rtol={rtol:g}, atol={atol:g}"], rows))
    if not all_ok:
        print("\nThe optimized graph does not compute the same values as the original: this is a bug.",
              file=sys.stderr)
        return EXIT_ERROR
    print(f"\nThe optimized graph computes the same outputs with {len(after)} nodes instead of "
          f"{len(before)}.")

    from .train import demo_training

    say.title("training: the optimized graph as one training step (grad + adamw passes)")
    if not demo_training(after, args.seed):
        print("\nThe two executors disagree on the training losses: this is a bug.", file=sys.stderr)
        return EXIT_ERROR
    print("\nBoth executors run the same training step and agree on every loss; the loss falls as "
          "the block fits the batch.")

    from ..runtime.demo import demo_parallel

    say.title("parallel: a GPT-2 training step on a pp=2 x dp=2 x tp=2 mesh of 8 processes (1F1B pipeline)")
    if not demo_parallel(args.seed, out_dir=Path("build/demo")):
        print("\nThe parallel run disagrees with the single-device step: this is a bug.", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def _op_count_rows(before: Graph, after: Graph) -> list[list[str]]:
    from collections import Counter

    cb = Counter(n.op for n in before.nodes)
    ca = Counter(n.op for n in after.nodes)
    rows = [[op, str(cb[op]), str(ca[op]) if ca[op] else "-"] for op in sorted(set(cb) | set(ca),
                                                                               key=lambda o: (-cb[o], o))]
    rows.append(["total", str(sum(cb.values())), str(sum(ca.values()))])
    return rows
