"""The static memory plan: one arena, an offset for every planned buffer, reused as lifetimes allow.

Which values are planned. Those whose producing step writes into a buffer it is given:
generated kernels (``fused``, whose outputs the kernel stores), ``matmul`` (``out=``), the
linear layers the generated GEMM runs (``linear_pointwise``), the convolutions the
generated kernel runs (``conv2d_pointwise``, a channels-last result: the buffer's bytes seen as
[N, H, W, C]), the norms the generated norm kernel runs (``layer_norm``, ``rms_norm``,
``add_norm``) and the attention the generated attention kernel runs (``attention``,
``rotary_attention``: the result's buffer seen as [B, T, H, E] behind its [B, H, T, E] view, and
the log-sum-exp); those oneDNN or ATen runs allocate their own. Besides these, any step that
declares it can write its one result into a given buffer (``declare_into``: the step carries a
``write_into(out)`` that keeps ``out``, a tensor of the result's type over the planned bytes, as
its result buffer): the generated pad, max pool, global mean and channels-last GroupNorm, and
the ATen ops with an ``out=`` form (``out_form_step``: add, sub, mul, div, maximum, minimum,
where, embedding) on operands whose natural result is contiguous. Such a step may still
allocate on a call that takes another path (an input in other memory, ATen picked by the
measured choice); its result is then simply a new tensor that call.
Everything else is allocated by ATen when it runs, and the plan still counts it, so the
peak it reports covers the whole program.

Lifetimes come from the order in which the program runs its steps. A value lives from the step
that makes it to the last step that reads it. An op that may return a view of its operand or
the operand itself (the data-movement ops, such as reshape, transpose, slice and broadcast, and
``cast``) joins its result's lifetime to the operand's, so a buffer is never reused while a
view of it is still alive. Graph outputs, and values that reach an output through such views,
are never planned: the caller keeps them after the call. Inputs, donated or not, belong to the
caller.

Placement is greedy by size, as TFLite's arena planner does it. Buffers are taken largest first,
and each goes to the lowest offset, 64-byte aligned, that no buffer live at the same time
overlaps. Two buffers live at the same step never share memory, so a kernel never writes over
an input it is still reading.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..ir.graph import Graph, Node, Value
from ..ops.registry import OPS, movement_cost

__all__ = ["Buffer", "MemoryPlan", "plan_memory", "PLANNED_OPS", "ALIGN", "declare_into", "takes_buffer",
           "channels_last_over", "out_form_step", "OUT_FORMS"]

ALIGN = 64
# Steps that write into a given buffer (see partita/codegen/__init__.py, which binds them).
PLANNED_OPS = frozenset({"fused", "matmul", "conv2d_pointwise", "linear_pointwise", "layer_norm", "rms_norm",
                         "add_norm", "attention", "rotary_attention", "pool_mixer", "se_block"})


# Bytes kept free after each buffer of at least a page, so that buffers next to each other do
# not start the same distance from a 4 KiB boundary. Two such buffers read and written by
# one kernel otherwise alias in the L1's sets and in the load/store unit's address check (a
# load from the input row below compared with the stores just made to the output). Measured on
# the CNN's 3 x 3 convolutions over 4 MiB buffers: 0.3 to 1 ms of 5.5 with the buffers 4 MiB apart.
SKEW = 1088


def _aligned(n: int) -> int:
    a = (n + ALIGN - 1) // ALIGN * ALIGN
    return a + SKEW if a >= 4096 else a


# Data-movement ops whose step always makes a new tensor: a concat of two or more (torch.cat),
# a gather, an index_select. (A concat's result joined to its operands' buffers made ViT's patch
# GEMM look like an alias of the class token, a graph input, and left it unplanned.)
_COPIES = frozenset({"gather", "index_select"})


def _may_alias(node: Node) -> bool:
    opdef = OPS.get(node.op)
    if node.op in _COPIES or node.op == "concat" and len(node.operands) > 1:
        return False
    return opdef is not None and (opdef.cost is movement_cost or node.op == "cast")


@dataclass
class Buffer:
    value: Value
    name: str
    nbytes: int
    first: int           # the step that writes it
    last: int            # the last step that reads it (or a view of it)
    offset: int = -1     # in the arena; -1: not planned (ATen allocates it)
    why: str = ""        # why it is not planned


@dataclass
class MemoryPlan:
    buffers: list[Buffer]
    arena_bytes: int
    steps: int
    unplanned_peak: int          # most bytes ATen-allocated values hold at one step
    peak_bytes: int              # arena + unplanned peak: the program's own activation memory
    no_reuse_bytes: int          # every planned buffer on its own
    by_value: dict[Value, Buffer] = field(default_factory=dict, repr=False)
    shared: dict[Value, Value] = field(default_factory=dict, repr=False)  # result -> the operand it overwrites
    shared_text: list[str] = field(default_factory=list, repr=False)

    def buffer_of(self, v: Value) -> Value:
        """The value whose buffer ``v`` is written into: itself, or the operand it was written
        over in place (followed along a chain of them)."""
        while v in self.shared:
            v = self.shared[v]
        return v

    def planned(self) -> list[Buffer]:
        return [b for b in self.buffers if b.offset >= 0]

    def text(self) -> str:
        """The plan as a table: every buffer, its bytes, arena offset and live steps."""
        mb = 1 << 20
        lines = [f"; memory plan: {len(self.planned())} planned buffer(s) in an arena of {self.arena_bytes / mb:.2f} MiB "
                 f"(without reuse {self.no_reuse_bytes / mb:.2f} MiB); ATen-allocated values peak at "
                 f"{self.unplanned_peak / mb:.2f} MiB; peak {self.peak_bytes / mb:.2f} MiB over {self.steps} steps",
                 ";   value                          bytes       offset    live steps"]
        for b in sorted(self.buffers, key=lambda b: (b.offset < 0, b.offset, b.first)):
            where = f"{b.offset:>10}" if b.offset >= 0 else f"{'(ATen)':>10}"
            lines.append(f";   {b.name:<28} {b.nbytes:>10} {where}    {b.first}..{b.last}"
                         + (f"  {b.why}" if b.why and b.offset < 0 and b.why != "ATen allocates it" else ""))
        lines += self.shared_text
        return "\n".join(lines) + "\n"


def plan_memory(graph: Graph, step_nodes: list[Node], names: dict[Value, str] | None = None,
                unplanned: set[Node] | None = None, in_place: dict[Node, int] | None = None,
                into: set[Node] | None = None) -> MemoryPlan:
    """The plan for ``graph`` run as ``step_nodes`` in this order (the torch executor's steps).
    ``unplanned``: nodes of a planned op whose step allocates its own result after all (a
    matmul that oneDNN runs). ``in_place``: nodes whose one result may be written over their
    operand of that index, each element read just before its own is written (the residual of
    a convolution); where that operand is a planned buffer of its own (not a view), of the
    result's size, read by the node through no other operand, and this node is its last
    reader, the result takes its buffer (``shared``). ``into``: nodes of other ops whose step
    declared that it writes its one result into a given buffer (``declare_into``)."""
    order = {n: i for i, n in enumerate(step_nodes)}
    # alias classes: a view (or possibly the same tensor) shares its base's memory
    parent: dict[Value, Value] = {}

    def root(v: Value) -> Value:
        while v in parent:
            v = parent[v]
        return v

    for n in step_nodes:
        if _may_alias(n) and not (into and n in into):   # a declared step makes a new tensor
            for r in n.results:
                for o in n.operands:
                    ra, ro = root(r), root(o)
                    if ra is not ro:
                        parent[ra] = ro
    shared: dict[Value, Value] = {}
    if in_place:
        reads: dict[Value, int] = {}     # the last step reading a buffer (any of its views)
        for n in step_nodes:
            for v in n.operands:
                reads[root(v)] = order[n]
        outs0 = {root(v) for v in graph.outputs}
        for n in sorted((n for n in in_place if n in order), key=order.__getitem__):
            o, r = n.operands[in_place[n]], n.results[0]
            base = root(o)
            src = base.producer
            # o is its buffer itself (or a result already written over one), not a view of it,
            # and the node reads that buffer through no other operand (a convolution whose input
            # is also its residual would overwrite input rows its later tiles still read)
            whole = base is o or shared.get(o) is not None and root(shared[o]) is base
            whole = whole and all(root(v) is not base for j, v in enumerate(n.operands) if j != in_place[n])
            if (whole and n.op in PLANNED_OPS and not (unplanned and n in unplanned)
                    and root(r) is r and r not in outs0 and base not in outs0
                    and src is not None and src in order and src.op in PLANNED_OPS
                    and not (unplanned and src in unplanned) and reads.get(base) == order[n]
                    and base.type.nbytes == r.type.nbytes):
                parent[r] = base
                shared[r] = o
                reads[base] = reads.get(r, order[n])
    nm = names or {}
    shared_text = [f";   {nm.get(r, '%' + str(r.name))} is written over {nm.get(o, '%' + str(o.name))} (in place, its last reader)"
                   for r, o in shared.items()]
    first: dict[Value, int] = {}
    last: dict[Value, int] = {}
    members: dict[Value, list[Value]] = {}
    for n in step_nodes:
        i = order[n]
        for r in n.results:
            rt = root(r)
            members.setdefault(rt, []).append(r)
            first[rt] = min(first.get(rt, i), i)
            last[rt] = max(last.get(rt, i), i)
        for v in n.operands:
            rt = root(v)
            last[rt] = max(last.get(rt, i), i)
    outputs = {root(v) for v in graph.outputs}
    inputs = {root(v) for v in graph.inputs}
    buffers: list[Buffer] = []
    by_value: dict[Value, Buffer] = {}
    for n in step_nodes:
        for r in n.results:
            rt = root(r)
            if rt is not r:
                continue  # a view: its base's buffer holds it
            why = ""
            if n.op not in PLANNED_OPS and not (into and n in into and len(n.results) == 1):
                why = "ATen allocates it"
            elif unplanned is not None and n in unplanned:
                why = "oneDNN allocates it"
            elif rt in outputs:
                why = "reaches a graph output"
            elif rt in inputs:
                why = "aliases a graph input"
            b = Buffer(r, (names or {}).get(r, f"%{r.name}" if r.name else f"{n.op}#{order[n]}"), r.type.nbytes,
                       first[rt], last[rt], -1, why)
            buffers.append(b)
            by_value[r] = b
    planned = [b for b in buffers if not b.why]
    placed: list[Buffer] = []
    for b in sorted(planned, key=lambda b: (-b.nbytes, b.first)):
        size = _aligned(b.nbytes)
        busy = sorted((p.offset, p.offset + _aligned(p.nbytes)) for p in placed
                      if p.first <= b.last and b.first <= p.last)
        off = 0
        best = None
        for lo, hi in busy:
            if lo - off >= size and (best is None or lo - off < best[1]):
                best = (off, lo - off)
            off = max(off, hi)
        b.offset = best[0] if best is not None else off
        placed.append(b)
    arena = max((b.offset + _aligned(b.nbytes) for b in placed), default=0)
    steps = len(step_nodes)
    live = [0] * (steps + 1)
    for b in buffers:
        if b.offset < 0 and b.value.producer is not None:
            live[b.first] += b.nbytes
            live[b.last + 1] -= b.nbytes
    peak_un = cur = 0
    for d in live:
        cur += d
        peak_un = max(peak_un, cur)
    return MemoryPlan(buffers, arena, steps, peak_un, arena + peak_un,
                      sum(_aligned(b.nbytes) for b in placed), by_value, shared, shared_text)


def arena_views(plan: MemoryPlan, torch: Any) -> tuple[Any, dict[Value, Any]]:
    """One arena tensor and, for every planned value, a tensor of its type over its bytes."""
    from ..ops._lazy import to_torch_dtype

    arena = torch.empty(max(plan.arena_bytes, 1), dtype=torch.uint8)
    views = {}
    for b in plan.planned():
        t = b.value.type
        dt = to_torch_dtype(t.dtype)
        n = t.numel
        chunk = arena[b.offset:b.offset + n * t.dtype.itemsize]
        views[b.value] = chunk.view(dt).view(tuple(t.shape))
    return arena, views


def declare_into(step: Callable, write_into: Callable[[Any], bool]) -> Callable:
    """``step``, declared able to write its one result into a given buffer: the memory plan
    then gives its result a place in the arena and calls ``write_into(out)`` once with ``out``,
    a tensor of the result's type over those bytes (row-major); True: the step keeps ``out`` as
    its result buffer (it may view the same bytes in another layout)."""
    setattr(step, "write_into", write_into)
    return step


def takes_buffer(step: Any) -> bool:
    """Whether ``step`` declared ``write_into`` (``declare_into``)."""
    return callable(getattr(step, "write_into", None))


def channels_last_over(out: Any) -> Any:
    """The [N, C, H, W] tensor in channels-last memory over the bytes of ``out`` (4-d, row-major)."""
    nb, c, h, w = out.shape
    return out.view(-1).view(nb, h, w, c).permute(0, 3, 1, 2)


def _embedding_out(a: list, o: Any, torch: Any) -> Any:
    """table[indices] into ``o``: the rows gathered by index_select."""
    torch.index_select(a[0], 0, a[1].reshape(-1), out=o.view(-1, o.shape[-1]))
    return o


# The ATen forms with out= of ops whose step is their plain torch form: (args, out, torch) -> out.
OUT_FORMS: dict[str, Callable[[list, Any, Any], Any]] = {
    "add": lambda a, o, t: t.add(a[0], a[1], out=o),
    "sub": lambda a, o, t: t.sub(a[0], a[1], out=o),
    "mul": lambda a, o, t: t.mul(a[0], a[1], out=o),
    "div": lambda a, o, t: t.div(a[0], a[1], out=o),
    "maximum": lambda a, o, t: t.maximum(a[0], a[1], out=o),
    "minimum": lambda a, o, t: t.minimum(a[0], a[1], out=o),
    "where": lambda a, o, t: t.where(a[0], a[1], a[2], out=o),
    "embedding": _embedding_out,
}


def out_form_step(node: Node, step: Callable, torch: Any) -> Callable | None:
    """A step for ``node`` (an op of ``OUT_FORMS`` run by its torch form ``step``) that, once
    given a buffer (``declare_into``), runs the op's ATen form with ``out=`` into it where every
    operand is contiguous and of the result's dtype (the step's own result would then be
    contiguous of that dtype too); any other call runs ``step``. None where the op has no such
    form, the result is not one floating value of static shape, or an operand's dtype differs
    (a promotion ATen's out= form would not make the same way)."""
    form = OUT_FORMS.get(node.op)
    if form is None or len(node.results) != 1:
        return None
    rt = node.results[0].type
    if not rt.dtype.is_float or rt.numel == 0 or any(not isinstance(d, int) for d in rt.shape):
        return None
    data = node.operands[1:] if node.op == "where" else node.operands[:1] if node.op == "embedding" else node.operands
    if any(v.type.dtype != rt.dtype for v in data):
        return None
    held: list[Any] = []
    data_at = [i for i, v in enumerate(node.operands) if any(v is d for d in data)]

    def into(args: list, attrs: dict) -> Any:
        if held:
            o = held[0]
            if all(a.is_contiguous() for a in args) and all(args[i].dtype is o.dtype for i in data_at):
                return form(args, o, torch)
        return step(args, attrs)

    def write_into(out: Any) -> bool:
        held[:] = [out]
        return True
    return declare_into(into, write_into)


def into_steps(prog: Any, torch: Any) -> dict[Node, Callable]:
    """The steps of ``prog`` (a torch executor's program) that can write their one result into
    a given buffer: those that declared it (``declare_into``) and, for ops of ``OUT_FORMS`` run
    by their plain torch form, the ``out_form_step`` around it."""
    found: dict[Node, Callable] = {}
    for st in prog.steps:
        fn, node = st[0], st[7]
        if node.op in PLANNED_OPS or len(node.results) != 1:
            continue
        if takes_buffer(fn):
            found[node] = fn
            continue
        opdef = OPS.get(node.op)
        if opdef is not None and fn is opdef.torch:
            made = out_form_step(node, fn, torch)
            if made is not None:
                found[node] = made
    return found
