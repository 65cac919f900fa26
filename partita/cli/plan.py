"""``partita plan``: the fastest parallel plan of a model on a cluster, within a memory cap.

``partita plan MODEL --cluster selene --nodes 8 --memory 80GiB -o plan.json``: MODEL is a
``.pir`` file (a forward graph or a training step), a named model (``llama3-8b``; ``partita
simulate --list-models``) or ``--hf-config config.json``, the last two sized by ``--seq`` and
``--batch``. Prints the chosen plan and why (the next best, each rejected family) and writes
it as JSON with ``-o`` (``partita.Plan.from_json`` reads it). See docs/plan.md.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ..ir.diagnostics import PartitaError
from .common import check_output_path, int_arg


class PlanCommandError(PartitaError):
    """A plan command that cannot start (the message says what to change)."""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    s = sub.add_parser("plan", parents=[common], help="find the fastest parallel plan that fits a memory cap",
                       description="Search meshes, strategies, pipeline options and recomputation for a model on "
                                   "a cluster; the simulator prices the best; the plan never exceeds the cap.")
    s.add_argument("model", metavar="MODEL", nargs="?",
                   help="a .pir file or a named model (partita simulate --list-models); or give --hf-config")
    s.add_argument("--hf-config", metavar="CONFIG.json", help="a transformers decoder config, no weights")
    s.add_argument("--seq", type=int_arg(1), help="named model or --hf-config: the sequence length")
    s.add_argument("--batch", type=int_arg(1), help="named model or --hf-config: the global batch in sequences")
    s.add_argument("--cluster", default="selene", help="a shipped cluster or a .toml file (default selene)")
    s.add_argument("--nodes", type=int_arg(1), help="plan for this many nodes of the cluster's kind")
    s.add_argument("--devices", type=int_arg(1), help="plan for this many devices (default: every device)")
    s.add_argument("--memory", default=None, help="memory cap per device, e.g. 80GiB (default the device's)")
    s.add_argument("--recompute", choices=("none", "selective", "full"), action="append",
                   help="restrict recomputation to these (repeatable; default all three)")
    s.add_argument("--price", type=int_arg(1), default=4, help="meshes the simulator prices (default 4)")
    s.add_argument("--sharding", choices=("words", "milp", "both"), default="words",
                   help="placements of a tp axis: the strategy words' (megatron, sp), the per-op sharding integer "
                        "program's, or both priced and the faster kept (default words)")
    s.add_argument("-o", "--output", metavar="PLAN.json", help="write the plan as JSON")
    s.set_defaults(handler=cmd_plan)


def load_model(args: argparse.Namespace) -> Any:
    """The forward graph (or step) the command plans."""
    from .. import load
    from ..models import ModelError, hf_config_model, named_model

    if (args.model is None) == (args.hf_config is None):
        raise PlanCommandError("plan: give one model: a .pir file, a named model, or --hf-config config.json")
    if args.model is not None and (args.model.endswith(".pir") or os.path.exists(args.model)):
        if args.seq or args.batch:
            raise PlanCommandError("plan: --seq and --batch size a named model or --hf-config; a .pir file has its own")
        return load(args.model)
    try:
        if args.model is not None:
            m = named_model(args.model)
        else:
            try:
                with open(args.hf_config, encoding="utf-8") as f:
                    cfg = json.load(f)
            except json.JSONDecodeError as e:
                raise PlanCommandError(f"--hf-config {args.hf_config}: not JSON ({e.msg} at line {e.lineno})") from None
            m, _notes = hf_config_model(cfg, name=os.path.basename(args.hf_config).removesuffix(".json"))
        return m.build(seq=args.seq, batch=args.batch)
    except ModelError as e:
        raise PlanCommandError(f"plan: {e}") from None


def cmd_plan(args: argparse.Namespace) -> int:
    from ..cluster import load_cluster
    from ..planning import plan, report_text
    from ..planning.planner import leave_garbage_to_exit

    if getattr(args, "process_exits", False):
        leave_garbage_to_exit()
    if args.output:
        check_output_path(args.output, "-o")
    graph = load_model(args)
    cluster = load_cluster(args.cluster)
    if args.nodes:
        cluster = cluster.with_nodes(args.nodes)
    p = plan(graph, cluster, args.memory, devices=args.devices, price=args.price,
             recompute=tuple(args.recompute) if args.recompute else None, progress=None, sharding=args.sharding)
    print(report_text(p))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(p.to_json())
        print(f"wrote {args.output}")
    return 0
