"""``torch.compile(model, backend="partita")``: partita as a TorchDynamo backend.

    import torch
    model = torch.compile(model, backend="partita")   # found through the entry point
    y = model(x)                                        # graphs compiled on the first call
    print(partita.codegen.dynamo.stats().report())      # what was compiled, what fell back

Dynamo captures FX graphs (splitting them itself at graph breaks) and hands each one to
``partita_backend``. That runs AOTAutograd with partita's decomposition table
(``partita.frontend.fx.decomposition_table``), so partita receives functionalized graphs of
core ATen ops: one inference graph, or a forward and a backward graph when a gradient is
needed. Each is compiled by ``compile_fx_graph``: imported with ``partita.frontend.fx``,
optimized with the default pipeline (``PIPELINE``, as ``partita opt``), and built as a
``CompiledProgram`` (``fuse-kernels``: elementwise groups become LLVM kernels).

A graph partita cannot take (an ATen op without a converter, symbolic shapes, a non-CPU
tensor, ...) is not an error: the backend warns once, naming the ops and their source lines,
and runs that graph's own FX code on ATen instead. ``stats()`` counts both kinds. An invalid
``options=`` entry is an error (``BackendOptionError``), never a fallback.

Importing this module registers the backend under the name ``"partita"`` with dynamo; the
package's entry point (group ``torch_dynamo_backends``) makes the name known without the
import. ``import partita`` does not import this module (dynamo is slow to import).
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..ir.diagnostics import PartitaError, PassError
from ..ir.graph import Graph, input_name
from . import CompiledProgram

__all__ = ["partita_backend", "compile_fx_graph", "stats", "reset_stats", "Stats", "GraphRecord", "Choice", "PIPELINE",
           "PartitaFallbackWarning", "BackendOptionError"]

# The optimization pipeline run before fusion: the default of ``partita opt``
# (partita/cli/common.py DEFAULT_PIPELINE). CompiledProgram then runs fuse-kernels and dce.
PIPELINE = "canonicalize,cse,fold-constants,dce"

# Run on a frozen graph once its params are marked, before ``CompiledProgram(freeze=True)``:
# the import path's order (bench_zoo's IMPORT_PIPELINE), where the library patterns take the
# params as the model has them. Without it ``fold-params`` first folds their reshapes and
# transposes into new params, and a group norm got [1, C, 1, 1] weights (reshaped back at every
# call, BiT's seven norms 79 against 65 us) and a linear layer a [K, N] weight.
FROZEN_LIBRARY = "fold-batch-norm,fuse-library"

BACKEND_NAME = "partita"


class PartitaFallbackWarning(UserWarning):
    """A graph that partita could not compile runs on ATen (its FX code) instead."""


@dataclass(frozen=True)
class GraphRecord:
    """One graph the backend was given.

    ``kind`` is ``"forward"``, ``"backward"`` or ``"inference"`` (AOTAutograd's three graph
    kinds); ``aten_ops`` counts its call nodes; ``kernels`` the fused nodes of the compiled
    graph. ``fallback`` is the reason the graph runs on ATen, None when partita compiled it;
    ``unsupported`` names the ops without a conversion in that case. ``program`` is the
    ``CompiledProgram`` (None after a fallback). ``choice`` is what runs the compiled graph
    (``Choice``: partita's program, or its FX code on ATen where that measured faster)."""

    kind: str
    name: str
    aten_ops: int
    kernels: int
    seconds: float
    fallback: str | None = None
    unsupported: tuple[str, ...] = ()
    program: CompiledProgram | None = field(default=None, repr=False, compare=False)
    choice: "Choice | None" = field(default=None, compare=False)


@dataclass
class Choice:
    """Which of a compiled graph's two candidates runs it: ``"partita"`` (its program) or
    ``"aten"`` (the graph's own FX code, as eager runs it: for an inference graph dynamo's own
    graph, for a training graph AOTAutograd's). With ``choose="measure"`` the first
    calls alternate between the two (each call runs one of them, on the caller's inputs) and
    the faster by its fastest timed call is kept; ``picked`` is None while they are measured."""

    mode: str                                   # "measure", "partita" or "aten"
    picked: str | None = None
    frozen: int = 0                             # inputs frozen as constants (params, buffers)
    frozen_note: str = ""
    direct: bool = False                        # dynamo calls partita's runner itself (``direct_call``)
    partita_ms: list[float] = field(default_factory=list)
    aten_ms: list[float] = field(default_factory=list)

    def text(self) -> str:
        frozen = f"{self.frozen} params frozen; " if self.frozen else ""
        if self.frozen_note:
            frozen = self.frozen_note + "; "
        direct = "called by dynamo directly; " if self.direct else ""
        return frozen + direct + self._pick()

    def _pick(self) -> str:
        if self.mode != "measure":
            return f"runs {self.mode} (choose={self.mode!r})"
        if self.picked is None:
            return f"measuring ({len(self.partita_ms)} + {len(self.aten_ms)} calls timed)"
        return (f"runs {self.picked}: partita {min(self.partita_ms):.3g} ms, ATen {min(self.aten_ms):.3g} ms "
                f"a call (the fastest of {len(self.partita_ms)} and {len(self.aten_ms)} calls; medians "
                f"{_median(self.partita_ms):.3g} and {_median(self.aten_ms):.3g} ms)")


def _median(xs: Sequence[float]) -> float:
    ys = sorted(xs)
    return ys[len(ys) // 2] if ys else float("nan")


@dataclass(frozen=True)
class Stats:
    """What the backend did since the last ``reset_stats()``: one record per graph."""

    graphs: tuple[GraphRecord, ...]

    @property
    def compiled(self) -> int:
        """Graphs partita compiled."""
        return sum(1 for g in self.graphs if g.fallback is None)

    @property
    def fallbacks(self) -> int:
        """Graphs that run on ATen because partita could not compile them."""
        return sum(1 for g in self.graphs if g.fallback is not None)

    @property
    def kernels(self) -> int:
        """Fused kernel nodes over all compiled graphs."""
        return sum(g.kernels for g in self.graphs)

    def report(self) -> str:
        lines = [f"partita backend: {self.compiled} graph(s) compiled, {self.fallbacks} on ATen, "
                 f"{self.kernels} fused kernel node(s)"]
        for g in self.graphs:
            how = "on ATen: " + g.fallback.splitlines()[0] if g.fallback else f"{g.kernels} fused node(s)"
            if g.choice is not None:
                how += f"; {g.choice.text()}"
            lines.append(f"  {g.name} ({g.kind}, {g.aten_ops} ATen ops, {g.seconds:.2f} s): {how}")
        return "\n".join(lines)


_LOCK = threading.Lock()
_RECORDS: list[GraphRecord] = []
_WARNED: set[str] = set()


def stats() -> Stats:
    """The graphs compiled and fallen back since the last ``reset_stats()``."""
    with _LOCK:
        return Stats(tuple(_RECORDS))


def reset_stats() -> None:
    """Forget the records, and which fallbacks were warned about (each warns once again)."""
    with _LOCK:
        _RECORDS.clear()
        _WARNED.clear()


class BackendOptionError(PartitaError, ValueError):
    """An unknown name or an invalid value in ``torch.compile(backend="partita", options=...)``.

    Raised on the first call (when dynamo hands the backend its first graph, wrapped in dynamo's
    ``BackendCompilerFailed``), never turned into a fallback: an option that cannot take effect
    would otherwise leave every graph on ATen with only a warning."""


_WHO = "torch.compile(backend='partita')"
CHOICES = ("measure", "partita", "aten")
# The measured choice: calls of each candidate before timing starts, then timed calls of each.
WARMUP_CALLS = 3
TIMED_CALLS = 5
# While the two candidates' timings overlap (the faster one's median call is no faster than the
# slower one's fastest: a busy machine can slow every call of one of them), another
# ``TIMED_CALLS`` of each are timed, up to this many of each.
MAX_TIMED_CALLS = 15


@dataclass(frozen=True)
class _Options:
    passes: str = PIPELINE
    fallback: str = "warn"      # "warn": run the graph on ATen; "error": raise
    min_ops: int | None = None  # None: CompiledProgram's default (1 for a frozen graph, else 2)
    choose: str = "measure"     # "measure": keep the faster of partita and ATen; "partita"; "aten"
    freeze: bool = True         # inference graphs: the params' values are constants (checked every call)

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None) -> "_Options":
        options = dict(options or {})
        unknown = set(options) - {"passes", "fallback", "min_ops", "choose", "freeze"}
        if unknown:
            raise BackendOptionError(f"{_WHO}: unknown option(s) {', '.join(sorted(map(str, unknown)))}; the options "
                                     "are passes (a pipeline), fallback ('warn' or 'error'), min_ops, choose "
                                     "('measure', 'partita' or 'aten') and freeze (True or False)")
        return cls(**options).checked()

    def checked(self) -> "_Options":
        """These options, or BackendOptionError naming the option and what it takes."""
        from ..passes.manager import PASSES, PassManager

        valid = f"the passes are {', '.join(sorted(PASSES))}"
        if not isinstance(self.passes, str):
            raise BackendOptionError(f"{_WHO}: option 'passes' must be a pipeline string like {PIPELINE!r} "
                                     f"('' for none), got {self.passes!r}; {valid}")
        if self.passes:
            try:
                PassManager.parse(self.passes, reproducer_dir=None)
            except PassError as e:
                detail = str(e) if "available passes" in str(e) else f"{e}\n{valid}"
                raise BackendOptionError(f"{_WHO}: option 'passes' is {self.passes!r}, not a valid pipeline: "
                                         f"{detail}") from None
        if self.fallback not in ("warn", "error"):
            raise BackendOptionError(f"{_WHO}: option 'fallback' must be 'warn' or 'error', got {self.fallback!r}")
        if not isinstance(self.freeze, bool):
            raise BackendOptionError(f"{_WHO}: option 'freeze' must be True or False (inference graphs take the "
                                     f"params' values as constants), got {self.freeze!r}")
        if self.choose not in CHOICES:
            raise BackendOptionError(f"{_WHO}: option 'choose' must be one of {', '.join(map(repr, CHOICES))} "
                                     f"(measure: keep whichever of partita's program and ATen runs the graph "
                                     f"faster), got {self.choose!r}")
        if self.min_ops is not None and (isinstance(self.min_ops, bool) or not isinstance(self.min_ops, int)
                                         or self.min_ops < 1):
            raise BackendOptionError(f"{_WHO}: option 'min_ops' must be an integer >= 1 (the fewest ops "
                                     f"fuse-kernels makes a kernel of), got {self.min_ops!r}")
        return self


def partita_backend(gm: Any, example_inputs: Sequence[Any], **kwargs: Any) -> Callable[..., Any]:
    """The dynamo backend: AOTAutograd with partita's decompositions, partita compiling the
    forward, backward and inference graphs it makes (``compile_fx_graph``).

    ``torch.compile(model, backend="partita", options={...})`` takes ``passes`` (the pipeline
    run before fusion, default ``PIPELINE``), ``fallback`` (``"warn"``, the default, runs a
    graph partita cannot compile on ATen; ``"error"`` raises) and ``min_ops`` (the smallest
    group fuse-kernels makes a kernel of)."""
    from torch._dynamo.backends.common import aot_autograd

    from ..frontend.fx import decomposition_table
    from ..frontend.fx_moe import dispatch_form
    from ..frontend.fx_interpolate import keep_interpolations

    options = _Options.parse(kwargs.get("options"))
    made: list[tuple[str, Any]] = []     # (kind, what compile_fx_graph returned) of each graph

    def compiler(kind: str) -> Callable[..., Any]:
        def compile_graph(fx_gm: Any, inputs: Sequence[Any]) -> Callable[..., Any]:
            fn = compile_fx_graph(fx_gm, inputs, kind=kind, _options=options)
            made.append((kind, fn))
            return fn
        return compile_graph

    aot = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                       inference_compiler=compiler("inference"), decompositions=decomposition_table())
    # An inference graph's interpolations stay whole (the import path's program has them so).
    with keep_interpolations(gm) if not needs_grad(example_inputs) else contextlib.nullcontext():
        # partita's program gets transformers' grouped-GEMM experts in the dispatch form; the
        # measured choice's ATen candidate stays dynamo's own graph (``gm``).
        compiled = aot(dispatch_form(gm)[0], example_inputs)
    if len(made) != 1 or made[0][0] != "inference":
        return compiled
    return _inference_entry(compiled, gm, made[0][1], len(example_inputs))


def needs_grad(example_inputs: Sequence[Any]) -> bool:
    """Whether AOTAutograd makes a training graph of these inputs (as its own test: grad mode
    on and an input that requires a gradient)."""
    import torch

    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


def _inference_entry(compiled: Callable[..., Any], gm: Any, made: Any, n_inputs: int) -> Callable[..., Any]:
    """What dynamo calls for a graph AOTAutograd compiled as one inference graph. Its ATen
    candidate is dynamo's own graph, the model's torch calls as eager makes them (the graph
    AOTAutograd made is partita's decompositions of them, behind AOTAutograd's runtime
    wrapper, and ran up to a third slower than eager on MobileNet v3). So the choice between
    partita and ATen is made here: partita is ``compiled`` (AOTAutograd's runtime wrapper around
    partita's program), ATen is ``gm.forward``; a graph partita could not compile runs
    ``gm.forward`` alone.

    Where that wrapper would only pass dynamo's inputs through to partita's program and its
    outputs back (``direct_call``), partita's runner is called directly instead: the wrapper
    is AOTAutograd's bookkeeping for each of the graph's inputs (a frozen CNN passes every
    param), and cost a MobileNet v1 call about a fifth of the program's own time."""
    from torch._functorch.aot_autograd import make_boxed_func

    runner = made.runner if isinstance(made, _Chooser) else made
    direct = isinstance(runner, (_Runner, _FrozenRunner)) and direct_call(gm, runner.plain, n_inputs)
    partita: Callable[[list], Any] = runner if direct else make_boxed_func(compiled)
    choice = getattr(made, "choice", None) or getattr(runner, "choice", None)
    if direct and choice is not None:
        choice.direct = True
    if not isinstance(made, _Chooser):
        if not isinstance(made, (_Runner, _FrozenRunner)):
            return gm.forward
        return _Unboxed(runner) if direct else compiled
    # The choice moves out of AOTAutograd's call: the inner chooser now always runs partita.
    outer, made.choice = made.choice, Choice("partita", picked="partita")
    chooser = _Chooser(partita, make_boxed_func(gm.forward), outer)
    entry = _Unboxed(chooser)
    chooser.settle = entry.settle
    return entry


def direct_call(gm: Any, plain: int | None, n_inputs: int) -> bool:
    """Whether dynamo's inputs of ``gm`` are, in order, the inputs of the inference graph
    AOTAutograd gave partita (``plain``: how many it has, None where its runtime wrapper has
    more to do than pass them through: see ``plain_inference``), so that partita's runner can
    take dynamo's call itself: no params or buffers of ``gm`` put before them, one graph input
    for each."""
    if plain is None or plain != n_inputs:
        return False
    return next(iter(gm.parameters()), None) is None and next(iter(gm.buffers()), None) is None


def plain_inference(kind: str, fx_gm: Any) -> int | None:
    """For an inference graph whose AOTAutograd runtime wrapper only passes the inputs in and
    the outputs out (no input it writes, no output that aliases an input or another output,
    no effect tokens, random-state inputs, tensor subclasses or autocast): its number of inputs.
    None otherwise, or for a training graph."""
    if kind != "inference":
        return None
    import torch

    meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
    if meta is None or torch._C._is_any_autocast_enabled():
        return None
    from torch._functorch._aot_autograd.schemas import PlainTensorMeta

    placeholders = [n for n in fx_gm.graph.nodes if n.op == "placeholder"]
    try:
        plain = (meta.num_mutated_inp_runtime_indices == 0 and meta.num_outputs_aliased == 0
                 and meta.num_intermediate_bases == 0 and not meta.tokens and not meta.is_rng_op_functionalized
                 and meta.grad_enabled_mutation is None and len(meta.input_info) == len(placeholders)
                 and all(type(m) is PlainTensorMeta or isinstance(m, int)
                         for m in [*meta.subclass_inp_meta, *meta.subclass_fw_graph_out_meta]))
    except AttributeError:   # another torch's metadata: keep the wrapper
        return None
    return len(placeholders) if plain else None


class _Unboxed:
    """A boxed callable (one list of inputs) called with the inputs as arguments, as dynamo
    calls what its backend returns."""

    def __init__(self, boxed: Callable[[list], Any]) -> None:
        self.boxed = boxed

    def __call__(self, *args: Any) -> Any:
        return self.boxed(list(args))

    def settle(self, boxed: Callable[[list], Any]) -> None:
        """Call ``boxed`` from now on (a chooser that picked partita hands over its runner)."""
        self.boxed = boxed


_COUNTER = [0]


def compile_fx_graph(gm: Any, example_inputs: Sequence[Any], *, kind: str = "inference",
                     passes: str = PIPELINE, fallback: str = "warn", choose: str = "measure",
                     _options: _Options | None = None) -> Any:
    """Compile one ATen-level FX graph (AOTAutograd's boxed convention: the result takes a list
    of the flat inputs and returns what the FX graph returns). A graph partita cannot take
    runs as ``gm.forward`` instead, with a warning (``fallback="warn"``) or raises
    (``fallback="error"``)."""
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from ..frontend.fx import import_fx

    opts = _options or _Options(passes=passes, fallback=fallback, choose=choose).checked()
    with _LOCK:
        _COUNTER[0] += 1
        name = f"dynamo_{kind}_{_COUNTER[0]}"
    aten_ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    t0 = time.perf_counter()
    try:
        _check_inputs(example_inputs)
        # AOTAutograd calls its compilers under its fake-tensor mode; the program computes its
        # constant tensors once, here, and they must be real.
        with unset_fake_temporarily():
            imported = import_fx(gm, name=name)
            graph = _optimize(imported.graph, opts.passes)
            frozen = _frozen_inputs(kind, imported, opts) if opts.freeze else []
            program = None if frozen else build_program(graph, min_ops=opts.min_ops)
            plain = plain_inference(kind, gm)
    except Exception as e:
        return _fall_back(gm, e, opts, kind, name, aten_ops, t0)
    choice = Choice(opts.choose)
    if frozen:
        # The program is built on the first call, with the params' values as constants.
        rec = GraphRecord(kind, name, aten_ops, 0, time.perf_counter() - t0, choice=choice)
        _record(rec)
        runner: Any = _FrozenRunner(graph, imported, frozen, opts, rec, gm)
    else:
        assert program is not None
        _record(GraphRecord(kind, name, aten_ops, len(program.kernels), time.perf_counter() - t0, program=program,
                            choice=choice))
        runner = _Runner(program, imported)
    runner.plain, runner.choice = plain, choice
    if opts.choose == "partita":
        return runner
    return _Chooser(runner, make_boxed_func(gm.forward), choice)


def build_program(graph: Graph, **options: Any) -> CompiledProgram:
    """``CompiledProgram(graph, **options)`` built outside inference mode. Dynamo compiles a
    graph at its first call and a frozen program is built at its own first call, both under the
    caller's ``torch.inference_mode()`` when there is one; the tensors the program makes then
    (its constants: an average pool's ones weight, a folded param) would be inference tensors,
    which have no version counter, so a convolution could never trust a packed copy of such a
    weight and ran unpacked at every call (PoolFormer's pool: 10 against 130 us a step)."""
    import torch

    with torch.inference_mode(False):
        return CompiledProgram(graph, **options)


def _fall_back(gm: Any, e: Exception, opts: _Options, kind: str, name: str, aten_ops: int, t0: float) -> Any:
    """The graph's own FX code on ATen, for a graph partita cannot take (recorded, warned
    once); or ``e`` raised, with ``fallback="error"``."""
    from torch._functorch.aot_autograd import make_boxed_func

    from ..frontend.fx import UnsupportedGraph

    if opts.fallback == "error":
        raise e
    reason = str(e) or type(e).__name__
    ops = e.ops if isinstance(e, UnsupportedGraph) else ()
    _record(GraphRecord(kind, name, aten_ops, 0, time.perf_counter() - t0, reason, ops))
    _warn_once(kind, name, e, ops)
    return make_boxed_func(gm.forward)


def _frozen_inputs(kind: str, imported: Any, opts: _Options) -> list[int]:
    """The inputs of an inference graph that are the model's params and buffers (AOTAutograd's
    static inputs), to be frozen as constants; none for training graphs, or where an output
    is one of them or a view of one (the caller must get the model's own tensor back)."""
    if kind != "inference":
        return []
    import torch

    ctx = torch._guards.TracingContext.try_get()
    static = sorted(getattr(getattr(ctx, "fw_metadata", None), "static_input_indices", None) or [])
    if not static:
        return []
    names = [input_name(v) for v in imported.graph.inputs]
    viewed = {root for root, of_input in imported.roots if of_input}
    if any(names[i] in viewed for i in static if i < len(names)):
        return []
    return [i for i in static if i < len(names)]


def _check_inputs(example_inputs: Sequence[Any]) -> None:
    import torch

    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            raise _NotForPartita(f"input {i} is on {x.device}; partita's kernels run on the CPU")


class _NotForPartita(Exception):
    pass


def _optimize(graph: Any, passes: str) -> Any:
    from ..passes import PassManager

    if not passes:
        return graph
    return PassManager.parse(passes, reproducer_dir=None).run(graph)


def _record(rec: GraphRecord) -> None:
    with _LOCK:
        _RECORDS.append(rec)


def _warn_once(kind: str, name: str, error: Exception, ops: tuple[str, ...]) -> None:
    from ..frontend.fx import UnsupportedGraph

    if isinstance(error, UnsupportedGraph):
        key = "ops:" + "\n".join(sorted({f"{op} {loc}" for op, loc, _ in error.problems}))
        uses = [f"  {loc or '<unknown location>'}: {op}" + (f" in module {loc.scope}" if loc and loc.scope else "")
                + ("" if why == "no converter" else f": {why}") for op, loc, why in error.problems]
        what = (f"{len(error.problems)} use(s) of {len(ops)} op(s) partita cannot convert ({', '.join(ops)}):\n"
                + "\n".join(uses) + "\n(a converter for such an op goes in partita/frontend/fx.py, FX_CONVERTERS)")
    else:
        key = f"{type(error).__name__}: {error}"
        what = f"partita cannot compile it: {type(error).__name__}: {error}"
    with _LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    warnings.warn(f"partita backend: the {kind} graph {name} runs on ATen (its own FX code) instead; {what}",
                  PartitaFallbackWarning, stacklevel=2)


class _Runner:
    """A compiled graph in AOTAutograd's boxed convention: takes the list of flat inputs
    (cleared, so the caller's references do not keep them alive), adds the random inputs
    drawn for this run, and returns the outputs in the FX graph's structure."""

    def __init__(self, program: CompiledProgram, imported: Any) -> None:
        # An instance attribute: dynamo's disable() wrapper (around backward graphs) copies the
        # callable's __dict__, which is how AOTAutograd still sees the boxed convention.
        self._boxed_call = True
        self.plain: int | None = None     # see plain_inference
        self.choice: Choice | None = None
        self.program = program
        self.layout = imported.layout
        self.draw_random = imported.draw_random if imported.random else None
        self.as_list = imported.output_list
        # Outputs that are no view of an input: (output index, the FX node they view).
        self.fresh = [(j, root) for j, (root, of_input) in enumerate(imported.roots) if not of_input]
        # A layout that is the outputs in order, each once: the outputs are returned as they come.
        self.in_order = list(self.layout) == list(range(len(self.layout)))
        import torch

        self.inference_mode = torch.is_inference_mode_enabled

    def __call__(self, args: list) -> Any:
        inputs = list(args)
        args.clear()
        if self.draw_random is not None:
            inputs.extend(self.draw_random())
        outs = self.program(inputs)
        if not self.inference_mode():
            # (under inference mode, what the caller would make of them is an inference tensor too)
            outs = [_ordinary(t) for t in outs]
        if self.fresh:
            _unalias(inputs, outs, self.fresh)
        if self.in_order and len(outs) == len(self.layout):
            return outs if self.as_list else tuple(outs)
        result = [None if i is None else outs[i] for i in self.layout]
        return result if self.as_list else tuple(result)


class _FrozenRunner:
    """An inference graph whose params and buffers (``frozen``: their input positions) are
    constants, as torch's freezing makes them: batch norms fold into their convolutions and
    weights are packed once. The program is built on the first call, from the tensors that
    call passes. Every call checks that each frozen input is still the same memory at the same
    version (``Tensor._version`` counts in-place writes: an optimizer step, ``load_state_dict``);
    if one changed, the graph runs for good on a program built without freezing."""

    def __init__(self, graph: Graph, imported: Any, frozen: list[int], opts: _Options, record: GraphRecord,
                 gm: Any) -> None:
        self._boxed_call = True
        self.graph, self.imported, self.frozen, self.opts, self.record, self.gm = graph, imported, frozen, opts, \
            record, gm
        self.plain: int | None = None                        # see plain_inference
        self.choice: Choice | None = None
        self.keys: list[tuple[int, int]] | None = None     # (data_ptr, _version) of each frozen input
        self.run: Any = None                                 # the frozen program's _Runner
        self.unfrozen: Any = None

    def __call__(self, args: list) -> Any:
        run = self.run
        if run is not None:
            # The steady state: every frozen input still the memory it was frozen from (its
            # address: ``p.data = other`` keeps the version), at the same version (every in-place
            # write bumps it), read in two C-level passes; then the frozen program on the rest.
            ts = self.pick_frozen(args)
            if list(map(self.version, ts)) == self.versions and list(map(self.data_ptr, ts)) == self.ptrs:
                kept = list(self.pick_kept(args))
                args.clear()
                return run(kept)
            self.run = None
            if self.record.choice is not None:
                self.record.choice.frozen_note = "frozen params changed: runs the program built without freezing"
        elif self.keys is None:
            self._freeze(args)
            if self.run is not None:
                kept = list(self.pick_kept(args))
                args.clear()
                return self.run(kept)
        if self.unfrozen is None:
            self.unfrozen = _Runner(build_program(self.graph, min_ops=self.opts.min_ops), self.imported)
        return self.unfrozen(args)

    def _freeze(self, args: list) -> None:
        from ..backend.torch_exec import to_numpy

        t0 = time.perf_counter()
        # An inference tensor (a buffer the model made under torch.inference_mode) has no
        # version counter to check: it stays an input.
        self.frozen = [i for i in self.frozen if not args[i].is_inference()]
        frozen = set(self.frozen)
        self.kept = [i for i in range(len(args)) if i not in frozen]
        self.keys = [(args[i].data_ptr(), args[i]._version) for i in self.frozen]
        self.pick_frozen, self.pick_kept = items_of(self.frozen), items_of(self.kept)
        # What ``__call__`` compares, read through the tensor type's own accessors.
        self.ptrs, self.versions = [p for p, _ in self.keys], [v for _, v in self.keys]
        self.data_ptr, self.version = _tensor_accessors()
        g = self.graph.clone()
        for i in self.frozen:
            v = g.inputs[i]
            v.role = "param"
            g.weights[input_name(v)] = to_numpy(args[i].detach())
        try:
            g = _optimize(g, FROZEN_LIBRARY)
            program = build_program(g, min_ops=self.opts.min_ops, freeze=True)
        except Exception as e:  # a failure of a pass or of code generation: run as built without freezing
            if self.opts.fallback == "error":
                raise
            warnings.warn(f"partita backend: the inference graph {self.record.name} runs without frozen params: "
                          f"{type(e).__name__}: {e}", PartitaFallbackWarning, stacklevel=2)
            return
        self.run = _Runner(program, self.imported)
        if self.record.choice is not None:
            self.record.choice.frozen = len(self.frozen)
        rec = dataclasses.replace(self.record, kernels=len(program.kernels),
                                  seconds=self.record.seconds + time.perf_counter() - t0, program=program)
        with _LOCK:
            for k, r in enumerate(_RECORDS):
                if r is self.record:
                    _RECORDS[k] = rec
        self.record = rec


def timings_overlap(a_ms: Sequence[float], b_ms: Sequence[float]) -> bool:
    """Whether two candidates' timed calls leave their order in doubt: the faster one's median
    call is no faster than the slower one's fastest (on a loaded machine every timed call of one
    candidate can land in a lost time slice; more calls of each then decide)."""
    fast, slow = (a_ms, b_ms) if min(a_ms) < min(b_ms) else (b_ms, a_ms)
    return _median(fast) >= min(slow)


class _Chooser:
    """A compiled graph's two candidates, partita's ``_Runner`` and the FX code on ATen, in the
    boxed convention; runs the one ``choice`` picks. While it measures (``choose="measure"``),
    calls alternate between them, partita first: ``WARMUP_CALLS`` untimed calls of each, then
    ``TIMED_CALLS`` timed calls of each (more, in rounds of ``TIMED_CALLS`` up to
    ``MAX_TIMED_CALLS``, while ``timings_overlap``); then the one with the fastest call is kept
    for good.
    Both compute the graph's function, so the caller sees the same results whichever runs."""

    def __init__(self, runner: Callable[[list], Any], aten: Callable[[list], Any], choice: Choice) -> None:
        self._boxed_call = True
        self.runner, self.aten, self.choice = runner, aten, choice
        self.calls = 0
        # Told the runner once partita is picked, by an entry that can call it without this
        # chooser in between (``_Unboxed.settle``).
        self.settle: Callable[[Callable[[list], Any]], None] | None = None
        if choice.mode == "aten":
            choice.picked = "aten"

    def __call__(self, args: list) -> Any:
        picked = self.choice.picked
        if picked == "aten":
            return self._on_aten(args)
        if picked == "partita":
            return self.runner(args)
        k, self.calls = self.calls, self.calls + 1
        use_partita = k % 2 == 0
        t0 = time.perf_counter()
        out = self.runner(args) if use_partita else self._on_aten(args)
        ms = (time.perf_counter() - t0) * 1e3
        if k >= 2 * WARMUP_CALLS:
            (self.choice.partita_ms if use_partita else self.choice.aten_ms).append(ms)
        n = len(self.choice.aten_ms)
        if n >= TIMED_CALLS and n % TIMED_CALLS == 0 and not use_partita \
                and not (n < MAX_TIMED_CALLS and timings_overlap(self.choice.partita_ms, self.choice.aten_ms)):
            # The fastest call of each: what the machine's other work adds to a call (a time
            # slice given to another process) only ever adds, and would decide a median of five.
            faster_aten = min(self.choice.aten_ms) < min(self.choice.partita_ms)
            self.choice.picked = "aten" if faster_aten else "partita"
            if not faster_aten and self.settle is not None:
                self.settle(self.runner)
        return out

    def _on_aten(self, args: list) -> Any:
        """The FX code on ATen; where it raises (a zero integer divisor, an index out of range),
        partita's program runs instead, for its error that names the op and the source line."""
        try:
            return self.aten(args)
        except Exception:
            return self.runner(args)


def _unalias(inputs: list, outs: list, fresh: list[tuple[int, str]]) -> None:
    """Copy each output that shares memory where the FX graph's does not: partita returns an
    operand itself for a clone, a cast to the same dtype or a reshape, where FX makes a new
    tensor that the caller may write into. An output may share memory with an input only if it
    views one, and with another output only if both view the same FX node."""
    import torch

    taken = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.numel()}
    owner: dict[int, str] = {}
    for j, root in fresh:
        t = outs[j]
        if not isinstance(t, torch.Tensor) or not t.numel():
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr in taken or owner.get(ptr, root) != root:
            outs[j] = t = t.clone()
            ptr = t.untyped_storage().data_ptr()
        owner[ptr] = root


def items_of(positions: Sequence[int]) -> Callable[[Sequence[Any]], Sequence[Any]]:
    """A function of a list giving its items at ``positions`` as a sequence (a tuple, or a list
    slice where the positions are one run), in one C call (``operator.itemgetter``; a frozen
    CNN's check reads a hundred params a call)."""
    if len(positions) == 1:
        only = positions[0]
        return lambda xs: (xs[only],)
    if not positions:
        return lambda xs: ()
    first = positions[0]
    if list(positions) == list(range(first, first + len(positions))):
        return operator.itemgetter(slice(first, first + len(positions)))
    return operator.itemgetter(*positions)


def _tensor_accessors() -> tuple[Callable[[Any], int], Callable[[Any], int]]:
    """``t.data_ptr()`` and ``t._version`` as functions of a tensor ``t``. The version is read by
    ``operator.attrgetter`` (the same getter, reached without a bound method-wrapper per call):
    0.81 of ``Tensor._version.__get__``'s time over 262 params, MobileNet v2's frozen check."""
    import torch

    return torch.Tensor.data_ptr, operator.attrgetter("_version")


def _ordinary(t: Any) -> Any:
    """``t`` as an ordinary tensor: the torch executor computes under inference mode, and an
    inference tensor could be neither saved for backward nor updated in place later. The
    result shares ``t``'s memory (no copy)."""
    import torch

    if not isinstance(t, torch.Tensor) or not t.is_inference():
        return t
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(), t.shape,
                                                                 t.stride())


def _register() -> None:
    """Make ``backend="partita"`` work once this module is imported, without the entry point.

    When dynamo found the entry point already, it registers the function itself on first use
    (registering it here too would be a duplicate name), so only an unknown name is registered."""
    try:
        from torch._dynamo.backends import registry
    except ImportError:  # a torch without dynamo: nothing to register with
        return
    known = getattr(registry, "_BACKENDS", {})
    fns = getattr(registry, "_COMPILER_FNS", {})
    if BACKEND_NAME in fns or known.get(BACKEND_NAME) is not None:
        return
    registry.register_backend(partita_backend, name=BACKEND_NAME)


_register()
