"""Generated code: fused kernels compiled with LLVM, cached on disk (docs/codegen.md).

    prog = partita.codegen.CompiledProgram(graph)   # fuse-kernels, compile, prepare
    outs = prog([x])                                  # as TorchProgram: torch tensors out
    print(prog.report())                              # kernels, where they came from, fallbacks

- ``fusion``: the ``fuse-kernels`` pass (groups of elementwise ops -> ``fused`` nodes);
- ``lowering``: a fused body -> LLVM IR (vectorized loops over broadcast strides);
- ``mathlib``: vectorizable exp/log/tanh/erf;
- ``jit``: LLVM through llvmlite, one engine per process, the on-disk kernel cache;
- ``kernels``: a fused node's step function for the torch executor;
- ``optimizer``: the AdamW update as one kernel per parameter;
- ``library``: oneDNN convolution and linear with fused epilogues (``conv2d_pointwise``,
  ``linear_pointwise``), their packed weights, the ``fuse-library`` pass;
- ``inference``: inference rewrites (the ``fold-batch-norm`` pass);
- ``gemm``, ``attention``, ``rotary``, ``conv``: the generated GEMM, attention and direct
  convolution that run linear layers, attention and convolutions;
- ``norm``: generated layer norm and RMS norm, with the residual add before them (``add_norm``);
- ``memory``: the static memory plan;
- ``choose``: the measured choice between the kernels that can run a node (convolutions).
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from ..ir.graph import Graph
from ..ops.kinds import STRIDED_VIEW_OPS, VIEW_OPS
from . import op  # noqa: F401  (registers the fused op)
from . import fusion  # noqa: F401  (registers the fuse-kernels pass)
from . import library  # noqa: F401  (registers conv2d_pointwise, linear_pointwise and the fuse-library pass)
from . import inference  # noqa: F401  (registers the fold-batch-norm pass)
from . import layout  # noqa: F401  (registers the assign-layout pass)
from . import token_mixer  # noqa: F401  (registers the pool_mixer op)
from . import se_block  # noqa: F401  (registers the se_block op)
from .fusion import FuseKernels, body_of, plan_groups
from .jit import CodegenError, cache_dir, jit
from .aten_fallback import fallbacks
from .choose import report as choose_report
from .kernels import kernel_name

__all__ = ["CompiledProgram", "FuseKernels", "plan_groups", "body_of", "CodegenError", "cache_dir", "jit",
           "fallbacks", "kernel_name", "emit_kernels"]


class CompiledProgram:
    """``graph`` with its elementwise groups fused into generated kernels, ready to run.

    The graph is copied, and on the copy run ``fold-batch-norm``, ``fuse-library`` (oneDNN
    convolutions and linear layers with their epilogues) and ``assign-layout`` (channels-last
    regions of CNNs, by cost) -- ``library``, default on unless the program donates its inputs
    as a training step does -- then ``fuse-kernels`` and ``dce``
    (``fuse=False`` skips all of them, for a graph fused already); the torch executor prepares
    it, compiling each kernel or loading it from the cache. ``compile_seconds`` is partita's own time for all of
    that. Calls take and return what ``TorchProgram`` does.

    ``freeze`` (default off): the params are constants, ``graph.weights`` holding their values at
    every call (torch's freezing; the torch.compile backend's frozen inference graphs): with
    ``library``, ``fold-constants`` and ``fold-params`` compute what depends on constants and
    params alone once, ``scale-fold`` folds per-feature scales (layer scales, norm weights)
    into linear layers' weights, and ``merge-linears`` makes linear layers on one input one GEMM. Without
    it, new weight tensors passed at a call are used as they come.

    ``plan_memory`` (default on): the values that kernels and matmuls write live in one arena
    laid out once (``memory.py``; ``memory_plan.text()`` prints it), so a call allocates only
    what ATen allocates itself. The arena belongs to the program: one call at a time (a program
    is not reentrant across threads); outputs are never in it."""

    def __init__(self, graph: Graph, donate: bool = False, overlap: bool = False, fuse: bool = True,
                 min_ops: int | None = None, plan_memory: bool = True, library: bool | None = None,
                 freeze: bool = False) -> None:
        from ..backend.torch_exec import TorchProgram
        from ..passes.dce import DeadCodeElimination

        t0 = time.perf_counter()
        g = graph.clone()
        if library is None:
            library = not donate  # inference: a training step's weights change every step
        # a lone reduction is a kernel only where asked for: by default it keeps its own step
        min_reduction_ops = 2 if min_ops is None else min_ops
        if min_ops is None:
            # A frozen program's lone elementwise op is a one-op kernel too: it writes its
            # buffer in the arena and joins the step chains (step_chain.py), where as an ATen
            # call it would end a chain (LeViT's residual adds: the program 0.73 of its time
            # with them as ATen calls; Funnel 0.59). Elsewhere a lone op stays ATen's call,
            # as fast on its own.
            min_ops = 1 if freeze and fuse and library else 2
        if fuse and library:
            from ..passes.manager import PassManager

            from . import merge_linear, scale_fold  # noqa: F401: registers merge-linears, scale-fold

            frozen = ("fold-constants,fold-params,", ",scale-fold,merge-linears") if freeze else ("", "")
            g = PassManager.parse(frozen[0] + "fold-batch-norm,fuse-library" + frozen[1]).run(g)
            g = _fold_movement(g)
            from .token_mixer import fold_residual_scales, fuse_pool_mixers

            fuse_pool_mixers(g)   # PoolFormer's norm, pool, sub, scale and residual as one step
            from .se_block import fuse_se_blocks
            fuse_se_blocks(g)   # squeeze-excitation's mean, two 1 x 1 convolutions, gate and product as one step
            if freeze:
                fold_residual_scales(g)   # r + s * conv(x): s into the weights, r the conv's epilogue
            g = PassManager.parse("assign-layout").run(g)
            from .cnn_blocks import global_pools_flattened

            global_pools_flattened(g)   # a global mean's flatten folded into it
        if fuse:
            g = FuseKernels(FuseKernels.Options(min_ops=min_ops, min_reduction_ops=min_reduction_ops)).run(g)
            g = DeadCodeElimination().run(g)
        self.graph = g
        before = _stats()
        from .optimizer import prepare_adamw

        self.optimizer_kernels: list = []  # the adamw_update nodes that run as generated kernels

        def adamw(node, inplace):
            fn = prepare_adamw(node, inplace)
            if fn is not None:
                self.optimizer_kernels.append(node)
            return fn

        from .library import matmul_kernel

        self.library_matmuls: set = set()  # matmul nodes run by oneDNN (not in the memory plan)

        def matmul(node, inplace):
            fn = matmul_kernel(node, inplace)
            if fn is not None:
                self.library_matmuls.add(node)
            return fn

        from .attention import attention_kernel, rotary_attention_kernel
        from .conv_preact import preact_group_norm_kernel   # group_norm.py's step, NHWC on channels-last input
        from .conv_pad import pad_kernel   # a channels-last pad of H and W as one generated copy
        from .grn import grn_kernel
        from .disentangled import rel_scores_kernel
        from .norm import norm_kernel

        self.attention_kernels: list = []  # the (rotary_)attention nodes run by the generated kernel

        def attention_by(factory):
            def make(node, inplace):
                fn = factory(node, inplace)
                if fn is not None:
                    self.attention_kernels.append(node)
                return fn
            return make

        from .pool import max_pool_kernel, mean_kernel
        from .token_mixer import pool_mixer_kernel
        from .se_block import se_block_kernel

        self.program = TorchProgram(g, donate=donate, overlap=overlap,
                                    kernels={"adamw_update": adamw, "matmul": matmul,
                                             "max_pool2d": max_pool_kernel, "mean": mean_kernel,
                                             "attention": attention_by(attention_kernel),
                                             "rotary_attention": attention_by(rotary_attention_kernel),
                                             "layer_norm": norm_kernel, "rms_norm": norm_kernel,
                                             "add_norm": norm_kernel, "group_norm": preact_group_norm_kernel, "pad": pad_kernel,
                                             "grn": grn_kernel, "rel_scores": rel_scores_kernel,
                                             "pool_mixer": pool_mixer_kernel, "se_block": se_block_kernel})
        after = _stats()
        self.kernels = [n for n in g.nodes if n.op == "fused"]
        self._weights: Any = None
        # params the program's own passes made (fold-params, fold-batch-norm): a caller passing
        # weights= by the graph's names gets these added from the program's graph
        self._derived_names = [k for k in g.weights if k not in graph.weights]
        self._derived: Any = None
        self.memory_plan: Any = None   # a memory.MemoryPlan once planned
        self._arena: Any = None
        self.arena_view_steps = 0      # view steps made once, of values in the arena
        # runs of kernel steps as one native call each, once their kernels have settled
        # (step_chain.py): tried after each of the first calls
        self.chained_steps = 0
        self._chain_tries = 0
        self._chain_last: list[int] = []
        self._chains: list = []
        if plan_memory:
            self._bind_memory_plan()
            from .step_chain import ENABLED as chain_enabled, MAX_TRIES

            self._chain_tries = MAX_TRIES if chain_enabled and self._arena is not None else 0
        self.cache = {k: after[k] - before[k] for k in after}
        self.compile_seconds = time.perf_counter() - t0

    def _bind_memory_plan(self) -> None:
        from ..ir.printer import print_graph_lines
        from ..ops._lazy import torch
        from .kernels import prepare_fused
        from .arena import arena_views, plan_memory
        from .aten_fallback import run_body_on_aten as aten_fused

        prog = self.program
        nodes = [st[7] for st in prog.steps]
        lines, where = print_graph_lines(self.graph)
        names: dict = {}
        for n, i in where.items():
            lhs = lines[i].split(" = ", 1)[0].strip()
            if " = " in lines[i]:
                for r, nm in zip(n.results, lhs.split(", ")):
                    names[r] = nm
        from .attention import attention_kernel, rotary_attention_kernel
        from .library import step_into, writes_into

        unplanned = set(self.library_matmuls)
        addmm = {st[7] for st in prog.steps if addmm_fits(st[7], st[0])}
        unplanned |= {n for n in nodes if n.op in ("conv2d_pointwise", "linear_pointwise") and not writes_into(n)
                      and n not in addmm}
        from .norm import NORM_OPS, norm_kernel, takes as norm_takes

        unplanned |= {n for n in nodes if n.op in NORM_OPS and not norm_takes(n)}
        from .token_mixer import pool_mixer_kernel, takes as mixer_takes
        from .se_block import se_block_kernel

        unplanned |= {n for n in nodes if n.op == "pool_mixer" and not mixer_takes(n)}
        attention_kernels = set(self.attention_kernels)
        unplanned |= {n for n in nodes if n.op in ("attention", "rotary_attention") and n not in attention_kernels}
        # a generated convolution's residual add reads each element of `other` just before it
        # writes the same element of its result: the result may take other's buffer
        in_place = {n: len(n.operands) - 1 for n in nodes if n.op == "conv2d_pointwise"
                    and n.attrs.get("binary", "none") != "none" and n not in unplanned}
        from .arena import into_steps

        takers = into_steps(prog, torch)   # node -> its step, which can write into a given buffer
        plan = plan_memory(self.graph, nodes, names, unplanned=unplanned, in_place=in_place, into=set(takers))
        self.memory_plan = plan
        if not plan.planned():
            return
        self._arena, views = arena_views(plan, torch)
        bound: dict = {}   # value -> the tensor in the arena its step writes (every call the same)
        for i, st in enumerate(prog.steps):
            node = st[7]
            outs = [views.get(plan.buffer_of(r)) for r in node.results]
            if all(o is None for o in outs):
                continue
            if node in takers:   # declared (arena.declare_into): it keeps the buffer, maybe not every call
                if outs[0] is not None and getattr(takers[node], "write_into")(outs[0]):
                    prog.steps[i] = (takers[node], *st[1:])
                continue
            elif node.op == "fused" and st[0] is not aten_fused:  # a kernel (not the ATen fallback)
                fn = prepare_fused(node, outs)
            elif node.op == "matmul":
                fn = _matmul_into(outs[0], torch)
            elif node.op == "conv2d_pointwise" and outs[0] is not None:  # the generated convolution's
                nb, c, h, w = outs[0].shape                                # channels-last result
                outs = [outs[0].view(-1).view(nb, h, w, c).permute(0, 3, 1, 2)]
                fn = step_into(node, outs[0])
            elif node in addmm and outs[0] is not None:   # ATen's addmm, into the arena
                fn = addmm_into(node, outs[0])
            elif node.op == "linear_pointwise" and outs[0] is not None:  # the generated GEMM's
                fn = step_into(node, outs[0])
            elif node.op in NORM_OPS:
                fn = norm_kernel(node, False, outs)
            elif node.op == "pool_mixer":
                fn = pool_mixer_kernel(node, False, outs)
            elif node.op == "se_block" and outs[0] is not None:   # the generated kernel's channels-last result
                se_step: Any = se_block_kernel(node, False, outs)
                if se_step is None or getattr(se_step, "native_out", None) is None:
                    continue   # no kernel, or a result the caller gets: the step as it was
                fn, outs = se_step, [se_step.native_out]
            elif node.op in ("attention", "rotary_attention") and node in attention_kernels:
                fn = (attention_kernel if node.op == "attention" else rotary_attention_kernel)(node, False, outs)
                if fn.written[0] is None:   # one of its results is not planned: it allocates both
                    continue
                outs = list(fn.written)
            else:
                continue
            if fn is None:   # no kernel after all: the step as it was, allocating its result
                continue
            prog.steps[i] = (fn, *st[1:])
            for r, o in zip(node.results, outs):
                if o is not None:
                    bound[r] = o
        self.arena_view_steps = _bind_arena_views(prog, bound, self._arena)


    def __call__(self, inputs: Sequence[Any] | Mapping[str, Any] | None = None,
                 weights: Mapping[str, Any] | None = None) -> list:
        if weights is None and len(self.graph.weights) and not self.program.donate:
            # The graph's own weights, as torch tensors made once: the same tensors every
            # call, so packed library weights stay packed and nothing is converted again.
            # (A donating program updates its weights in place: it converts them each call.)
            weights = self._own_weights()
        elif weights is not None and self._derived_names:
            if self._derived is None:
                self._derived = {k: v for k, v in self._own_weights().items() if k in self._derived_names}
            weights = {**self._derived, **weights}
        outs = self.program(inputs, weights)
        if self._chain_tries:
            self._try_chain()
        return outs

    def _try_chain(self) -> None:
        """Chain the program's native steps (step_chain.py) once the same ones are native after
        two calls in a row: every weight packed, every kernel chosen and bound to its buffers."""
        from .step_chain import chain_steps, native_steps, settle, unchain

        self._chain_tries -= 1
        if self._chains:   # chained at an earlier call: keep the chains that armed, split the others
            self._chains, done = settle(self.program, self._chains)
            if done or not self._chain_tries:   # what has not run as its native call is put back
                for c in self._chains:
                    if not c.native_calls:
                        unchain(self.program, c)
                self._chains = [c for c in self._chains if c.native_calls]
                self._chain_tries = 0
        else:
            native = native_steps(self.program)
            if native and native == self._chain_last:
                self._chains = chain_steps(self.program, native)
            self._chain_last = native
        self.chained_steps = sum(len(c.members) for c in self._chains)

    def _own_weights(self) -> dict:
        """The program graph's weights as torch tensors, made once (see ``__call__``):
        ordinary tensors even when the first call comes under torch.inference_mode (a frozen
        torch.compile graph), since an inference tensor has no version counter, so its packed
        copy could never be trusted and every call would run unpacked."""
        if self._weights is None:
            import torch

            from ..backend.torch_exec import to_tensor

            with torch.inference_mode(False):
                self._weights = {k: to_tensor(v) for k, v in self.graph.weights.items()}
        return self._weights

    def report(self) -> str:
        names = {kernel_name(n.attrs["body"]) for n in self.kernels}
        fb = [f for f in fallbacks() if f.kernel in names]
        lines = [f"{len(self.kernels)} fused node(s), {len(names)} distinct kernel(s); "
                 f"compiled {self.cache['compiled']}, from the disk cache {self.cache['disk_hits']}, "
                 f"already in this process {self.cache['memory_hits']}; {self.compile_seconds:.3f} s"]
        if self.optimizer_kernels:
            lines.append(f"{len(self.optimizer_kernels)} AdamW update(s) as generated kernels")
        for f in fb:
            lines.append(f"  on ATen: {f.kernel}{f.where}: {f.reason}")
        made = self.kernel_choices()
        if made:
            lines.append(choose_report(made))
        return "\n".join(lines)

    def kernel_choices(self) -> list:
        """The measured kernel choices of this program's nodes (``choose.py``): made at the
        first call whose weights are packed, so empty before that."""
        from .choose import choices

        nodes = [n for n in self.graph.nodes if n.op in ("conv2d_pointwise", "linear_pointwise")]
        return [c for c in choices() if any(c.of(n) for n in nodes)]


# Movement ops whose step on a tensor in the arena is a view of it that can be made once: the
# views and the strided views of partita/ops/kinds.py, and ``split`` (its pieces are views).
_VIEW_OPS = VIEW_OPS | STRIDED_VIEW_OPS | {"split", "slice"}   # a slice: a view in torch (BLOOM's fused q, k, v)


def _bind_arena_views(prog: Any, bound: dict, arena: Any) -> int:
    """Make the reshapes, transposes, slices and splits of values in the arena (and of their views)
    once: each such step becomes a ``ConstantStep`` holding the view (a split's: the list of its
    pieces), which the generated function reads as a constant (a torch view costs about 2 us a
    call on the CPUs measured; ViT has 61 of them). The memory plan keeps a buffer alive while
    any view of it is, and a planned buffer never reaches an output, so the same view objects
    serve every call. A view op whose results would not share the arena's memory (a reshape
    that copies) is left as it is. Returns how many steps were bound."""
    from ..backend.torch_exec import ConstantStep
    from ..ops.registry import OPS

    base = arena.untyped_storage().data_ptr()
    count = 0
    for i, st in enumerate(prog.steps):
        node = st[7]
        if node.op not in _VIEW_OPS or len(node.operands) != 1:
            continue
        src = bound.get(node.operands[0])
        opdef = OPS.get(node.op)
        if src is None or opdef is None or st[0] is not opdef.torch:
            continue
        made = opdef.torch([src], node.attrs)
        views = list(made) if isinstance(made, (list, tuple)) else [made]
        if len(views) != len(node.results) or not all(
                t.untyped_storage().data_ptr() == base and tuple(t.shape) == tuple(r.type.shape)
                for t, r in zip(views, node.results)):
            continue
        prog.steps[i] = (ConstantStep(made if len(node.results) == 1 else list(views)), *st[1:])
        for r, t in zip(node.results, views):
            bound[r] = t
        count += 1
    return count


def _fold_movement(g: Graph) -> Graph:
    """The canonicalize rules on chains of data movement (transposes that cancel across a
    reshape, reshapes of reshapes) run on what fuse-library made: its patch embedding as a
    linear layer moves the result back to [N, C, H, W], which the model then flattens and
    transposes to [N, H*W, C], a copy that these rules turn into one view. (Not the whole
    canonicalize pass: the caller chose the graph's pipeline.)"""
    from ..passes.canonicalize import RULES
    from ..passes.rewrite import RewriteDriver

    names = ("transpose-reshape-transpose", "reshape-reshape", "reshape-same")
    RewriteDriver([r for r in RULES if r.name in names]).run(g)
    from ..passes.dce import DeadCodeElimination

    return DeadCodeElimination().run(g)


# The activations a linear layer on ATen applies in place on its result in the arena.
_INPLACE_UNARY = ("none", "relu", "silu")


def addmm_fits(node: Any, fn: Any) -> bool:
    """Whether the step ``fn`` of ``node`` is a ``linear_pointwise`` run on ATen (a layer too
    small for the library's kernels: 2-D f32 input, no activation or relu or silu), which can
    write its result into the arena (``addmm_into``): its views are then made once too."""
    from ..ir.dtypes import f32
    from .aten_fallback import aten_linear

    if node.op != "linear_pointwise" or fn is not aten_linear or len(node.operands) not in (2, 3):
        return False
    x, w = node.operands[:2]
    vs = (*node.operands, node.results[0])
    return (node.attrs.get("unary", "none") in _INPLACE_UNARY and len(x.type.shape) == 2
            and len(w.type.shape) == 2 and all(len(v.type.shape) == 1 for v in node.operands[2:])
            and all(v.type.dtype is f32 for v in vs)
            and all(isinstance(d, int) for v in vs for d in v.type.shape))


def addmm_into(node: Any, out: Any) -> Any:
    """The step of a node that ``addmm_fits``: ``bias + x @ w`` (``x @ w`` without a bias)
    written into ``out`` at every call, then its activation in place (the weight transposed
    as a view where it is stored [N, K])."""
    import torch

    addmm, mm = torch.addmm, torch.mm
    nk = node.attrs.get("weight_layout", "kn") == "nk"
    act = {"none": None, "relu": torch.relu_,
           "silu": lambda t: torch.nn.functional.silu(t, inplace=True)}[node.attrs.get("unary", "none")]
    bias = len(node.operands) == 3

    def step(args: list, attrs: dict):
        w = args[1].t() if nk else args[1]
        y = addmm(args[2], args[0], w, out=out) if bias else mm(args[0], w, out=out)
        return y if act is None else act(y)
    return step


def _matmul_into(out, torch):
    matmul = torch.matmul

    def step(args: list, attrs: dict):
        return matmul(args[0], args[1], out=out)
    return step


def _stats() -> dict[str, int]:
    import importlib

    jit_module = importlib.import_module(".jit", __name__)  # the module (the package's `jit` is its function)
    try:
        s = jit_module.jit().stats
    except CodegenError:  # no working LLVM: every kernel runs on ATen (fallbacks() says so)
        return {"compiled": 0, "disk_hits": 0, "memory_hits": 0, "corrupt": 0}
    return {"compiled": s.compiled, "disk_hits": s.disk_hits, "memory_hits": s.memory_hits, "corrupt": s.corrupt}


def emit_kernels(graph: Graph, optimized: bool = False) -> str:
    """The kernels of ``graph`` (fused by ``fuse-kernels`` here if it has no fused nodes yet)
    as text: each body in the IR text form and its LLVM IR (after LLVM's optimizations with
    ``optimized=True``)."""
    from .fused_body import body_graph
    from .lowering import LoweringError, lower

    g = graph
    if not any(n.op == "fused" for n in g.nodes):
        g = FuseKernels().run(graph.clone())
    from ..ir.printer import print_graph_lines

    out: list[str] = []
    seen: set[str] = set()
    lines, where = print_graph_lines(g)
    for n in g.nodes:
        if n.op != "fused":
            continue
        text = n.attrs["body"]
        name = kernel_name(text)
        line = lines[where[n]]
        users = line.split(" = fused(")[0].strip()
        loc = n.text_loc or n.loc
        at = f" ({loc})" if loc else ""
        if name in seen:
            out.append(f"; {users} = {name} (as above){at}\n")
            continue
        seen.add(name)
        out.append(f"; ---- kernel {name} for {users}{at}\n; body:\n" +
                   "".join(f";   {ln}\n" for ln in text.splitlines()))
        try:
            low = lower(body_graph(text), name)
            out.append(jit().optimized_ir(low.ir) if optimized else low.ir)
        except LoweringError as e:
            out.append(f"; not lowered (runs on ATen): {e}\n")
    out += _emit_convolutions(g, lines, where, optimized)
    out += _emit_norms(g, lines, where, optimized)
    if not out:
        return "; no fused kernels: the graph has no group of two or more elementwise ops\n"
    return "\n".join(out)


def _emit_convolutions(g: Graph, lines: list[str], where: dict, optimized: bool) -> list[str]:
    """The generated convolution kernel of each ``conv2d_pointwise`` node one takes (f32,
    static shapes, bias / add / relu epilogues): Winograd's (codegen/winograd.py) where it
    takes the node, else the direct one (codegen/conv.py), both groups and dilation 1; the
    depthwise one (codegen/depthwise.py) for groups = channels, any dilation, silu and sigmoid
    too."""
    from ..ir.dtypes import f32
    from . import depthwise, library, winograd
    from .conv import kernel_source, supported

    out: list[str] = []
    seen: set[str] = set()
    for n in g.nodes:
        if n.op != "conv2d_pointwise" or n.attrs["binary"] not in ("none", "add") or n.attrs["unary"] not in depthwise.ACTS:
            continue
        xs, ws = tuple(n.operands[0].type.shape), tuple(n.operands[1].type.shape)
        a = n.attrs
        if any(v.type.dtype is not f32 for v in n.operands) or any(not isinstance(d, int) for d in (*xs, *ws)):
            continue
        conv_args = (xs, ws, a["stride"], a["padding"], a["dilation"], a["groups"])
        relu_only = a["unary"] in ("none", "relu")     # silu and sigmoid: the depthwise kernel's alone
        if relu_only and library.WINOGRAD and not winograd.supported(*conv_args):
            name, ir = winograd.kernel_source(xs, ws, list(a["padding"]), a["unary"])
            where_ = "codegen/winograd.py, F(2x2, 3x3), every dimension a constant"
        elif relu_only and not supported(*conv_args):
            name, ir = kernel_source(xs, ws, list(a["stride"]), list(a["padding"]), a["unary"])
            where_ = "codegen/conv.py, every dimension a constant"
        elif not depthwise.supported(*conv_args):
            name, ir = depthwise.kernel_source(xs, ws, list(a["stride"]), list(a["padding"]), a["unary"],
                                               a["binary"] == "add", list(a["dilation"]))
            where_ = "codegen/depthwise.py, every dimension a constant"
        else:
            continue
        _emit_once(out, seen, lines[where[n]].split(" = ")[0].strip(), name, f"convolution kernel {name}",
                   where_, ir, optimized)
    return out


def _emit_norms(g: Graph, lines: list[str], where: dict, optimized: bool) -> list[str]:
    """The generated norm kernel (codegen/norm.py) of each ``layer_norm``, ``rms_norm`` and
    ``add_norm`` node it takes (f32, static shapes)."""
    from .norm import kernel_of, kernel_source, takes

    out: list[str] = []
    seen: set[str] = set()
    for n in g.nodes:
        if not takes(n):
            continue
        name, ir = kernel_source(*kernel_of(n))
        _emit_once(out, seen, lines[where[n]].split(" = ")[0].strip(), name,
                   f"norm kernel {name}", "codegen/norm.py, the row size a constant", ir, optimized)
    return out


def _emit_once(out: list[str], seen: set[str], users: str, name: str, what: str, how: str, ir: str,
               optimized: bool) -> None:
    """Append kernel ``name``'s IR under a header naming its users, or a line pointing at the
    same kernel printed above."""
    if name in seen:
        out.append(f"; {users} = {name} (as above)\n")
        return
    seen.add(name)
    out.append(f"; ---- {what} for {users}: {how}\n")
    out.append(jit().optimized_ir(ir) if optimized else ir)
