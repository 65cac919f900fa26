"""Local forms: what a rank runs for an op whose operand is split along a ``ranged`` label.

Most ops, run on a rank's pieces, give that rank's piece (or summand) of the global result:
the sharding rule says which, and the partition emits the same op on local shapes. A few ops
only give the right piece when they know *which* range of a dim the rank holds, and some
need to talk to the other ranks inside the op. Megatron's vocab-parallel embedding and loss
are the cases that matter:

- ``embedding`` with the table split by rows (the vocabulary): a rank holds rows
  ``[k*Vl, (k+1)*Vl)``; it looks up the indices in that range, shifted to local rows, and
  gives zero rows for the others. The ranks' results sum to the lookup (a partial result).
- ``cross_entropy`` with the logits split along the classes (a vocab-parallel LM head): the
  log-sum-exp over all classes and the target's logit are completed with all-reduces over the
  class axes (a max for the shift, then one fused sum of the exponentials and the target's
  logit), so no rank ever holds a whole row of logits.
- ``cross_entropy_grad`` likewise: softmax's max and denominator are the forward loss's
  (all-reduced there; recomputed with two all-reduces only without a forward on the same
  logits), and each rank subtracts the one-hot only where the target falls in its range.

A form is a function of a ``LocalForm`` (the builder, the rank's local operands, the global
types, and for each split ranged label the mesh axes that split it) returning the local
results. ``partita.parallel.partition`` calls it where the op would stand; the collectives it
emits are recorded in the partition report like any reshard's.

The rank's piece index is ``axis_index`` over the label's axes, major to minor, the order in
which a placement cuts a dim (``partition.piece_index``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..ir.builder import Builder
from ..ir.dtypes import DType, i64
from ..ir.graph import Graph, Node, Value
from ..ir.types import Location, TensorType
from ..ops.registry import OPS
from ..ir.mesh import Mesh


@dataclass
class LocalForm:
    """Everything a local form needs to build one rank's version of one op."""

    b: Builder
    operands: list[Value]  # the rank's local operands
    attrs: dict
    types: list[TensorType]  # the global operand types
    split: dict[str, tuple[str, ...]]  # each split ranged label -> its mesh axes, major to minor
    mesh: Mesh
    consumer: str  # how the partition report names the op
    loc: Location | None = None
    collectives: list[tuple[str, str, int]] = field(default_factory=list)  # (op, axis, bytes sent)
    # Shared by the forms of one partition: what one form computed that a later one can
    # reuse (cross_entropy's all-reduced max and softmax denominator, for its gradient).
    memo: dict = field(default_factory=dict)
    # The global operand types without padding (``partita.parallel.pad``): the sizes that ids
    # and targets are checked against. None: ``types``.
    real: list[TensorType] | None = None

    def real_size(self, operand: int, dim: int) -> int:
        """The real global size of ``dim`` of operand ``operand`` (padding left out)."""
        return (self.real or self.types)[operand].shape[dim]

    def emit(self, op_name: str, /, *operands: Value, **attrs: Any) -> Value:
        return self.b.emit(op_name, *operands, loc=self.loc, **attrs)

    def scalar(self, value: Any, dtype: DType) -> Value:
        return self.emit("full", shape=(), value=value, dtype=dtype)

    def start(self, label: str, size: int) -> Value:
        """The first global index (i64 scalar) of this rank's piece of ``label``, whose local
        size is ``size``: the piece index along the label's axes times ``size``."""
        k: Value | None = None
        for a in self.split[label]:
            c = self.emit("axis_index", axis=a, group_size=self.mesh.axis_size(a))
            k = c if k is None else self.emit("add", self.emit("mul", k, self.scalar(self.mesh.axis_size(a), i64)), c)
        assert k is not None, "start() is asked only for a split label"
        return self.emit("mul", k, self.scalar(size, i64))

    def in_range(self, index: Value, label: str, size: int, whole: int | None = None,
                 ignored: int | None = None) -> tuple[Value, Value]:
        """``(local, inside)``: ``index`` (global positions along ``label``) shifted to this
        rank's piece, with positions outside the piece set to 0, and where they were inside.

        With ``whole`` (the label's global size), a position outside ``0..whole-1`` (other
        than ``ignored``) is passed on as it is instead of 0: no rank's piece holds it, and
        the op that reads it then fails on every rank, as the unsplit op fails, where a 0
        would silently read a wrong row."""
        lo = self.start(label, size)
        dt = index.type.dtype
        if dt is not i64:
            lo = self.emit("cast", lo, dtype=dt)
        local = self.emit("sub", index, lo)
        inside = self.emit("logical_and", self.emit("greater_equal", local, self.scalar(0, dt)),
                           self.emit("less", local, self.scalar(size, dt)))
        outside: Value = self.scalar(0, dt)
        if whole is not None:
            valid = self.emit("logical_and", self.emit("greater_equal", index, self.scalar(0, dt)),
                              self.emit("less", index, self.scalar(whole, dt)))
            if ignored is not None:
                valid = self.emit("logical_or", valid, self.emit("equal", index, self.scalar(ignored, dt)))
            outside = self.emit("where", valid, outside, index)
        return self.emit("where", inside, local, outside), inside

    def all_reduce(self, v: Value, label: str, op: str = "sum") -> Value:
        """``v`` reduced over every mesh axis that splits ``label``."""
        for a in self.split[label]:
            attrs = {"axis": a, "group_size": self.mesh.axis_size(a), "op": op}
            cost = OPS["all_reduce"].cost([v.type], [v.type], attrs)
            v = self.emit("all_reduce", v, **attrs)
            self.collectives.append(("all_reduce", a, int(cost.bytes_written)))
        return v


def embedding(f: LocalForm) -> list[Value]:
    """The vocab-parallel lookup: this rank's rows of the table for indices in its range,
    zero rows elsewhere (a summand of the global lookup)."""
    table, idx = f.operands
    rows = table.type.shape[0]
    safe, inside = f.in_range(idx, "v", rows, whole=f.real_size(0, 0))
    out = f.emit("embedding", table, safe)
    mask = f.emit("unsqueeze", inside, axes=(idx.type.rank,))
    return [f.emit("where", mask, out, f.scalar(0.0, table.type.dtype))]


def embedding_grad(f: LocalForm) -> list[Value]:
    """The gradient of a vocab-parallel table's rows (the result split by rows): the rows of
    ``dy`` whose indices are in the rank's range, scattered into its rows; the others masked."""
    dy, idx = f.operands
    n = 1
    for a in f.split["v"]:
        n *= f.mesh.axis_size(a)
    rows = f.attrs["num_embeddings"] // n
    safe, inside = f.in_range(idx, "v", rows)
    masked = f.emit("where", f.emit("unsqueeze", inside, axes=(idx.type.rank,)), dy, f.scalar(0.0, dy.type.dtype))
    return [f.emit("embedding_grad", masked, safe, **{**f.attrs, "num_embeddings": rows})]


def dropout(f: LocalForm) -> list[Value]:
    """A training dropout of a split tensor: the rank's piece with its origin (the global index
    of its first element along each dim), so it draws the unsplit dropout's mask for its
    elements. The global shape is the real one (padding left out): a padded element hashes
    some real element's index, and padding is thrown away."""
    x = f.operands[0]
    labels = [f"d{i}" for i in range(x.type.rank)]
    starts = [f.emit("unsqueeze", f.start(lab, x.type.shape[i]), axes=(0,)) if lab in f.split
              else f.emit("full", shape=(1,), value=0, dtype=i64) for i, lab in enumerate(labels)]
    origin = starts[0] if len(starts) == 1 else f.emit("concat", *starts, axis=0)
    if len(f.operands) > 1:
        # Already a piece (at origin, of a tensor of shape whole): a piece of the piece.
        return [f.emit("dropout", x, f.emit("add", f.operands[1], origin), **f.attrs)]
    whole = tuple(f.real_size(0, d) for d in range(x.type.rank))
    return [f.emit("dropout", x, origin, **{**f.attrs, "whole": whole})]


def _log_sum_exp(f: LocalForm, logits: Value, cdim: int) -> tuple[Value, Value]:
    """``(z, m)``: the logits shifted by the global max over the classes (keepdim), and that
    max; the shift keeps exp finite, as log_softmax's own does."""
    m = f.all_reduce(f.emit("max", logits, axes=(cdim,), keepdim=True), "c", "max")
    return f.emit("sub", logits, m), m


def _class_dim(t: TensorType) -> int:
    return 1 if t.rank >= 2 else 0


def cross_entropy(f: LocalForm) -> list[Value]:
    """cross_entropy over logits split along the classes: per target, log(sum exp z) - z[t]
    with z = logits - max, both sums completed by one all_reduce (and the max by another)."""
    logits, target = f.operands
    a = f.attrs
    cdim = _class_dim(logits.type)
    width = logits.type.shape[cdim]
    classes = f.real_size(0, cdim)
    dt = logits.type.dtype
    z, m = _log_sum_exp(f, logits, cdim)
    safe, inside = f.in_range(target, "c", width, whole=classes, ignored=a["ignore_index"])
    picked = f.emit("gather", z, f.emit("unsqueeze", safe, axes=(cdim,)), axis=cdim)
    picked = f.emit("where", f.emit("unsqueeze", inside, axes=(cdim,)), picked, f.scalar(0.0, dt))
    # One collective for every sum the loss needs: sum exp z, z[t], and sum z for smoothing.
    parts = [f.emit("sum", f.emit("exp", z), axes=(cdim,), keepdim=True), picked]
    ls = a["label_smoothing"]
    if ls > 0.0:
        parts.append(f.emit("sum", z, axes=(cdim,), keepdim=True))
    sums = f.all_reduce(f.emit("concat", *parts, axis=cdim), "c")
    pieces = f.b.emit_node("split", [sums], {"axis": cdim, "sizes": (1,) * len(parts)}, loc=f.loc).results
    f.memo[("softmax", logits, f.split["c"])] = (m, pieces[0])
    lse = f.emit("log", pieces[0])
    loss = f.emit("sub", lse, pieces[1])
    if ls > 0.0:
        smooth = f.emit("sub", lse, f.emit("div", pieces[2], f.scalar(float(classes), dt)))
        loss = f.emit("add", f.emit("mul", loss, f.scalar(1.0 - ls, dt)), f.emit("mul", smooth, f.scalar(ls, dt)))
    loss = f.emit("squeeze", loss, axes=(cdim,))
    ignored = f.emit("equal", target, f.scalar(a["ignore_index"], target.type.dtype))
    loss = f.emit("where", ignored, f.scalar(0.0, dt), loss)
    red = a["reduction"]
    if red == "none":
        return [loss]
    total = f.emit("sum", loss)
    if red == "sum":
        return [total]
    # Ignored targets count neither in the sum nor in the divisor, as in the op itself.
    count = f.emit("sum", f.emit("cast", f.emit("logical_not", ignored), dtype=dt))
    return [f.emit("div", total, count)]


def cross_entropy_grad(f: LocalForm) -> list[Value]:
    """dlogits over logits split along the classes: (softmax - (1-e) onehot - e/C) * scale,
    with softmax's denominator all-reduced and the one-hot set where the target is local."""
    dloss, logits, target = f.operands
    a = f.attrs
    cdim = _class_dim(logits.type)
    width = logits.type.shape[cdim]
    classes = f.real_size(1, cdim)
    dt = logits.type.dtype
    ls = a["label_smoothing"]
    known = f.memo.get(("softmax", logits, f.split["c"]))
    if known is not None:
        # The forward's loss on these logits already all-reduced the max and the sum of the
        # exponentials: the softmax is one local pass, with no collective.
        m, total = known
        e = f.emit("exp", f.emit("sub", logits, m))
    else:
        z, _ = _log_sum_exp(f, logits, cdim)
        e = f.emit("exp", z)
        total = f.all_reduce(f.emit("sum", e, axes=(cdim,), keepdim=True), "c")
    g = f.emit("div", e, total)
    if ls > 0.0:
        g = f.emit("sub", g, f.scalar(ls / classes, dt))
    lo = f.start("c", width)
    tdt = target.type.dtype
    local = f.emit("sub", target, lo if tdt is i64 else f.emit("cast", lo, dtype=tdt))
    # A position along the class dim only; the comparison broadcasts it over the rest.
    shape = (1,) * cdim + (width,) + (1,) * (logits.type.rank - cdim - 1)
    positions = f.emit("iota", shape=shape, axis=cdim, dtype=tdt)
    onehot = f.emit("cast", f.emit("equal", positions, f.emit("unsqueeze", local, axes=(cdim,))), dtype=dt)
    g = f.emit("sub", g, onehot if ls == 0.0 else f.emit("mul", onehot, f.scalar(1.0 - ls, dt)))
    ignored = f.emit("equal", target, f.scalar(a["ignore_index"], tdt))
    red = a["reduction"]
    scale = dloss
    if red == "mean":
        count = f.emit("sum", f.emit("cast", f.emit("logical_not", ignored), dtype=dt))
        scale = f.emit("div", dloss, count)
    scale = f.emit("where", ignored, f.scalar(0.0, dt), scale)
    if scale.type.shape != target.type.shape:
        scale = f.emit("broadcast_to", scale, shape=target.type.shape)
    return [f.emit("mul", g, f.emit("unsqueeze", scale, axes=(cdim,)))]


def embedding_grad_rows(graph: Graph, mesh: Mesh,
                        replaced: Callable[[Value, Value, list[Node], list[Node]], None] | None = None
                        ) -> list[Value]:
    """In a per-rank program, compute a vocab-parallel table's gradient for the rank's rows
    only: ``shard_slice(embedding_grad(dy, idx), dim 0)``, where the whole table's gradient
    is made on every rank to keep one piece, becomes ``embedding_grad`` of ``dy`` masked to
    the indices in the rank's range, with those indices shifted to its rows. Returns the
    results of the shard_slices it replaced; ``replaced(old value, new value, old nodes, new
    nodes)`` is told of each replacement (the partition keeps its value map and the nodes
    made for each global node, which a pipeline's sections are read from)."""
    done: list[Value] = []
    for node in list(graph.nodes):
        if node.op != "shard_slice" or node.attrs["dim"] != 0:
            continue
        src = node.operands[0].producer
        if src is None or src.op != "embedding_grad" or src.results[0].num_uses != 1:
            continue
        dy, idx = src.operands
        rows = node.results[0].type.shape[0]
        before = node.prev
        f = LocalForm(Builder(graph).set_insertion_before(node), [], {}, [], {"v": (node.attrs["axis"],)}, mesh,
                      "", src.loc)
        safe, inside = f.in_range(idx, "v", rows)
        masked = f.emit("where", f.emit("unsqueeze", inside, axes=(idx.type.rank,)), dy, f.scalar(0.0, dy.type.dtype))
        new = f.emit("embedding_grad", masked, safe, num_embeddings=rows)
        new.name = node.results[0].name
        made: list[Node] = []
        n = before.next if before is not None else graph.first
        while n is not None and n is not node:
            made.append(n)
            n = n.next
        graph.replace_all_uses(node.results[0], new)
        graph.erase(node)
        graph.erase(src)
        if replaced is not None:
            replaced(node.results[0], new, [src, node], made)
        done.append(node.results[0])
    return done


__all__ = ["LocalForm", "embedding", "embedding_grad", "cross_entropy", "cross_entropy_grad", "embedding_grad_rows"]
