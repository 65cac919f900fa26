"""``partita view FILE.pir -o out.html``: one self-contained HTML page of a graph (with
``--mesh``, of its parallel program; with ``--cluster`` too, of its simulated step).

``write_view`` is what ``simulate --html`` and ``run --mesh ... --html`` call.
"""

from __future__ import annotations

import argparse
import shutil
import webbrowser
from typing import Any

from ..ir.diagnostics import PartitaError
from .common import check_output_path, int_arg


class ViewCommandError(PartitaError):
    """A view command that cannot start (the message says what to change)."""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    v = sub.add_parser("view", parents=[common], help="write one HTML page that shows a graph, its plan and schedule",
                       description="Write one self-contained HTML page (no network request) of FILE.pir: its graph "
                                   "grouped by module, searchable; with --mesh its parallel program (the single-device "
                                   "graph beside the per-rank program with the differences marked, collectives and "
                                   "why, placements on the mesh, the pipeline schedule, memory over the step per rank); "
                                   "with --cluster its simulated step (per-rank streams, waits, memory).")
    v.add_argument("file", metavar="FILE.pir")
    v.add_argument("-o", "--output", metavar="OUT.html", help="the page to write (default FILE.html)")
    v.add_argument("--mesh", help="parallelize for this mesh first, e.g. dp=2,tp=2 (a training step's .pir)")
    v.add_argument("--strategy", help="with --mesh: the strategy (default: from the mesh axes)")
    v.add_argument("--microbatches", type=int_arg(1), help="with a pp axis: pipeline microbatches")
    v.add_argument("--schedule", help="with a pp axis: gpipe, 1f1b (default), interleaved or zero-bubble")
    v.add_argument("--plan", metavar="PLAN.json", help="a plan written by 'partita plan -o': parallelize as it says "
                                                      "(its mesh, strategy, pipeline and recomputation)")
    v.add_argument("--cluster", help="with --mesh or --plan: simulate one step on this cluster and show its timeline")
    v.add_argument("--detail-limit", type=int_arg(1), default=None,
                   help="graphs with more nodes show their layers only (default 150000)")
    v.add_argument("--open", action="store_true", help="open the page in a browser when one exists")
    v.set_defaults(handler=cmd_view)


def open_page(path: str) -> None:
    """Open ``path`` in a browser when one exists; otherwise say so."""
    found = any(shutil.which(b) for b in ("xdg-open", "open", "chromium", "firefox", "google-chrome"))
    if not found or not webbrowser.open("file://" + str(__import__("os").path.abspath(path))):
        print(f"note: no browser found to open {path}; open it yourself")


def write_view(obj: Any, path: str, *, sim: Any = None, open_it: bool = False, **kw: Any) -> dict:
    """Write the page of ``obj`` (and ``sim``) to ``path``, print its size, open it if asked;
    the page's data."""
    import os

    from ..view import write_page

    data = write_page(obj, path, sim=sim, **kw)
    print(f"wrote the view to {path} ({os.path.getsize(path) / 1e6:.2f} MB; open it in a browser)")
    if open_it:
        open_page(path)
    return data


def planned_program(graph: Any, path: str) -> Any:
    """The program of ``graph`` parallelized as the plan file at ``path`` says (a forward graph
    first made a training step with adamw and the plan's recomputation)."""
    from pathlib import Path

    from .. import training_step
    from ..parallel.pipeline.build import is_training
    from ..parallel.strategy import parallelize
    from ..planning import Plan, PlanError

    try:
        plan = Plan.from_json(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ViewCommandError(f"--plan {path}: cannot read it ({e.strerror}); give the file 'partita plan -o' "
                               "wrote") from None
    except PlanError as e:
        raise ViewCommandError(f"--plan {path}: {e}") from None
    print(f"plan {plan.describe()}")
    if not is_training(graph):
        if "megatron" in plan.strategy:
            from ..passes.split_projections import split_projections

            graph = graph.clone()
            split_projections(graph)
        loss: Any = 0 if graph.outputs[0].type.shape == () else "cross_entropy"
        opts = {"recompute": plan.recompute} if plan.recompute != "none" else {}
        graph = training_step(graph, loss=loss, optimizer="adamw", **opts)
    return parallelize(graph, None, None, plan=plan)


def cmd_view(args: argparse.Namespace) -> int:
    """``partita view``: write the page."""
    from ..ir.parser import parse_file
    from ..ir.verifier import verify

    out = args.output or (args.file[:-4] if args.file.endswith(".pir") else args.file) + ".html"
    check_output_path(out, "-o")
    if args.plan and (args.mesh or args.strategy or args.microbatches or args.schedule):
        raise ViewCommandError(f"--plan {args.plan}: the plan names the mesh, strategy and pipeline options; drop "
                               "--mesh, --strategy, --microbatches and --schedule, or drop --plan")
    for flag in ("strategy", "microbatches", "schedule", "cluster"):
        if getattr(args, flag) is not None and not args.mesh and not (flag == "cluster" and args.plan):
            raise ViewCommandError(f"--{flag} goes with --mesh (e.g. --mesh dp=2,tp=2)")
    graph = parse_file(args.file)
    verify(graph)
    obj: Any = graph
    sim = None
    if args.plan:
        obj = planned_program(graph, args.plan)
    elif args.mesh:
        from ..parallel.strategies import default_strategy
        from ..parallel.strategy import parallelize
        from ..ir.mesh import Mesh

        mesh = Mesh.of(args.mesh)
        opts = {k: getattr(args, k) for k in ("microbatches", "schedule") if getattr(args, k) is not None}
        obj = parallelize(graph, mesh, args.strategy or default_strategy(mesh), **opts)
    if args.cluster:
        from ..cluster import simulate

        sim = simulate(obj, args.cluster, trace=True)
    kw = {} if args.detail_limit is None else {"detail_limit": args.detail_limit}
    write_view(obj, out, sim=sim, open_it=args.open, **kw)
    return 0
