"""``partita import``: an ONNX file or a PyTorch factory as ``.pir`` with its weights."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ..ir.diagnostics import WeightsError
from ..ir.graph import Graph
from .common import EXIT_OK, CLIError, seed_arg, too_big_for_memory, weight_problems, weights_path


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
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
    im.add_argument("--seed", type=seed_arg, default=0, help="seed of the random example inputs (default 0)")
    im.set_defaults(handler=cmd_import)


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
        if t.dtype.storage:
            raise CLIError(f"--example #{i + 1} {text!r}: {t.dtype.name} is a storage type (quantized data, "
                           "cast and data movement only); a PyTorch module's example input needs a type torch "
                           "computes with, e.g. f32, bf16, i64 or bool")
        shape = tuple(t.shape)
        why = f"{t.rank} dims, more than the 64 a tensor may have" if t.rank > 64 else too_big_for_memory(t, 4)
        if why:
            raise CLIError(f"--example #{i + 1} {text!r}: {why}; give it a smaller shape")
        try:
            if t.dtype.is_float:
                x = torch.randn(shape, generator=gen).to(to_torch_dtype(t.dtype))
            elif t.dtype.is_int:
                x = torch.randint(0, 8, shape, generator=gen).to(to_torch_dtype(t.dtype))
            else:
                x = torch.rand(shape, generator=gen) < 0.5
        except (RuntimeError, ValueError, TypeError, MemoryError) as e:
            raise CLIError(f"--example #{i + 1} {text!r}: torch cannot make random values of that type "
                           f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'out of memory'}); "
                           "give a dtype torch has and a smaller shape") from None
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
