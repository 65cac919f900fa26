"""partita: a deep-learning compiler.

    import partita
    g = partita.parse(text)              # or partita.load("model.pir")
    partita.verify(g)
    g = partita.optimize(g, passes="canonicalize,cse,dce")
    outs = partita.run(g, [x], backend="torch")

Graphs without weights, shapes only, from a config: ``partita.models.gpt(...)`` and
``partita.models.llama(...)`` (docs/cluster.md, "Graphs without weights").
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from . import ops as _ops  # noqa: F401  (registers every op)
from .ir import (Builder, DenseAttr, Graph, Location, Node, ParseError, PartitaError, TensorType, Value,
                 VerifyError, Weights, parse_file, verify)
from .ir import parse as _parse, print_graph as _print_graph
from .ir import dtypes  # noqa: F401
from .ir.diagnostics import given as _given
from . import codegen as _codegen  # noqa: F401,E402  (the fused op and the fuse-kernels pass)
from . import autodiff as _autodiff  # noqa: F401,E402  (vjp rules; grad and optimizer passes)
from . import parallel as _parallel  # noqa: F401,E402  (sharding rules)
from . import models  # noqa: F401,E402  (partita.models.gpt, partita.models.llama)
from .planning.plan import Plan  # noqa: E402  (partita.plan's result; the package is partita/planning)
from .view import view  # noqa: E402  (partita.view(obj, "out.html"): the function; its package is partita.view)

__version__ = "0.1.0"


def _check_path(fn: str, path: Any, what: str, error: type = PartitaError) -> None:
    """A file path argument: a non-empty str, bytes or os.PathLike without a NUL byte."""
    import os

    if not isinstance(path, (str, bytes, os.PathLike)):
        raise error(f"partita.{fn}: the path must be a str or os.PathLike naming {what}, got {_given(path)}")
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text:
        raise error(f"partita.{fn}: an empty path names no file; give the path of {what}")
    if "\0" in text:
        raise error(f"partita.{fn}: the path {text!r} contains a NUL byte, which no file name can")


def parse(text: str, filename: str = "<string>") -> Graph:
    """Parse one ``graph`` from ``.pir`` text; raises ParseError with file:line:col."""
    if not isinstance(text, str):
        hint = "; for a file use partita.load(path)" if not isinstance(text, (bytes, bytearray)) else \
            "; decode the bytes first (text.decode())"
        raise PartitaError(f"partita.parse: text must be the .pir text as a str, got {_given(text)}{hint}")
    return _parse(text, filename)


def print_graph(graph: Graph) -> str:
    """The ``.pir`` text of ``graph``."""
    if not isinstance(graph, Graph):
        raise PartitaError(f"partita.print_graph: the graph must be a partita.Graph (from partita.load, partita.parse "
                           f"or an import), got {_given(graph)}")
    return _print_graph(graph)


def load(path) -> Graph:
    """Parse a ``.pir`` file; weights come from the ``.safetensors`` file beside it."""
    import os

    _check_path("load", path, "a .pir file")
    return parse_file(os.fsdecode(path) if isinstance(path, bytes) else path)


def save(graph: Graph, path) -> None:
    """Write ``graph`` as ``path`` (.pir) and its weights beside it (.safetensors)."""
    from pathlib import Path

    path = Path(path)
    path.write_text(print_graph(graph))
    if len(graph.weights):
        graph.weights.save(path.with_suffix(".safetensors"))


def run(graph: Graph, inputs: Sequence[Any] | Mapping[str, Any] | None = None,
        weights: Mapping[str, Any] | None = None, backend: str = "numpy") -> list:
    """Run ``graph`` on ``inputs`` (a list in order, or a dict by name).

    Weights default to ``graph.weights``. ``backend="numpy"`` returns NumPy arrays from the
    reference interpreter; ``backend="torch"`` returns torch tensors.
    """
    if not isinstance(graph, Graph):
        raise PartitaError(f"partita.run: the graph must be a partita.Graph (from partita.load, partita.parse or "
                           f"an import), got {type(graph).__name__}")
    if not isinstance(backend, str):
        raise PartitaError(f"partita.run: backend must be 'numpy' or 'torch', got {_given(backend)}")
    if backend == "numpy":
        from .backend.numpy_ref import run as run_numpy

        return run_numpy(graph, inputs, weights)
    if backend == "torch":
        from .backend.torch_exec import run as run_torch

        return run_torch(graph, inputs, weights)
    raise PartitaError(f"unknown backend '{backend}'; choose 'numpy' or 'torch'")


def load_onnx(model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None, backend: str = "torch") -> Any:
    """An ONNX model as a callable: dynamic axes are bound by the shapes of the inputs it is
    called with (one import per distinct shape), or up front by ``input_shapes``
    (see ``partita.frontend.onnx.OnnxModel``)."""
    from .frontend.onnx import OnnxImportError, load_onnx as _load_onnx

    if not hasattr(model, "SerializeToString"):
        _check_path("load_onnx", model, "an ONNX model file", OnnxImportError)
    return _load_onnx(model, input_shapes, backend)


def import_torch(module: Any, example_args: Sequence[Any], example_kwargs: Mapping[str, Any] | None = None,
                 *, moe_groups: int = 1, capacity_factor: float | None = None) -> Graph:
    """Import a PyTorch module through ``torch.export`` (see ``partita.frontend.torch_export``;
    ``moe_groups`` and ``capacity_factor`` shape mixture-of-experts layers, see
    ``partita.frontend.moe``)."""
    from .frontend.torch_export import import_torch as _import_torch

    return _import_torch(module, example_args, dict(example_kwargs) if example_kwargs is not None else None,
                         moe_groups=moe_groups, capacity_factor=capacity_factor)


def import_onnx(model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Import an ONNX model (a path or ``onnx.ModelProto``; see ``partita.frontend.onnx``)."""
    from .frontend.onnx import OnnxImportError, import_onnx as _import_onnx

    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        _check_path("import_onnx", model, "an ONNX model file", OnnxImportError)
    if input_shapes is not None:
        if not isinstance(input_shapes, Mapping):
            raise OnnxImportError(f"partita.import_onnx: input_shapes must be a mapping from input name to shape, e.g. "
                                  f"{{'x': [1, 3, 224, 224]}}, or None; got {_given(input_shapes)}")
        for key in input_shapes:
            if not isinstance(key, str):
                raise OnnxImportError(f"partita.import_onnx: input_shapes is keyed by the ONNX input's name, got the "
                                      f"key {_given(key)}")
    return _import_onnx(model, dict(input_shapes) if input_shapes is not None else None)


def training_step(graph: Graph, loss: int | str | None = None, optimizer: str | None = "adamw",
                  **options: Any) -> Graph:
    """The training step of a forward graph as one graph (see ``partita.autodiff.training``):
    ``(batch, params, opt_state) -> (loss, new params, new opt state)``."""
    from .autodiff import training_step as _training_step

    return _training_step(graph, loss, optimizer, **options)  # type: ignore[arg-type]


def parallelize(graph: Graph, mesh: Any = None, strategy: str | None = None,
                annotations: Mapping[str, Any] | None = None, **options: Any) -> Any:
    """Rewrite ``graph`` for a device mesh (``"dp=2,tp=2"``) with a strategy (``"dp+megatron"``)
    and/or placements by value name; returns a ``ParallelProgram`` (per-rank program, plan).
    With ``pp`` in the strategy (``mesh="pp=2,dp=2,tp=2", strategy="pp+dp+megatron",
    microbatches=8, schedule="1f1b"``) it returns a ``PipelineProgram``: one program per
    pipeline stage. ``plan=partita.plan(...)`` applies a planner's plan (docs/plan.md). See
    partita/parallel/spmd.py, docs/parallel.md and docs/pipeline.md."""
    import inspect

    from .parallel.strategies.base import StrategyError
    from .parallel.strategy import parallelize as _parallelize

    known = [n for n, p in inspect.signature(_parallelize).parameters.items()
             if p.kind is p.KEYWORD_ONLY and not n.startswith("_")]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise StrategyError(f"parallelize: unknown option(s) {', '.join(unknown)}; the options are {', '.join(known)}")
    return _parallelize(graph, mesh, strategy, annotations, **options)


def plan(model: Graph, cluster: Any, memory: Any = None, **options: Any) -> Any:
    """The fastest parallel plan of ``model`` (a forward graph or training step) on ``cluster``
    (a ``Cluster`` or a cluster file name) within ``memory`` per device: a ``Plan`` to give
    ``parallelize(step, plan=...)``. See partita/planning/ and docs/plan.md."""
    from .planning import plan as _plan

    return _plan(model, cluster, memory, **options)


def launch(program: Any, nproc: int | None = None, inputs: Any = None, **options: Any) -> Any:
    """Run a ``ParallelProgram`` on ``nproc`` local processes (torch.distributed, gloo), or
    join torchrun's group; returns the global outputs per step and the final weights. See
    partita/runtime/parallel_run.py and docs/runtime.md."""
    from .runtime.parallel_run import launch as _launch

    return _launch(program, nproc, inputs, **options)


def optimize(graph: Graph, passes: str = "canonicalize,cse,dce", **options: Any) -> Graph:
    """Run a pass pipeline (a string like ``"canonicalize,cse,dce"``) over ``graph``."""
    import inspect

    from .ir.diagnostics import PassError
    from .passes.manager import PassManager

    known = [p for p in inspect.signature(PassManager.parse).parameters if p not in ("cls", "pipeline")]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise PassError(f"optimize: unknown option(s) {', '.join(unknown)}; the options are {', '.join(known)}")
    return PassManager.parse(passes, **options).run(graph)


def quantize(graph: Graph, mode: str = "weight-only", min_elements: int = 1024) -> Any:
    """Store ``graph``'s weights as int8 with per-channel scales, in place: ``"weight-only"``
    (dequantized where read) or ``"dynamic"`` (matmuls in integers, activations quantized at
    run time). Returns a ``QuantizeReport`` (bytes saved, per-weight error); see
    ``partita.passes.quantize``."""
    from .passes.quantize import quantize as _quantize

    return _quantize(graph, mode, min_elements)


__all__ = ["Builder", "DenseAttr", "Graph", "Location", "Node", "ParseError", "PartitaError", "TensorType",
           "Value", "VerifyError", "Weights", "training_step", "parse", "parse_file", "print_graph", "verify", "load", "save",
           "run", "optimize", "quantize", "import_torch", "import_onnx", "load_onnx", "parallelize", "launch", "plan", "Plan"]
