"""``partita run FILE.pir --nproc N --mesh dp=2,tp=2 --strategy ...``: a parallel run.

The graph is parallelized with the strategy, the plan summary is printed (the full plan with
``--plan``, JSON with ``--plan-json``), and the per-rank programs run for ``--steps`` steps
on local gloo processes (or on torchrun's group) with synthetic data. ``--train`` first
turns a forward graph into a training step. ``--check`` runs the single-device graph on the
same data and prints each step's loss beside the single-device one, with a verdict.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..ir.diagnostics import PartitaError
from .common import float_arg, int_arg


class RunError(PartitaError):
    """A parallel run that cannot start (the message says why and what to change)."""


def add_arguments(r: argparse.ArgumentParser) -> None:
    g = r.add_argument_group("parallel run (with --mesh)")
    g.add_argument("--mesh", help="device mesh, e.g. dp=2,tp=2; runs the graph in parallel")
    g.add_argument("--nproc", type=int_arg(1), help="number of processes (must equal the mesh size; default: it)")
    g.add_argument("--strategy", default=None,
                   help="dp, zero1, zero2, zero3, megatron, sp, joined with '+' (e.g. dp+megatron)")
    g.add_argument("--annotate", action="append", default=[], metavar="NAME=PLACEMENT",
                   help="placement of one value, e.g. 'x=[dp, -]' (repeatable)")
    g.add_argument("--train", choices=("adamw", "sgd"), help="train: build the training step of a forward graph")
    g.add_argument("--lr", type=float_arg(0, above=True), default=1e-3,
                   help="learning rate with --train (default 1e-3)")
    g.add_argument("--steps", type=int_arg(1), default=3, help="steps to run (default 3)")
    g.add_argument("--check", action="store_true", help="compare every step with the single-device graph")
    g.add_argument("--plan", nargs="?", const=True, default=None, metavar="PLAN.json",
                   help="alone: print the full plan (every collective and placement); with a file written by "
                        "'partita plan -o': run that plan (its mesh, strategy, pipeline and recomputation)")
    g.add_argument("--plan-json", metavar="FILE", help="write the plan as JSON")
    g.add_argument("--html", metavar="OUT.html", help="write one HTML page of the graph (with --mesh: of the parallel "
                                                     "program and its schedule; partita view, docs/view.md)")
    g.add_argument("--open", action="store_true", help="with --html: open the page in a browser when one exists")
    g.add_argument("--show-rank", type=int_arg(0), metavar="R", help="print the per-rank program (every rank runs it)")
    g.add_argument("--checkpoint", metavar="DIR", help="save the final params as a sharded checkpoint in DIR")
    g.add_argument("--resume", metavar="DIR", help="start from the latest checkpoint in DIR (any mesh)")
    g.add_argument("--timeout", type=float_arg(0, above=True), default=60.0,
                   help="seconds before a silent peer is a failure (default 60)")
    g.add_argument("--dist-backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="process-group backend: nccl with one GPU per rank, gloo on CPUs; auto (default) picks nccl "
                        "when this machine has a GPU for every local rank")
    g.add_argument("--allow-replication", action="store_true",
                   help="accept ops without a sharding rule that gather split operands")
    p = r.add_argument_group("pipeline (with 'pp' in --strategy and a pp axis in --mesh)")
    p.add_argument("--microbatches", type=int_arg(1), help="split the batch into this many microbatches (default 1)")
    p.add_argument("--schedule", help="gpipe, 1f1b (default), interleaved or zero-bubble")
    p.add_argument("--virtual-stages", type=int_arg(1), help="model chunks per pp rank (schedule interleaved)")
    p.add_argument("--stages", metavar="CUT",
                   help="the stage cut: layer names each later stage starts at (h.3,h.7) or layers per stage (3,3,2)")


def cmd_run_parallel(args: argparse.Namespace) -> int:
    """Under torchrun every process runs this; only rank 0 prints."""
    import contextlib
    import os

    if os.environ.get("RANK", "0") != "0" and "WORLD_SIZE" in os.environ:
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            return _run_parallel(args)
    return _run_parallel(args)


def apply_plan_file(args: argparse.Namespace, fwd: Any) -> dict[str, Any]:
    """``--plan PLAN.json``: its mesh, strategy and pipeline options into ``args`` (a forward graph
    is trained with adamw unless --train says otherwise): the plan and the recomputation to build with."""
    if not isinstance(args.plan, str):
        return {}
    from ..parallel.pipeline.build import is_training
    from ..planning import Plan, PlanError

    if args.mesh or args.strategy or args.stages or args.microbatches or args.schedule or args.virtual_stages:
        raise RunError(f"--plan {args.plan}: the plan names the mesh, strategy and pipeline options; drop --mesh, "
                       "--strategy and the pipeline options, or drop --plan")
    try:
        plan = Plan.from_json(Path(args.plan).read_text(encoding="utf-8"))
    except OSError as e:
        raise RunError(f"--plan {args.plan}: cannot read it ({e.strerror}); give the file 'partita plan -o' wrote")
    except PlanError as e:
        raise RunError(f"--plan {args.plan}: {e}") from None
    args.mesh, args.strategy, args.plan = plan.mesh, plan.strategy, None
    print(f"plan {plan.describe()}")
    if is_training(fwd):
        return {"plan": plan}
    args.train = args.train or "adamw"
    return {"plan": plan, "recompute": plan.recompute}


def _run_parallel(args: argparse.Namespace) -> int:
    from .. import training_step
    from .common import require_weights
    from .train import synthetic_batch
    from ..ir.parser import parse_file
    from ..ir.verifier import verify
    from ..parallel.strategy import parallelize
    from ..runtime.parallel_run import launch

    fwd = parse_file(args.file)
    verify(fwd)
    require_weights(fwd, args.file)
    planned = apply_plan_file(args, fwd)
    recompute = {"recompute": planned["recompute"]} if planned.get("recompute", "none") != "none" else {}
    graph = fwd
    classes = None
    if args.train:
        out0 = fwd.outputs[0]
        loss: Any = 0 if out0.type.shape == () else "cross_entropy"
        classes = out0.type.shape[-1] if loss == "cross_entropy" else None
        opts = {"lr": args.lr} if args.train == "sgd" else {"lr": args.lr, "eps": 1e-6}
        if args.strategy and "megatron" in args.strategy:
            from ..passes.split_projections import split_projections

            fwd = fwd.clone()
            n = split_projections(fwd)
            if n:
                print(f"split-projections: {n} fused projection(s) split into one per piece (params renamed "
                      "<name>.split<i>), so tensor parallelism can split them")
        graph = training_step(fwd, loss=loss, optimizer=args.train, **opts, **recompute)
    annotations = {}
    for a in args.annotate:
        name, sep, placement = a.partition("=")
        if not sep:
            raise RunError(f"--annotate '{a}': write NAME=PLACEMENT, e.g. 'x=[dp, -]'")
        annotations[name.strip()] = placement.strip()
    pipeline: dict[str, Any] = {}
    for key in ("microbatches", "schedule", "virtual_stages"):
        if getattr(args, key, None) is not None:
            pipeline[key] = getattr(args, key)
    if getattr(args, "stages", None):
        parts = [x.strip() for x in args.stages.split(",") if x.strip()]
        pipeline["stages"] = [int(x) for x in parts] if all(x.isdigit() for x in parts) else parts
    t0 = time.perf_counter()
    if planned:
        pipeline = {"plan": planned["plan"]}
    prog = parallelize(graph, None if planned else args.mesh, None if planned else args.strategy, annotations or None,
                       allow_replication=args.allow_replication, **pipeline)
    timings = prog.plan.timings
    print(f"parallelize @{graph.name} for {prog.mesh} with {prog.strategy}: {time.perf_counter() - t0:.2f} s "
          f"({', '.join(f'{k} {v:.2f} s' for k, v in timings.items() if k != 'total')})")
    print(prog.plan.text() if args.plan else prog.plan.summary())
    if hasattr(prog, "rank_graphs") and not args.plan:
        print("\nschedule:\n" + prog.plan.chart)
    if args.plan_json:
        Path(args.plan_json).write_text(prog.plan.to_json())
        print(f"wrote the plan to {args.plan_json}")
    if args.show_rank is not None:
        if not 0 <= args.show_rank < prog.mesh.size:
            raise RunError(f"--show-rank {args.show_rank}: the mesh {prog.mesh} has ranks 0..{prog.mesh.size - 1}")
        coords = ", ".join(f"{a}={c}" for a, c in zip(prog.mesh.names, prog.mesh.coords(args.show_rank)))
        if hasattr(prog, "rank_graphs"):
            print(f"\nrank {args.show_rank}'s program (at {coords}; the ranks of its pipeline stage run it on their "
                  "own pieces):")
            print(prog.text(args.show_rank))
        else:
            print(f"\nthe per-rank program (rank {args.show_rank} at {coords} runs it on its own pieces):")
            print(prog.text())
    rng = np.random.default_rng(args.seed)
    batches = [synthetic_batch(graph, fwd, rng, classes) for _ in range(args.steps)]
    n = prog.mesh.size

    def progress(rank: int, step: int, seconds: float) -> None:
        if rank == 0:
            print(f"  rank 0 finished step {step + 1}/{args.steps} in {seconds * 1e3:.1f} ms", file=sys.stderr)

    from ..runtime.launch import resolve_backend

    print(f"\nrunning {args.steps} step(s) on {n} process(es) ({resolve_backend(args.dist_backend, n)}) ...", flush=True)
    t1 = time.perf_counter()
    res = launch(prog, args.nproc, batches, steps=args.steps, check=args.check, timeout_s=args.timeout,
                 backend=args.dist_backend,
                 checkpoint_dir=args.checkpoint, resume_from=args.resume, progress=progress)
    print(f"{args.steps} step(s) in {time.perf_counter() - t1:.2f} s (including process start); median step "
          f"{np.median(res.step_seconds) * 1e3:.1f} ms on the slowest rank")
    if hasattr(prog, "rank_graphs") and prog.plan.measured_bubble is not None:
        print(f"pipeline bubble: predicted {prog.plan.bubble:.1%}, measured {prog.plan.measured_bubble:.1%} (the time "
              "the ranks spent waiting in recv)")
    if args.html:
        from .view import write_view

        # After the launch, so that a pipeline's page draws the measured bubble under the predicted one.
        write_view(prog, args.html, run=res if hasattr(prog, "rank_graphs") else None, open_it=args.open)
    if args.check:
        print(f"\n{'step':>4}  {'loss (' + str(n) + ' ranks)':>16}  {'loss (1 device)':>16}  {'worst rel. error':>16}")
        for c in res.checks:
            lo = f"{c.loss:.6f}" if c.loss is not None else "-"
            so = f"{c.single_loss:.6f}" if c.single_loss is not None else "-"
            print(f"{c.step:>4}  {lo:>16}  {so:>16}  {c.worst:>16.2e}")
        worst = max(res.checks, key=lambda c: c.worst)
        verdict = "PASS" if res.passed else "FAIL"
        print(f"check: {verdict}: every output of every step within {res.tolerance:g} of the single-device graph"
              if res.passed else f"check: {verdict}: step {worst.step}, %{worst.worst_output} differs by "
              f"{worst.worst:.2e} (> {res.tolerance:g})")
        if not res.passed:
            return 1
    else:
        losses = res.losses()
        print("output 0 per step: " + ", ".join(f"{x:.6f}" for x in losses))
    if args.checkpoint:
        print(f"saved a sharded checkpoint of step {res.checkpoint_step} in {args.checkpoint}")
    return 0
