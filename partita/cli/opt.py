"""``partita opt``: run a pass pipeline over a ``.pir`` file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .common import DEFAULT_PIPELINE, EXIT_OK, name_list, pass_manager


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    o = sub.add_parser("opt", parents=[common], help="run a pass pipeline over a .pir file",
                       description="Run a pass pipeline over FILE and print the optimized IR (or write it "
                                   "with -o; weights beside FILE are written beside OUT).")
    o.add_argument("file", metavar="FILE.pir")
    o.add_argument("--passes", default=DEFAULT_PIPELINE, metavar="PIPELINE",
                   help=f"comma-separated pass names, e.g. 'cse,dce' (default: {DEFAULT_PIPELINE})")
    o.add_argument("-o", "--output", metavar="OUT.pir", help="write the IR to OUT.pir instead of stdout")
    o.add_argument("--timing", action="store_true", help="print time per pass to stderr")
    o.add_argument("--print-ir-before", action="append", default=[], metavar="NAME|all",
                   help="print the IR to stderr before pass NAME (repeatable, or comma-separated)")
    o.add_argument("--print-ir-after", action="append", default=[], metavar="NAME|all",
                   help="print the IR to stderr after pass NAME (repeatable, or comma-separated)")
    o.add_argument("--no-verify", action="store_true",
                   help="skip the verifier on the input and between passes (faster, less safe)")
    o.add_argument("--emit", choices=("ir", "kernels", "kernels-optimized", "memory-plan", "choices"), default="ir",
                   help="what to print: the optimized IR (default), or the generated kernels of it (each "
                        "fused group's body and its LLVM IR; kernels-optimized: after LLVM's optimizations), "
                        "or the static memory plan of the compiled program (buffers, arena offsets, "
                        "lifetimes, peak), or the measured kernel choices (choices: the program is run three times on "
                        "random inputs, and random params where the file has no weights, on this machine; each "
                        "convolution's candidate kernels are timed and the fastest kept). A pipeline without "
                        "fuse-kernels is fused first.")
    o.set_defaults(handler=cmd_opt)


def emit_choices(graph: Any) -> str:
    """The compiled program's measured kernel choices as text: ``graph`` (random params where it
    has no weights) is compiled and run three times on random inputs, which is when its
    convolutions measure their kernels (codegen/choose.py)."""
    import numpy as np

    from ..codegen import CompiledProgram
    from ..codegen.choose import enabled
    from ..ir.graph import input_name
    from .common import random_array, random_inputs

    if not enabled():
        return "; kernel choices are not measured (PARTITA_KERNEL_CHOICE=off): the rules pick every kernel\n"
    g = graph.clone()
    rng = np.random.default_rng(0)
    for v in g.inputs:
        name = input_name(v)
        if v.role == "param" and name not in g.weights and v.type.dtype.is_float:
            g.weights[name] = np.asarray(random_array(v, lambda: (0.1 * rng.standard_normal(v.type.shape))
                                                      .astype(v.type.dtype.np)))
    prog = CompiledProgram(g, fuse=not any(n.op == "fused" for n in g.nodes))
    inputs = random_inputs(g, 0)
    for _ in range(3):
        prog(inputs)
    made = prog.kernel_choices()
    convs = sum(1 for n in prog.graph.nodes if n.op == "conv2d_pointwise")
    head = f"; {convs} library convolution(s), {len(made)} measured kernel choice(s)\n"
    return head + "".join(f"; {line}\n" for line in (c.text() for c in made))


def cmd_opt(args: argparse.Namespace) -> int:
    """``partita opt``: parse, optimize, print or write."""
    from .. import save
    from ..ir.parser import parse_file
    from ..ir.printer import print_graph
    from ..ir.verifier import verify

    graph = parse_file(args.file)
    verify_each = not args.no_verify
    if verify_each:
        # The manager would also reject invalid input, but a plain verifier error reads better.
        verify(graph)
    pm = pass_manager(args.passes, verify_each=verify_each, timing=args.timing,
                       print_ir_before=name_list(args.print_ir_before),
                       print_ir_after=name_list(args.print_ir_after))
    before = len(graph)
    result = pm.run(graph)  # with timing=True the manager prints its table to stderr
    if args.emit != "ir":
        from ..codegen import CompiledProgram, emit_kernels

        if args.emit == "choices":
            text = emit_choices(result)
        elif args.emit == "memory-plan":
            plan = CompiledProgram(result, fuse=not any(n.op == "fused" for n in result.nodes)).memory_plan
            text = plan.text() if plan is not None else "; no memory plan\n"
        else:
            text = emit_kernels(result, optimized=args.emit == "kernels-optimized")
        if args.output:
            Path(args.output).write_text(text)
            print(f"wrote {args.output} (kernels)", file=sys.stderr)
        else:
            sys.stdout.write(text)
        return EXIT_OK
    if args.output:
        out = Path(args.output)
        save(result, out)
        extra = ""
        if len(result.weights):
            extra = f" and {out.with_suffix('.safetensors')} ({len(result.weights)} tensors)"
        print(f"wrote {out} ({len(result)} nodes, was {before}){extra}", file=sys.stderr)
    else:
        sys.stdout.write(print_graph(result))
    return EXIT_OK
