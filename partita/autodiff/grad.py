"""Reverse-mode automatic differentiation over the SSA graph.

``grad(graph)`` appends to a graph whose first output is a scalar loss the nodes that compute
the gradient of that loss with respect to each ``param`` input (or a chosen subset), and
returns those gradients as extra outputs. The backward nodes are ordinary partita ops emitted
by each op record's ``vjp`` rule; every one carries the source location of the forward node
it differentiates, so an error or a profile of the backward pass points at the model line.

Only the nodes that lie on a path from a differentiated input to the loss through float values
are differentiated ("active"); integer and bool values never carry gradients, which is how
comparisons, ``argmax`` or an embedding's indices are non-differentiable without a rule.
Fan-out is handled by accumulation: a value used by several nodes receives the sum of the
gradients its users send back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Literal

from ..ir.builder import Builder
from ..ir.diagnostics import PartitaError, suggest
from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType
from ..ops.registry import OPS
from ..passes.manager import Pass, register_pass


class AutodiffError(PartitaError):
    """The graph cannot be differentiated as asked (the message names the node and line)."""


def where(node: Node) -> str:
    """``op at file:line`` for messages about a forward node."""
    loc = node.loc or node.text_loc
    return f"{node.op}" + (f" at {loc}" if loc is not None else "")


def _val(v: Value) -> str:
    return f"%{v.name}" if v.name is not None else repr(v)


# Rules that emit nothing for any operand: the op's float results do not depend smoothly on
# its float operands (or it has none).
NOT_DIFFERENTIABLE = "not-differentiable"

SEED_NAME = "grad.seed"


class VjpContext:
    """What a ``vjp`` rule gets: a builder positioned at the end of the graph with the forward
    node's location, the node, and helpers for the common gradient shapes."""

    def __init__(self, graph: Graph, node: Node) -> None:
        self.graph = graph
        self.node = node
        self.b = Builder(graph, loc=node.loc or node.text_loc)

    def zeros(self, t: TensorType) -> Value:
        return self.b.full(shape=t.shape, value=0.0, dtype=t.dtype)

    def zeros_like(self, v: Value) -> Value:
        return self.zeros(v.type)

    def sum_to(self, g: Value, shape: tuple[int, ...]) -> Value:
        """Undo broadcasting: sum ``g`` over the dims that broadcasting added or stretched
        so that it has ``shape``."""
        gs = g.type.shape
        if gs == tuple(shape):
            return g
        lead = len(gs) - len(shape)
        axes = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and gs[lead + i] != 1]
        if axes:
            g = self.b.sum(g, axes=axes, keepdim=False)
        if g.type.shape != tuple(shape):
            g = self.b.reshape(g, shape=shape)
        return g

    def expand_reduced(self, g: Value, x: Value, axes, keepdim: bool) -> Value:
        """Broadcast the gradient of a reduction over ``axes`` back to ``x``'s shape."""
        rank = x.type.rank
        ax = tuple(range(rank)) if axes is None else tuple(a % rank for a in axes) if rank else ()
        if not keepdim and ax:
            kept = tuple(1 if i in ax else s for i, s in enumerate(x.type.shape))
            g = self.b.reshape(g, shape=kept)
        if g.type.shape != x.type.shape:
            g = self.b.broadcast_to(g, shape=x.type.shape)
        return g

    def reshape(self, v: Value, shape) -> Value:
        """``v`` reshaped to ``shape``; no node when it already has that shape."""
        return v if v.type.shape == tuple(shape) else self.b.reshape(v, shape=tuple(shape))

    def scalar(self, value: float, like: Value) -> Value:
        return self.b.full(shape=(), value=float(value), dtype=like.type.dtype)


VjpRule = Callable[[VjpContext, Node, list], list]


@dataclass
class GradResult:
    """What ``grad`` added: the gradient value of each differentiated input, by name."""

    graph: Graph
    grads: dict[str, Value]


def _active_nodes(graph: Graph, wrt: list[Value], loss: "Value | Iterable[Value]") -> set[Node]:
    """Nodes on a float path from some ``wrt`` input to the loss (or to any of the values
    ``loss`` lists)."""
    outs = [loss] if isinstance(loss, Value) else list(loss)
    live: set[Value] = set(wrt)
    forward: set[Node] = set()
    for node in graph.nodes:
        if any(v in live for v in node.operands):
            hit = False
            for r in node.results:
                if r.type.dtype.is_float:
                    live.add(r)
                    hit = True
            if hit:
                forward.add(node)
    needed: set[Value] = {v for v in outs if v in live}
    if not needed:
        return set()
    active: set[Node] = set()
    for node in graph.reversed_nodes():
        if node in forward and any(r in needed for r in node.results):
            active.add(node)
            for v in node.operands:
                if v in live:
                    needed.add(v)
    return active


def _check_loss(graph: Graph, loss_index: int) -> Value:
    if not graph.outputs:
        raise AutodiffError(f"@{graph.name} has no outputs; grad needs a scalar loss as output {loss_index}")
    if not 0 <= loss_index < len(graph.outputs):
        raise AutodiffError(f"@{graph.name} has {len(graph.outputs)} output(s); there is no output {loss_index} "
                            f"to use as the loss")
    loss = graph.outputs[loss_index]
    prod = f" (computed by {where(loss.producer)})" if loss.producer is not None else ""
    if loss.type.shape != ():
        raise AutodiffError(f"@{graph.name}: the loss (output {loss_index}, {_val(loss)}{prod}) has type "
                            f"{loss.type}; it must be a scalar: reduce it first, e.g. with mean or sum")
    if not loss.type.dtype.is_float:
        raise AutodiffError(f"@{graph.name}: the loss (output {loss_index}, {_val(loss)}{prod}) has dtype "
                            f"{loss.type.dtype}; only a float loss has a gradient")
    return loss


def _select_wrt(graph: Graph, wrt: Iterable[str] | None) -> list[Value]:
    if wrt is None:
        chosen = [v for v in graph.inputs if v.role == "param"]
        if not chosen:
            raise AutodiffError(f"@{graph.name} has no param inputs to differentiate; mark the trainable inputs "
                                f"'param' or name them with wrt=")
        return chosen
    by_name = {v.name: v for v in graph.inputs}
    chosen = []
    for name in wrt:
        v = by_name.get(name)
        if v is None:
            raise AutodiffError(f"@{graph.name} has no input named '{name}'{suggest(name, by_name)}; "
                                f"inputs: {', '.join(str(n) for n in by_name)}")
        if not v.type.dtype.is_float:
            raise AutodiffError(f"input %{name} has dtype {v.type.dtype}; only float inputs have gradients")
        chosen.append(v)
    return chosen


def grad(graph: Graph, wrt: Iterable[str] | None = None, *, loss_index: int = 0,
         unused: Literal["zeros", "error"] = "zeros") -> GradResult:
    """Differentiate output ``loss_index`` (a float scalar) with respect to ``wrt`` (input
    names; default: every ``param`` input), in place.

    The gradients are appended to the graph's outputs in the order of ``wrt`` and named
    ``<input>.grad``. An input the loss does not depend on gets a zero gradient with
    ``unused="zeros"`` and an error listing all such inputs with ``unused="error"``.
    """
    if unused not in ("zeros", "error"):
        raise AutodiffError(f"unused must be 'zeros' or 'error', got {unused!r}")
    loss = _check_loss(graph, loss_index)
    targets = _select_wrt(graph, wrt)
    active = _active_nodes(graph, targets, loss)
    if not active and loss not in targets:
        prod = f" (computed by {where(loss.producer)})" if loss.producer is not None else ""
        raise AutodiffError(
            f"@{graph.name}: the loss {_val(loss)}{prod} does not depend on any of the differentiated inputs "
            f"({', '.join('%' + str(v.name) for v in targets[:8])}{', ...' if len(targets) > 8 else ''}); "
            f"check that the loss is computed from the model's output")

    # grad edits the graph in place, so a refusal halfway through the backward pass (an op
    # without a rule, inputs the loss does not use) erases what it appended: the caller's
    # graph stays as it was.
    n_forward = len(graph)
    try:
        out = _backward(graph, loss, targets, active, unused)
    except PartitaError:
        while len(graph) > n_forward:
            graph.erase(next(graph.reversed_nodes()))
        raise

    graph.set_outputs(list(graph.outputs) + list(out.values()),
                      list(graph.output_aliases or [None] * len(graph.outputs)) + [None] * len(out))
    return GradResult(graph, out)


def _backward(graph: Graph, loss: Value, targets: list[Value], active: set[Node],
              unused: str) -> dict[str, Value]:
    """Append the backward nodes; return the gradient of each target by name (still unnamed)."""
    b_end = Builder(graph, loc=loss.producer.loc if loss.producer is not None else None)
    # The seed dL/dL = 1 opens the backward section; its name marks where that section starts
    # for the memory analysis, also after a round trip through the text form.
    grads: dict[Value, Value] = {loss: b_end.full(shape=(), value=1.0, dtype=loss.type.dtype, name=SEED_NAME)}
    _propagate_back(graph, grads, active, targets)
    return _collect(graph, grads, targets, unused)


def backward(graph: Graph, seeds: "dict[Value, Value]", wrt: list[Value]) -> dict[Value, Value | None]:
    """Append to ``graph`` (in place) the vector-Jacobian product of its values ``seeds``
    (value -> its cotangent, a value of the same type already in the graph) with respect to
    ``wrt`` (inputs or any values): the reverse pass of a piece of a model whose outputs'
    gradients arrive from elsewhere, as a pipeline stage's do. Returns each ``wrt`` value's
    gradient, or None where the seeds do not depend on it. Values that are both seeded and
    in ``wrt`` (a value passed through) get their seed plus what flows back to them."""
    for v, ct in seeds.items():
        if ct.type != v.type:
            raise AutodiffError(f"backward: the cotangent of {_val(v)} is {ct.type}, but the value is {v.type}")
    active = _active_nodes(graph, wrt, list(seeds))
    grads: dict[Value, Value] = dict(seeds)
    _propagate_back(graph, grads, active, wrt)
    return {v: grads.get(v) for v in wrt}


def _propagate_back(graph: Graph, grads: dict[Value, Value], active: set[Node], targets: list[Value]) -> None:
    """Run the vjp rules of the ``active`` nodes in reverse order, accumulating into
    ``grads`` (value -> gradient, seeded by the caller)."""
    order = [n for n in graph.nodes if n in active]
    for node in reversed(order):
        douts = [grads.get(r) for r in node.results]
        if all(d is None for d in douts):
            continue
        opdef = OPS.get(node.op)
        rule = opdef.vjp if opdef is not None else None
        if rule is None or rule == NOT_DIFFERENTIABLE:
            why = "has no vjp rule" if rule is None else "is not differentiable"
            raise AutodiffError(f"{where(node)}: op '{node.op}' {why}, but the gradient of the loss reaches it "
                                f"(result {_val(node.results[0])}); detach this path (e.g. compute it from "
                                f"non-param inputs) or add a vjp rule (partita/autodiff/rules.py)")
        if not callable(rule):
            raise AutodiffError(f"internal error: the vjp rule of '{node.op}' is {rule!r}, neither a function nor "
                                f"NOT_DIFFERENTIABLE ({NOT_DIFFERENTIABLE!r}); fix its registration "
                                f"(partita/autodiff/rules.py)")
        ctx = VjpContext(graph, node)
        needs = [v in grads or _is_live(v, active, targets) for v in node.operands]
        try:
            dins = rule(ctx, node, douts, needs)
        except PartitaError as e:
            raise AutodiffError(f"{where(node)}: differentiating '{node.op}' failed: {e}") from None
        if len(dins) != len(node.operands):
            raise AutodiffError(f"internal error: the vjp rule of '{node.op}' returned {len(dins)} gradients for "
                                f"{len(node.operands)} operands")
        for v, d, need in zip(node.operands, dins, needs):
            if d is None or not need:
                continue
            d = _fit(ctx, node, v, d)
            prev = grads.get(v)
            grads[v] = d if prev is None else ctx.b.add(prev, d)


def _collect(graph: Graph, grads: dict[Value, Value], targets: list[Value], unused: str) -> dict[str, Value]:
    """Each target's gradient by name, a zero where none reached it (``unused="zeros"``)."""
    out: dict[str, Value] = {}
    missing = []
    for v in targets:
        g = grads.get(v)
        if g is None:
            missing.append(v)
            if unused == "error":
                continue
            g = Builder(graph).full(shape=v.type.shape, value=0.0, dtype=v.type.dtype)
        out[str(v.name)] = g
    if missing and unused == "error":
        raise AutodiffError(f"@{graph.name}: the loss does not depend on "
                            f"{', '.join('%' + str(v.name) for v in missing)}; pass unused='zeros' to give them "
                            f"zero gradients, or leave them out of wrt")
    for name, g in out.items():
        if g.name is None or g.name.isdigit():
            g.name = f"{name}.grad"
        else:
            # The value already has a name: the seed (the loss is a sum of params) or another
            # input's gradient (add(%w, %v) sends the same value to both). The optimizer finds
            # each gradient by its name, so each gets its own value, a same-shape reshape.
            out[name] = Builder(graph, loc=g.producer.loc if g.producer is not None else None).reshape(
                g, shape=g.type.shape, name=f"{name}.grad")
    return out


def _is_live(v: Value, active: set[Node], targets: list[Value]) -> bool:
    if v in targets:
        return True
    return v.producer is not None and v.producer in active and v.type.dtype.is_float


def _fit(ctx: VjpContext, node: Node, v: Value, d: Value) -> Value:
    """Check a rule's gradient against its operand's type; cast a dtype that promotion changed."""
    if d.type == v.type:
        return d
    if d.type.shape != v.type.shape:
        raise AutodiffError(f"internal error in the vjp rule of '{node.op}' ({where(node)}): gradient of "
                            f"{_val(v)} has shape {d.type} but the operand is {v.type}")
    return ctx.b.cast(d, dtype=v.type.dtype)


@register_pass
class Grad(Pass):
    """Append the gradients of the scalar loss (output 0) with respect to every ``param``
    input, or the inputs named in ``wrt`` (comma-separated), as outputs named
    ``<input>.grad``. ``unused=error`` rejects inputs the loss does not depend on."""

    name = "grad"

    @dataclass
    class Options:
        wrt: str = ""
        unused: Literal["zeros", "error"] = "zeros"
        loss: int = 0

    def run(self, graph: Graph) -> Graph:
        o = self.options
        names = [n.strip() for n in o.wrt.split(",") if n.strip()] or None
        grad(graph, names, loss_index=o.loss, unused=o.unused)
        return graph
