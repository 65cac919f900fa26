"""``partita verify``: check that a ``.pir`` file (and the weights beside it) is valid."""

from __future__ import annotations

import argparse
from typing import Any

from ..ir.diagnostics import WeightsError
from .common import EXIT_OK, weight_problems, weights_path


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    v = sub.add_parser("verify", parents=[common], help="check that a .pir file is valid IR",
                       description="Parse FILE, check every IR invariant, and check the weights beside "
                                   "it (if any) against the graph's parameters.")
    v.add_argument("file", metavar="FILE.pir")
    v.set_defaults(handler=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    """``partita verify``: parse and verify; check weights when a weights file is present."""
    from ..ir.parser import parse_file
    from ..ir.verifier import verify

    graph = parse_file(args.file)
    verify(graph)
    if len(graph.weights):
        problems = weight_problems(graph)
        if problems:
            raise WeightsError(f"{weights_path(args.file)} does not match {args.file}: " + "; ".join(problems))
    n_in = sum(1 for v in graph.inputs if v.role == "input")
    n_param = sum(1 for v in graph.inputs if v.role == "param")
    n_state = sum(1 for v in graph.inputs if v.role == "state")
    state = f", {n_state} state" if n_state else ""
    print(f"{args.file}: ok ({len(graph)} nodes, {n_in} inputs, {n_param} params{state})")
    return EXIT_OK
