"""``partita simulate``: one step of a parallel program on a cluster on paper.

The model is a ``.pir`` file (``FILE.pir``; a forward graph is made a training step with
``--train``) or a GPT built from its config without weights (``--gpt
LAYERS,HIDDEN,HEADS,SEQ,VOCAB,BATCH``). It is parallelized with ``--mesh`` and ``--strategy``
(and the pipeline flags), then simulated on ``--cluster`` (a shipped name or a ``.toml``
file): the step time, tokens/s, MFU and HFU, each simulated rank's time and memory, the
communication per axis; ``--trace`` writes the timeline as a Chrome trace (Perfetto).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..ir.diagnostics import PartitaError
from .common import int_arg


class SimulateError(PartitaError):
    """A simulate command that cannot start (the message says what to change)."""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    s = sub.add_parser("simulate", parents=[common], help="simulate one parallel step on a cluster on paper",
                       description="Parallelize a model and simulate one step of its per-rank programs on a cluster "
                                   "described by a cluster file: step time, tokens/s, MFU/HFU, memory per rank.")
    s.add_argument("file", metavar="FILE.pir", nargs="?", help="the model (or give --gpt)")
    s.add_argument("--gpt", metavar="L,H,A,S,V,B",
                   help="a GPT from its config, no weights: layers, hidden, heads, sequence, vocab, batch")
    s.add_argument("--dtype", default="bf16", help="with --gpt: the model dtype (default bf16)")
    s.add_argument("--cluster", default="selene", help="a shipped cluster (see 'partita cluster') or a .toml file "
                                                       "(default selene)")
    s.add_argument("--nodes", type=int_arg(1), help="use this many nodes of the cluster's kind")
    s.add_argument("--mesh", default="dp=1", help="device mesh, e.g. pp=2,dp=4,tp=8 (default dp=1)")
    s.add_argument("--strategy", default=None, help="e.g. pp+dp+megatron, zero3 (default: from the mesh axes)")
    s.add_argument("--train", choices=("adamw", "sgd"), default="adamw",
                   help="optimizer of the training step made from a forward graph (default adamw)")
    s.add_argument("--master-weights", action="store_true", help="mixed precision: f32 master weights and moments")
    s.add_argument("--recompute", choices=("none", "cheap", "selective", "full"), default="none",
                   help="activation recomputation (default none)")
    s.add_argument("--microbatches", type=int_arg(1), help="pipeline microbatches")
    s.add_argument("--schedule", help="gpipe, 1f1b (default), interleaved or zero-bubble")
    s.add_argument("--virtual-stages", type=int_arg(1), help="model chunks per pp rank (schedule interleaved)")
    s.add_argument("--every-rank", action="store_true", help="simulate every rank, not alike ranks once")
    s.add_argument("--check-memory", action="store_true", help="fail when a rank exceeds its device's memory")
    s.add_argument("--trace", metavar="OUT.json", help="write the timeline as a Chrome trace (Perfetto)")
    s.set_defaults(handler=cmd_simulate)


def _model(args: argparse.Namespace) -> Any:
    from .. import training_step
    from ..parallel.pipeline.build import is_training

    if (args.file is None) == (args.gpt is None):
        raise SimulateError("simulate: give a model, either FILE.pir or --gpt LAYERS,HIDDEN,HEADS,SEQ,VOCAB,BATCH")
    if args.gpt is not None:
        from ..models import gpt

        try:
            layers, hidden, heads, seq, vocab, batch = (int(x) for x in args.gpt.split(","))
        except ValueError:
            raise SimulateError(f"--gpt '{args.gpt}': give six whole numbers, layers,hidden,heads,seq,vocab,batch "
                                "(e.g. 24,2304,24,2048,51200,8)") from None
        fwd = gpt(layers, hidden, heads, seq, vocab, batch=batch, dtype=args.dtype)
    else:
        from ..ir.parser import parse_file
        from ..ir.verifier import verify

        fwd = parse_file(args.file)
        verify(fwd)
        if is_training(fwd):
            return fwd
    if args.strategy and "megatron" in args.strategy:
        from ..passes.split_projections import split_projections

        split_projections(fwd)
    out0 = fwd.outputs[0]
    loss: Any = 0 if out0.type.shape == () else "cross_entropy"
    opts: dict[str, Any] = {"recompute": args.recompute}
    if args.master_weights:
        opts["master_weights"] = True
    return training_step(fwd, loss=loss, optimizer=args.train, **opts)


def cmd_simulate(args: argparse.Namespace) -> int:
    from ..cluster import load_cluster, simulate
    from ..cluster.simulator import check_fits_cluster
    from ..ir.mesh import Mesh
    from ..parallel.strategy import parallelize

    cluster = load_cluster(args.cluster)
    if args.nodes is not None:
        cluster = cluster.with_nodes(args.nodes)
    check_fits_cluster(Mesh.of(args.mesh), cluster)      # before any work
    t0 = time.perf_counter()
    step = _model(args)
    t1 = time.perf_counter()
    print(f"model @{step.name}: {sum(1 for _ in step.nodes)} nodes, built in {t1 - t0:.2f} s")
    pipeline: dict[str, Any] = {k: getattr(args, k) for k in ("microbatches", "schedule", "virtual_stages")
                                if getattr(args, k) is not None}
    prog = parallelize(step, args.mesh, args.strategy, **pipeline)
    t2 = time.perf_counter()
    print(f"parallelize for {prog.mesh} with {prog.strategy}: {t2 - t1:.2f} s")
    res = simulate(prog, cluster, dedup=not args.every_rank, trace=args.trace is not None,
                   check_memory=args.check_memory, progress=print)
    print(f"simulated in {time.perf_counter() - t2:.2f} s\n")
    print(res.text())
    if args.trace:
        res.chrome_trace(args.trace)
        print(f"\nwrote the timeline to {args.trace} (open it in https://ui.perfetto.dev or chrome://tracing)")
    return 0
