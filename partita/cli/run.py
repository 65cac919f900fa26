"""``partita run``: run a ``.pir`` file on random inputs and summarize its outputs (with
``--mesh``, a parallel run: see ``run_parallel``)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..backend.common import as_numpy
from . import run_parallel
from .common import EXIT_OK, display_name, format_table, random_inputs, require_weights, seed_arg, summary_fields


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    r = sub.add_parser("run", parents=[common], help="run a .pir file on random inputs",
                       description="Run FILE on random inputs (floats standard normal, integers in "
                                   "[0, 8), bools fair coins) with the weights from the .safetensors file "
                                   "beside it, and summarize each output.")
    r.add_argument("file", metavar="FILE.pir")
    r.add_argument("--backend", choices=("numpy", "torch"), default="numpy",
                   help="numpy: the reference interpreter (default); torch: the torch executor")
    r.add_argument("--seed", type=seed_arg, default=0, help="seed of the random inputs (default 0)")
    run_parallel.add_arguments(r)
    r.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    """``partita run``: run on random inputs and summarize the outputs."""
    from .. import run
    from ..ir.parser import parse_file
    from ..ir.verifier import verify

    if args.mesh or args.nproc or args.strategy or isinstance(args.plan, str):
        from .run_parallel import RunError, cmd_run_parallel

        if not args.mesh and not isinstance(args.plan, str):
            raise RunError("a parallel run needs --mesh (e.g. --mesh dp=2,tp=2); --nproc and --strategy go with it")
        return cmd_run_parallel(args)
    graph = parse_file(args.file)
    verify(graph)
    if args.html:
        from .view import write_view

        write_view(graph, args.html, open_it=args.open)
    require_weights(graph, args.file)
    inputs = random_inputs(graph, args.seed)
    if args.backend == "torch":
        import torch  # noqa: F401  (imported here so the time below is the run, not the import)
    t0 = time.perf_counter()
    outs = [as_numpy(o) for o in run(graph, inputs, backend=args.backend)]
    elapsed = time.perf_counter() - t0
    print(f"@{graph.name} on {args.backend} ({len(graph)} nodes, random inputs with seed {args.seed}, "
          f"{elapsed * 1e3:.1f} ms)")
    rows = [[f"%{display_name(v, i)}", str(v.type), *summary_fields(a)]
            for i, (v, a) in enumerate(zip(graph.outputs, outs))]
    print(format_table(["output", "type", "min", "max", "mean", "std", "first values"], rows))
    return EXIT_OK
