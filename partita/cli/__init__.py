"""The ``partita`` command: ``import``, ``opt``, ``verify``, ``run``, ``demo`` and ``ops``.

Exit codes: 0 success, 1 an error the user can fix (a ``PartitaError``, a missing file, an
interrupt), 2 a usage error (bad flags), 3 an internal error (a bug in partita). Errors
print as one ``error: ...`` message without a traceback; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..ir.diagnostics import PartitaError, WeightsError
from ..ir.graph import Graph, Value, input_name

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3

DEFAULT_PIPELINE = "canonicalize,cse,fold-constants,dce"
EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
DEMO_MODEL = EXAMPLES_DIR / "block.pir"


class CLIError(PartitaError):
    """A problem with what was asked of the command line (not with the IR itself)."""


# --- entry point ------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``partita`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits on --help (0) and on usage errors (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if getattr(args, "handler", None) is None:
        parser.print_usage(sys.stderr)
        print("partita: error: a command is required (import, opt, verify, run, train, demo, ops); "
              "see 'partita --help'", file=sys.stderr)
        return EXIT_USAGE
    debug = bool(args.debug)
    try:
        return args.handler(args) or EXIT_OK
    except BrokenPipeError:
        # The reader of our stdout went away (e.g. `partita ops | head`): not an error of ours.
        _silence_stdout()
        return EXIT_ERROR
    except KeyboardInterrupt:
        _report(debug, "error: interrupted")
        return EXIT_ERROR
    except PartitaError as e:
        _report(debug, _user_message(e))
        return EXIT_ERROR
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        _report(debug, f"error: {where}{e.strerror or e}")
        return EXIT_ERROR
    except Exception as e:
        _report(debug, f"internal error: {type(e).__name__}: {e}\n"
                       "This is a bug in partita, not in your input. "
                       "Run the same command with --debug to see the traceback.")
        return EXIT_INTERNAL


def _user_message(e: PartitaError) -> str:
    msg = str(e) or type(e).__name__
    # Parse and verifier errors already read "file:line:col: error: ...", the usual
    # compiler form; prefixing another "error:" would only add noise.
    first = msg.split("\n", 1)[0]
    return msg if ": error: " in first or first.startswith("error: ") else f"error: {msg}"


def _report(debug: bool, message: str) -> None:
    if debug:
        traceback.print_exc(file=sys.stderr)
    print(message, file=sys.stderr)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a real file (e.g. captured in tests): nothing to silence


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``partita`` command (exposed for tests and docs)."""
    from .. import __version__

    # --debug is accepted before or after the subcommand; SUPPRESS keeps a subparser from
    # resetting a value the main parser already set.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show Python tracebacks for errors")

    p = argparse.ArgumentParser(
        prog="partita",
        description="partita: a deep-learning compiler. Optimize, verify and run .pir graphs.",
        epilog="Run 'partita demo' for a tour, or 'partita COMMAND --help' for one command.",
    )
    p.add_argument("--version", action="version", version=f"partita {__version__}")
    p.add_argument("--debug", action="store_true", default=False, help="show Python tracebacks for errors")
    sub = p.add_subparsers(title="commands", metavar="COMMAND")

    im = sub.add_parser("import", parents=[common], help="import an ONNX model or a PyTorch module as .pir",
                        description="Import MODEL and write OUT.pir with its weights beside it "
                                    "(OUT.safetensors). MODEL is an .onnx file, or 'package.module:factory': "
                                    "a function (found with the current directory on sys.path) that takes "
                                    "no arguments and returns a torch.nn.Module, exported with torch.export "
                                    "on random inputs of the --example types.")
    im.add_argument("model", metavar="MODEL", help="model.onnx, or package.module:factory")
    im.add_argument("-o", "--output", required=True, metavar="OUT.pir", help="where to write the graph")
    im.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                    help="ONNX only: the static shape of an input whose shape is symbolic (repeatable)")
    im.add_argument("--example", action="append", default=[], metavar="TYPE",
                    help="PyTorch only: the type of the next positional input, e.g. 'f32[8,128]' or "
                         "'i64[2,16]' (repeatable, in argument order)")
    im.add_argument("--seed", type=int, default=0, help="seed of the random example inputs (default 0)")
    im.set_defaults(handler=cmd_import)

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
    o.set_defaults(handler=cmd_opt)

    v = sub.add_parser("verify", parents=[common], help="check that a .pir file is valid IR",
                       description="Parse FILE, check every IR invariant, and check the weights beside "
                                   "it (if any) against the graph's parameters.")
    v.add_argument("file", metavar="FILE.pir")
    v.set_defaults(handler=cmd_verify)

    r = sub.add_parser("run", parents=[common], help="run a .pir file on random inputs",
                       description="Run FILE on random inputs (floats standard normal, integers in "
                                   "[0, 8), bools fair coins) with the weights from the .safetensors file "
                                   "beside it, and summarize each output.")
    r.add_argument("file", metavar="FILE.pir")
    r.add_argument("--backend", choices=("numpy", "torch"), default="numpy",
                   help="numpy: the reference interpreter (default); torch: the torch executor")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    from .run_parallel import add_arguments as _parallel_run_arguments

    _parallel_run_arguments(r)
    r.set_defaults(handler=cmd_run)

    d = sub.add_parser("demo", parents=[common], help="optimize and run the built-in example model",
                       description="Load the built-in example (a small transformer block with "
                                   "redundancies), optimize it, and check the optimized graph against "
                                   "the original on both executors.")
    d.add_argument("--passes", default=DEFAULT_PIPELINE, metavar="PIPELINE",
                   help=f"the pipeline to run (default: {DEFAULT_PIPELINE})")
    d.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    d.set_defaults(handler=cmd_demo)

    s = sub.add_parser("ops", parents=[common], help="list the registered ops",
                       description="List every registered op with its operands and attributes; "
                                   "with NAME, show one op in detail.")
    s.add_argument("name", nargs="?", metavar="NAME", help="show only this op, in detail")
    s.set_defaults(handler=cmd_ops)

    from .train import add_parser as add_train_parser

    add_train_parser(sub, common)
    return p


# --- commands ---------------------------------------------------------------------------

def cmd_import(args: argparse.Namespace) -> int:
    """``partita import``: import an ONNX file or a PyTorch factory, verify, write .pir + weights."""
    from .. import save
    from ..ir.verifier import verify

    out = Path(args.output)
    if out.suffix != ".pir":
        raise CLIError(f"-o {out}: the output must be a .pir file (its weights go beside it, in .safetensors)")
    t0 = time.perf_counter()
    if _is_onnx_source(args.model):
        if args.example:
            raise CLIError(f"--example is for PyTorch factories; {args.model} is an ONNX file, whose input "
                           "types come from the file (use --input-shape NAME=D0,D1 for symbolic shapes)")
        graph = _import_onnx_file(args.model, args.input_shape)
    else:
        if args.input_shape:
            raise CLIError("--input-shape is for ONNX files; for a PyTorch factory give each input's type "
                           "with --example, e.g. --example 'f32[8,128]'")
        graph = _import_torch_factory(args.model, args.example, args.seed)
    verify(graph)
    problems = weight_problems(graph)
    if problems:
        raise WeightsError(f"the imported graph's weights do not match its params: {'; '.join(problems)}")
    elapsed = time.perf_counter() - t0
    save(graph, out)
    n_in = sum(1 for v in graph.inputs if v.role == "input")
    n_param = sum(1 for v in graph.inputs if v.role != "input")
    wrote = f"{out} and {weights_path(out)}" if len(graph.weights) else str(out)
    print(f"imported @{graph.name}: {len(graph)} nodes, {n_in} inputs, {n_param} params, "
          f"{graph.weights.nbytes} bytes of weights, {elapsed:.2f} s; wrote {wrote}")
    return EXIT_OK


def _is_onnx_source(model: str) -> bool:
    return model.endswith(".onnx") or (Path(model).is_file() and ":" not in Path(model).name)


def parse_input_shapes(specs: list[str]) -> dict[str, Sequence[int]]:
    """``['x=8,128', 'mask=8']`` -> ``{'x': (8, 128), 'mask': (8,)}``; CLIError naming a bad spec."""
    shapes: dict[str, Sequence[int]] = {}
    for spec in specs:
        name, eq, dims = spec.partition("=")
        parts = [d.strip() for d in dims.split(",")] if dims.strip() else []
        if not eq or not name.strip() or not all(d.isdigit() for d in parts):
            raise CLIError(f"--input-shape {spec!r}: expected NAME=D0,D1,... with non-negative integer sizes, "
                           "e.g. --input-shape input_ids=2,16")
        shapes[name.strip()] = tuple(int(d) for d in parts)
    return shapes


def _import_onnx_file(path: str, shape_specs: list[str]) -> Graph:
    from ..frontend.onnx import import_onnx

    shapes = parse_input_shapes(shape_specs)
    if not Path(path).exists():
        raise CLIError(f"{path}: no such file")
    return import_onnx(path, input_shapes=shapes or None)


def example_tensors(types: list[str], seed: int) -> list[Any]:
    """Random torch tensors of the given ``.pir`` types (floats standard normal, integers in
    [0, 8), bools fair coins); CLIError naming a type that does not parse."""
    import torch

    from ..ir.diagnostics import ParseError
    from ..ir.parser import parse_type
    from ..ops._lazy import to_torch_dtype

    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, text in enumerate(types):
        try:
            t = parse_type(text, f"--example #{i + 1}")
        except ParseError as e:
            raise CLIError(f"--example {text!r} is not a tensor type like 'f32[8,128]':\n{e}") from None
        shape = tuple(t.shape)
        if t.dtype.is_float:
            x = torch.randn(shape, generator=gen).to(to_torch_dtype(t.dtype))
        elif t.dtype.is_int:
            x = torch.randint(0, 8, shape, generator=gen).to(to_torch_dtype(t.dtype))
        else:
            x = torch.rand(shape, generator=gen) < 0.5
        out.append(x)
    return out


def load_factory_module(spec: str) -> Any:
    """Resolve 'package.module:factory' (current directory on sys.path), call the factory with no
    arguments and return its nn.Module in eval mode; CLIError saying what went wrong where."""
    import importlib

    mod_name, colon, attr = spec.partition(":")
    if not colon or not mod_name or not attr or not all(p.isidentifier() for p in mod_name.split(".")) \
            or not all(p.isidentifier() for p in attr.split(".")):
        raise CLIError(f"{spec!r} is neither an .onnx file nor a factory path; write 'package.module:function', "
                       "e.g. 'my_pkg.models:build', or give the path of an existing .onnx file")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        # What `python -c` and `python -m` do: modules of the current directory are importable.
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name and (mod_name == e.name or mod_name.startswith(e.name + ".")):
            raise CLIError(f"cannot find module '{mod_name}' (no '{e.name}' in {cwd} or on sys.path); run "
                           "from the directory that contains the package, or install it") from None
        raise CLIError(f"importing {mod_name} failed: {type(e).__name__}: {e}") from e
    except Exception as e:  # the user's module raised while being imported
        raise CLIError(f"importing {mod_name} failed: {type(e).__name__}: {e}") from e
    factory: Any = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            from ..ir.diagnostics import suggest

            names = [n for n in dir(factory) if not n.startswith("_")]
            raise CLIError(f"{mod_name} ({getattr(module, '__file__', '?')}) has no '{attr}'"
                           f"{suggest(part, names)}") from None
        factory = getattr(factory, part)
    if not callable(factory):
        raise CLIError(f"{spec} is a {type(factory).__name__}, not a function; it must take no arguments "
                       "and return a torch.nn.Module")
    try:
        model = factory()
    except Exception as e:
        raise CLIError(f"calling {spec}() failed: {type(e).__name__}: {e} (the factory must take no "
                       "arguments and return a torch.nn.Module)") from e
    import torch

    if not isinstance(model, torch.nn.Module):
        raise CLIError(f"{spec}() returned a {type(model).__name__}, not a torch.nn.Module")
    return model.eval()


def _import_torch_factory(spec: str, example_types: list[str], seed: int) -> Graph:
    from ..frontend.torch_export import import_torch

    model = load_factory_module(spec)
    if not example_types:
        raise CLIError(f"{spec}: give the type of each positional input of forward() with --example, "
                       "e.g. --example 'f32[8,128]'")
    examples = example_tensors(example_types, seed)
    import torch

    with torch.no_grad():
        return import_torch(model, tuple(examples))


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
    pm = _pass_manager(args.passes, verify_each=verify_each, timing=args.timing,
                       print_ir_before=_name_list(args.print_ir_before),
                       print_ir_after=_name_list(args.print_ir_after))
    before = len(graph)
    result = pm.run(graph)  # with timing=True the manager prints its table to stderr
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


def cmd_run(args: argparse.Namespace) -> int:
    """``partita run``: run on random inputs and summarize the outputs."""
    from .. import run
    from ..ir.parser import parse_file
    from ..ir.verifier import verify

    if args.mesh or args.nproc or args.strategy:
        from .run_parallel import RunError, cmd_run_parallel

        if not args.mesh:
            raise RunError("a parallel run needs --mesh (e.g. --mesh dp=2,tp=2); --nproc and --strategy go with it")
        return cmd_run_parallel(args)
    graph = parse_file(args.file)
    verify(graph)
    require_weights(graph, args.file)
    inputs = random_inputs(graph, args.seed)
    if args.backend == "torch":
        import torch  # noqa: F401  (imported here so the time below is the run, not the import)
    t0 = time.perf_counter()
    outs = [to_numpy(o) for o in run(graph, inputs, backend=args.backend)]
    elapsed = time.perf_counter() - t0
    print(f"@{graph.name} on {args.backend} ({len(graph)} nodes, random inputs with seed {args.seed}, "
          f"{elapsed * 1e3:.1f} ms)")
    rows = [[f"%{_display_name(v, i)}", str(v.type), *summary_fields(a)]
            for i, (v, a) in enumerate(zip(graph.outputs, outs))]
    print(format_table(["output", "type", "min", "max", "mean", "std", "first values"], rows))
    return EXIT_OK


def cmd_ops(args: argparse.Namespace) -> int:
    """``partita ops``: the op registry as a table, or one op in detail."""
    from ..ops.registry import OPS, get_op

    if args.name:
        print(describe_op(get_op(args.name)))
        return EXIT_OK
    import textwrap

    sigs = {name: f"{name}({', '.join(OPS[name].operands)})" for name in OPS}
    width = min(40, max(len(s) for s in sigs.values()) + 2)
    lines = []
    for name in sorted(OPS):
        op = OPS[name]
        sig = sigs[name]
        lines.append((sig.ljust(width) + _first_sentence(op.doc)).rstrip() if len(sig) < width
                     else sig + "\n" + " " * width + _first_sentence(op.doc))
        if op.attrs:
            attrs = "{" + ", ".join(_format_attr_spec(a) for a in op.attrs) + "}"
            lines.append(textwrap.fill(attrs, width=100, initial_indent="    ", subsequent_indent="     ",
                                       break_on_hyphens=False))
    print("\n".join(lines))
    print(f"\n{len(OPS)} ops. 'partita ops NAME' shows one op in detail.")
    return EXIT_OK


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
    say = _Section()
    say.title(f"partita demo: @{before.name} from {_short(path)}")
    print(f"{len(before)} nodes; weights: {len(w)} tensors, {w.nbytes / 1024:.1f} KiB "
          f"({_short(weights_path(path))}). The file's comments say which redundancies it holds.")
    say.title(f"IR before ({len(before)} nodes)")
    sys.stdout.write(print_graph(before))

    pm = _pass_manager(args.passes, verify_each=True)
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
            results[label, backend] = [to_numpy(o) for o in run(g, inputs, backend=backend)]
    say.title(f"outputs on the same random inputs (seed {args.seed})")
    rows = []
    for label, backend in results:
        for i, (v, a) in enumerate(zip(before.outputs, results[label, backend])):
            rows.append([f"%{_display_name(v, i)}", label, backend, *summary_fields(a)])
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

    say.title("parallel: a GPT-2 training step on a dp=2 x tp=2 mesh of 4 processes")
    if not demo_parallel(args.seed, out_dir=Path("build/demo")):
        print("\nThe parallel run disagrees with the single-device step: this is a bug.", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


# --- helpers shared by the commands ---------------------------------------------------------

def _pass_manager(pipeline: str, **options: Any):
    from ..passes.manager import PassManager

    return PassManager.parse(pipeline, **options)


def _name_list(values: list[str]) -> tuple[str, ...]:
    """Flags given several times or as 'a,b' both become ('a', 'b')."""
    out: list[str] = []
    for v in values:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return tuple(out)


def weights_path(pir_path: str | os.PathLike) -> Path:
    """Where the weights of a ``.pir`` file live: the ``.safetensors`` file beside it."""
    return Path(pir_path).with_suffix(".safetensors")


def weight_problems(graph: Graph) -> list[str]:
    """Each param or state input that has no weight, or a weight of another type."""
    from ..ir.dtypes import from_numpy

    problems = []
    for v in graph.inputs:
        if v.role == "input":
            continue
        name = input_name(v)
        if name not in graph.weights:
            problems.append(f"no weight for %{name} ({v.role}, {v.type})")
            continue
        a = graph.weights[name]
        got = f"{from_numpy(a.dtype).name}[{','.join(map(str, a.shape))}]"
        if got != str(v.type):
            problems.append(f"%{v.name} ({v.role}) is {v.type} in the graph but {got} in the weights file")
    return problems


def require_weights(graph: Graph, pir_path: str | os.PathLike) -> None:
    """Raise a WeightsError naming the weights file and each param/state it fails to supply."""
    needed = [v for v in graph.inputs if v.role != "input"]
    if not needed:
        return
    wpath = weights_path(pir_path)
    if not wpath.exists():
        names = ", ".join(f"%{v.name}" for v in needed)
        raise WeightsError(f"{pir_path} needs weights for {len(needed)} param/state input(s) ({names}), "
                           f"but {wpath} does not exist; put the weights there (partita.save writes "
                           "both files)")
    problems = weight_problems(graph)
    if problems:
        raise WeightsError(f"{wpath} does not match {pir_path}: " + "; ".join(problems))


def random_inputs(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Random arrays for the ``input``-role values of ``graph``, reproducible from ``seed``.

    Floats are standard normal, integers uniform in [0, 8) (small enough to be valid
    indices into most dimensions), bools fair coin flips.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for v in graph.inputs:
        if v.role != "input":
            continue
        t = v.type
        if t.dtype.is_float:
            a = rng.standard_normal(t.shape).astype(t.dtype.np)
        elif t.dtype.is_int:
            a = rng.integers(0, 8, size=t.shape).astype(t.dtype.np)
        else:
            a = rng.random(t.shape) < 0.5
        out[input_name(v)] = np.asarray(a)
    return out


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy array from a NumPy array or a torch tensor (bf16 included)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):
        from ..backend.torch_exec import to_numpy as torch_to_numpy

        return torch_to_numpy(x)
    return np.asarray(x)


def summary_fields(a: np.ndarray, first: int = 4) -> list[str]:
    """min, max, mean, std and the first few values of an array, as display strings.

    Statistics are over the finite values (computed in f64); NaN and infinity are counted
    separately so they cannot hide.
    """
    flat = np.asarray(a).reshape(-1)
    if flat.size == 0:
        return ["-", "-", "-", "-", "(empty)"]
    head = ", ".join(_fmt_value(x) for x in flat[:first].tolist())
    if flat.size > first:
        head += ", ..."
    head = f"[{head}]"
    if flat.dtype == np.bool_:
        n = int(flat.sum())
        return ["false" if n < flat.size else "true", "true" if n else "false",
                f"{n / flat.size:.3g}", "-", f"{head} ({n}/{flat.size} true)"]
    x = flat.astype(np.float64)
    finite = np.isfinite(x)
    bad = flat.size - int(finite.sum())
    if bad:
        n_nan = int(np.isnan(x).sum())
        head += f" ({n_nan} nan, {bad - n_nan} inf)"
        x = x[finite]
        if x.size == 0:
            return ["-", "-", "-", "-", head]
    return [_fmt_value(x.min()), _fmt_value(x.max()), f"{x.mean():.4g}", f"{x.std():.4g}", head]


def _fmt_value(x: Any) -> str:
    if isinstance(x, (bool, np.bool_)):
        return "true" if x else "false"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{float(x):.4g}"


def compare(xs: list[np.ndarray], ys: list[np.ndarray], rtol: float, atol: float) -> tuple[float, bool]:
    """The largest |x - y| over pairs of arrays, and whether all agree within tolerances.

    NaN in the same place on both sides counts as agreement (same as ``equal_nan``).
    """
    worst = 0.0
    ok = len(xs) == len(ys)
    for x, y in zip(xs, ys):
        if x.shape != y.shape:
            return float("inf"), False
        a, b = x.astype(np.float64), y.astype(np.float64)
        with np.errstate(invalid="ignore"):
            d = np.abs(a - b)
        same_special = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
        d = np.where(same_special, 0.0, d)
        d = np.where(np.isnan(d), np.inf, d)  # NaN against a number: as different as can be
        if d.size:
            worst = max(worst, float(d.max()))
        ok &= bool(np.all(d <= atol + rtol * np.where(np.isfinite(b), np.abs(b), 0.0)))
    return worst, ok


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned text columns, two spaces apart, with a rule under the header."""
    cols = len(header)
    widths = [len(h) for h in header]
    for r in rows:
        for i in range(cols):
            widths[i] = max(widths[i], len(r[i]))

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def describe_op(op) -> str:
    """A few lines about one op record: signature, attributes, facts, effects, doc."""
    lines = [f"{op.name}({', '.join(op.operands)})"]
    if op.doc:
        lines.append(f"  {op.doc}")
    if op.attrs:
        lines.append("  attributes:")
        for a in op.attrs:
            lines.append(f"    {_format_attr_spec(a)}" + (f"  (one of {', '.join(map(repr, a.choices))})"
                                                            if a.choices else ""))
    facts = [f for f in ("elementwise", "commutative", "involution", "idempotent") if getattr(op, f)]
    for side in ("left_identity", "right_identity"):
        val = getattr(op, side)
        if val is not None:
            facts.append(f"{side.replace('_', ' ')} {val:g}")
    if facts:
        lines.append(f"  facts: {', '.join(facts)}")
    effects = op.effects
    if callable(effects):
        lines.append("  effects: depend on the attributes")
    elif effects:
        lines.append(f"  effects: {', '.join(sorted(effects))} (never removed, merged or reordered)")
    if op.defined_at is not None:
        lines.append(f"  defined at {_short(op.defined_at.file)}:{op.defined_at.line}")
    return "\n".join(lines)


def _format_attr_spec(a) -> str:
    from ..ir.printer import format_attr
    from ..ops.registry import REQUIRED

    if a.default is REQUIRED:
        return f"{a.name}: {a.kind}"
    try:
        default = format_attr(a.default)
    except TypeError:
        default = repr(a.default)
    return f"{a.name}: {a.kind} = {default}"


def _first_sentence(doc: str) -> str:
    doc = " ".join(doc.split())
    return doc if len(doc) <= 58 else doc[:55] + "..."


def _display_name(v: Value, i: int) -> str:
    return v.name if v.name is not None else f"out{i}"


def _op_count_rows(before: Graph, after: Graph) -> list[list[str]]:
    from collections import Counter

    cb = Counter(n.op for n in before.nodes)
    ca = Counter(n.op for n in after.nodes)
    rows = [[op, str(cb[op]), str(ca[op]) if ca[op] else "-"] for op in sorted(set(cb) | set(ca),
                                                                               key=lambda o: (-cb[o], o))]
    rows.append(["total", str(sum(cb.values())), str(sum(ca.values()))])
    return rows


def _short(path: str | os.PathLike) -> str:
    """A path relative to the current directory when that is shorter."""
    p = Path(path)
    try:
        rel = os.path.relpath(p)
    except ValueError:
        return str(p)
    return rel if len(rel) < len(str(p)) else str(p)


class _Section:
    """Prints section titles, separated by a blank line."""

    def __init__(self) -> None:
        self.first = True

    def title(self, text: str) -> None:
        if not self.first:
            print()
        self.first = False
        print(f"== {text} ==")

