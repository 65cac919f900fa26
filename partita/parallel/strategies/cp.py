"""``cp``: context parallelism, the sequence of the activations split over the ``cp`` axis.

Each of the ``cp`` ranks holds ``S / cp`` tokens of every sequence: everything token-local
(embeddings, projections, norms, the MLP, the loss per token) runs on the rank's tokens only,
and attention, which needs every key and value, all-gathers ``k`` and ``v`` over ``cp``
before it (their gradients are reduce-scattered back in the backward), as Llama 3 trains
its long-context stage. Of grouped-query attention, whose k and v are a repeat of fewer
heads (any chain of views), the k/v heads are gathered and the repeat replayed after, and the
repeated heads' gradients are summed onto them before the reduce-scatter (``cp-ring`` passes
the k/v heads and their folded gradients around the ring likewise).

The causal load is balanced as Llama 3 does: the sequence is cut into ``2 * cp`` chunks and
rank ``i`` holds chunks ``i`` and ``2*cp-1-i`` (one early, one late), so every rank scores
the same number of (query, key) pairs. The batch inputs (ids, targets) come to each rank
whole along the sequence and are permuted there where first read (an ``index_select`` of
the rank's positions); an ``iota`` of the sequence length looked up as indices (a learned
position table) is the rank's positions from the start. Any other value made from positions
alone (a rotary cos/sin table, a constant, a mask built from shapes), whole along the
sequence, takes the rows of the rank's positions where it meets the rank's tokens, and so
does one a pipeline stage sends to the next (``token_dim``: both ends cut the same dim). Attention then runs on the gathered (permuted) keys with an
explicit mask ``key position <= query position`` built from the original positions, which
is exactly the causal attention of one device. The attention and its backward are marked
``causal_cp=cp`` (the semantics ignore it): the cost prices a rank at the pairs this mask
keeps, as a flash kernel run on each query chunk against the keys up to it (Llama 3's).

``cp-ring`` splits the sequence the same way and runs ring attention instead: ``cp`` steps,
in each the rank's queries attend to the block of keys and values it holds (its own first),
then every rank hands its block to the next rank (``ring_shift``); each block's (out, lse)
is folded into the running result by their log-sum-exp. The backward goes around the ring
again: each block's ``attention_grad`` from the final (out, lse) gives the rank's share of
dq and of the block's dk and dv, which travel with their block and are handed home at the
end. No rank holds more than one block of keys at a time.

The rewrite is a pass on the per-rank program (``context-parallel``), after the other
strategies' partition, so it composes with ``dp``/``zero*`` (batch split on dim 0),
``megatron`` (heads and weights split over ``tp``) and ``pp`` (each stage's program; its
sends and receives carry the rank's tokens): their per-rank program is an ordinary graph
whose sequence dim it shrinks. It keeps the identity of the nodes and values it rewrites
(the pipeline tracks a stage program's values through it). Values that sum over tokens
(weight gradients, the loss) are all-reduced over ``cp`` where they are made; the mean loss
and its gradient are scaled by ``1/cp``. Every collective it inserts is listed in the plan
(``plan.collectives``, with its reason) and counted in its notes.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ...ir.builder import Builder
from ...ir.dtypes import i64
from ...ir.graph import Graph, Node, Value
from ...ir.printer import value_names
from ...ops.registry import OPS
from .base import AnnotationContext, Strategy, StrategyError, register

if TYPE_CHECKING:
    from ...passes.manager import Pass

# Ops whose results keep the seq dim of their first operand where the result has that dim
# with the same size (norms, activations and their backward ops, dropout, softmax...).
_ROW_OPS = frozenset({"layer_norm", "rms_norm", "gelu", "silu", "relu", "softmax", "log_softmax", "dropout",
                      "gelu_grad", "silu_grad", "relu_grad", "softmax_grad", "log_softmax_grad", "cast", "slice",
                      "split", "concat", "all_reduce", "layer_norm_grad", "rms_norm_grad", "tanh", "neg", "exp",
                      "where", "max", "min"})
# Ops whose results that lack the seq dim sum over the tokens (a partial sum over cp).
_TOKEN_SUMS = frozenset({"layer_norm_grad", "rms_norm_grad", "embedding_grad", "sum"})

# Ops that only view or repeat their operand (the spellings of a repeat of k/v heads).
_VIEWS = frozenset({"reshape", "broadcast_to", "unsqueeze", "squeeze"})


def reshaped_dim(old_in: Sequence[int], old_out: Sequence[int], d: int, inner: int,
                 seq: int) -> tuple[int, int] | None:
    """The (dim, inner stride) of the sequence in a reshape's result whose operand has it at
    ``d`` with inner stride ``inner``; None when the reshape splits the sequence."""
    stride = inner * math.prod(old_in[d + 1:])
    for k in range(len(old_out)):
        below = math.prod(old_out[k + 1:])
        if below <= stride and stride % below == 0 and stride * seq <= below * old_out[k] \
                and (old_out[k] * below) % (stride * seq) == 0:
            return k, stride // below
    return None


def balanced_positions(seq: int, cp: int) -> np.ndarray:
    """The original positions each cp rank holds, ``[cp, seq // cp]``: chunks ``i`` and
    ``2*cp-1-i`` of ``2*cp`` equal chunks, in that order."""
    c = seq // (2 * cp)
    rows = [np.concatenate([np.arange(i * c, (i + 1) * c), np.arange((2 * cp - 1 - i) * c, (2 * cp - i) * c)])
            for i in range(cp)]
    return np.stack(rows).astype(np.int64)


class ContextParallel(Strategy):
    """The sequence split over ``cp``, K/V all-gathered for attention, causal load balanced."""

    name = "cp"
    aliases: tuple[str, ...] = ("context-parallel",)
    axis = "cp"
    exclusive = "context-parallel"
    order = 60
    ring = False
    listed_apart = "for long sequences"

    def annotate(self, ctx: AnnotationContext) -> None:
        """Check the sequence and the attention; nothing is placed (the pass does the split)."""
        axis = ctx.axis(self)
        cp = ctx.mesh.axis_size(axis)
        g = ctx.graph
        batch = [v for v in g.inputs if v.role == "input" and v.type.rank >= 2]
        if not batch:
            raise StrategyError(f"strategy cp: @{g.name} has no 'input'-role graph input with a sequence dim "
                                "(dim 1 of [batch, seq, ...]); context parallelism splits the sequence of the "
                                "batch inputs (token ids, targets)")
        seq = batch[0].type.shape[1]
        for v in batch:
            if v.type.shape[1] != seq:
                raise StrategyError(f"strategy cp: the batch inputs disagree on the sequence length (dim 1): "
                                    f"%{ctx.name(batch[0])} {batch[0].type} and %{ctx.name(v)} {v.type}")
        if seq % (2 * cp):
            raise StrategyError(f"strategy cp: the sequence length {seq} (dim 1 of %{ctx.name(batch[0])} "
                                f"{batch[0].type}) is not a multiple of 2 x cp = {2 * cp} (the balanced split gives "
                                f"each of the {cp} cp ranks two chunks); use a sequence that is a multiple of "
                                f"{2 * cp} or a smaller '{axis}' axis")
        if not any(n.op == "attention" for n in g.nodes):
            raise StrategyError(f"strategy cp: @{g.name} has no fused 'attention' op; context parallelism gathers "
                                "the keys and values of attention (build the model with attention='fused')")
        if "sp" in ctx.strategy:
            raise StrategyError("strategy cp: cp with sp (sequence parallelism over tp) is not supported; "
                                "use cp with megatron alone")
        ctx.shared["cp"] = {"axis": axis, "size": cp, "seq": seq, "ring": self.ring}
        how = f"attention passes k and v around the '{axis}' ring ({cp - 1} steps)" if self.ring else \
            f"attention all-gathers k and v over '{axis}'"
        ctx.notes.append(f"{self.name}: the sequence ({seq} tokens) split over '{axis}' ({cp} ranks, {seq // cp} "
                         f"tokens each, chunks i and {2 * cp - 1}-i of {2 * cp}); {how}")

    def passes(self, ctx: AnnotationContext) -> "Sequence[Pass]":
        """The rewrite of the per-rank program to the rank's tokens."""
        from ...passes.manager import Pass

        info = ctx.shared["cp"]

        class ContextParallelPass(Pass):
            name = "context-parallel"

            def run(self, graph: Graph) -> Graph:
                """Shrink the sequence of ``graph`` to this rank's tokens."""
                rw = SeqRewrite(graph, info["axis"], info["size"], info["seq"], ctx.notes, info["ring"])
                rw.run()
                ctx.shared.setdefault("pass_collectives", []).extend(rw.entries)
                return graph

        return (ContextParallelPass(),)


class RingContextParallel(ContextParallel):
    """``cp-ring``: the sequence split over cp as ``cp`` splits it, attention by ring
    attention (K/V blocks passed around the cp ring, partial results folded by their
    log-sum-exp) instead of an all-gather of K and V."""

    name = "cp-ring"
    aliases: tuple[str, ...] = ()
    ring = True


class SeqRewrite:
    """The per-rank program shrunk to one cp rank's tokens, rewritten in place."""

    def __init__(self, graph: Graph, axis: str, cp: int, seq: int, notes: list[str], ring: bool = False) -> None:
        self.g, self.axis, self.cp, self.seq, self.notes, self.ring = graph, axis, cp, seq, notes, ring
        self.b = Builder(graph)
        self.env: dict[Value, Value] = {}
        self.dim: dict[Value, tuple[int, int]] = {}  # new value -> (seq dim, inner stride)
        self.kv: dict[Value, Value] = {}  # a local k or v -> its gathered copy
        self.why: dict[str, int] = {}
        self.pos: Value | None = None
        self.kpos: Value | None = None
        self.mask: Value | None = None
        self.made: dict[Node, Node] = {}  # an old node -> the node emitted in its place
        self.rank: Value | None = None
        # The collectives inserted, as the plan lists them (PlanReport.collectives entries).
        self.entries: list[dict[str, Any]] = []
        self.current: Node | None = None
        self.names: dict[Value, str] = {}
        self.phase = "forward"
        self.blocks: dict[int, tuple[Value, Value]] = {}  # ring step -> (mask, rows with a key)
        self.tokens: set[Value] = set()  # the batch inputs ([batch, seq, ...])
        self.pieced: dict[Value, str] = {}  # a value reduce-scattered along the sequence -> the axis
        # an old node made already -> what its result stands for and its sequence dim
        self.skip: dict[Node, tuple[Value, tuple[int, int]] | None] = {}
        self.positional: dict[Value, bool] = {}  # an old value -> whether it depends on positions alone
        self.rows_taken: dict[tuple[Value, int], Value] = {}  # (value, dim) -> this rank's rows of it

    # --- helpers -------------------------------------------------------------------------
    def emit(self, op: str, *operands: Value, **attrs: Any) -> Value:
        return self.b.emit(op, *operands, **attrs)

    def coll(self, kind: str, x: Value, why: str, **attrs: Any) -> Value:
        """A collective over cp, counted under its reason for the plan's notes and listed
        with it among the plan's collectives."""
        key = f"{kind} over {self.axis}: {why}"
        self.why[key] = self.why.get(key, 0) + 1
        y = self.b.emit(kind, x, axis=self.axis, group_size=self.cp, **attrs)
        n = self.current
        assert n is not None
        res = ", ".join(f"%{self.names.get(r, '?')}" for r in n.results)
        cost = OPS[kind].cost([x.type], [y.type], y.producer.attrs if y.producer is not None else attrs)
        self.entries.append({"op": kind, "axis": self.axis, "value": self.names.get(x, str(x.name or "?")),
                             "consumer": f"{res + ' = ' if res else ''}{n.op} ({self.axis}: {why})",
                             "operand": None, "have": "", "want": "", "bytes": int(cost.bytes_written),
                             "phase": self.phase, "inside": True, "source": str(n.loc) if n.loc else None})
        return y

    def rank_row(self, table: np.ndarray) -> Value:
        """Row ``r`` of the constant ``table`` on cp rank ``r`` (``table[r]``)."""
        from ...ir.attrs import DenseAttr

        if self.rank is None:
            self.rank = self.emit("reshape", self.emit("axis_index", axis=self.axis, group_size=self.cp), shape=(1,))
        row = self.emit("index_select", self.emit("constant", value=DenseAttr(table)), self.rank, axis=0)
        return self.emit("reshape", row, shape=table.shape[1:])

    def positions(self) -> Value:
        """This rank's original positions, i64 ``[S/cp]`` (made once, where first read)."""
        if self.pos is None:
            from ...ir.attrs import DenseAttr

            table = balanced_positions(self.seq, self.cp)
            self.pos = self.rank_row(table)
            self.kpos = self.emit("constant", value=DenseAttr(table.reshape(-1)))
        return self.pos

    def ring_block(self, j: int) -> tuple[Value, Value]:
        """Ring step ``j``'s causal mask ``[S/cp, S/cp]`` (the rank holds the keys of rank
        ``r - j``) and which of its query rows keep a key at all, bool ``[S/cp]``."""
        if j not in self.blocks:
            table = balanced_positions(self.seq, self.cp)
            held = np.roll(table, j, axis=0)  # row r: the key positions rank r holds at step j
            n = self.seq // self.cp
            any_key = (held.min(axis=1, keepdims=True) <= table)
            k = self.emit("reshape", self.rank_row(held), shape=(1, n))
            q = self.emit("reshape", self.positions(), shape=(n, 1))
            self.blocks[j] = (self.emit("less_equal", k, q), self.rank_row(any_key))
        return self.blocks[j]

    def causal_mask(self) -> Value:
        """``[S/cp, S]`` bool: key position <= query position, keys in the gathered order."""
        if self.mask is None:
            q = self.emit("reshape", self.positions(), shape=(self.seq // self.cp, 1))
            assert self.kpos is not None
            k = self.emit("reshape", self.kpos, shape=(1, self.seq))
            self.mask = self.emit("less_equal", k, q)
        return self.mask

    # --- the walk ------------------------------------------------------------------------
    def run(self) -> None:
        """Rewrite every node; the old ones are erased at the end."""
        g = self.g
        old = list(g.nodes)
        first = old[0] if old else None
        if first is not None:
            self.b.set_insertion_before(first)
        # The batch inputs are permuted where they are first read (so that a pipeline template
        # section that reads them makes them, and the positions, for itself).
        self.tokens = {v for v in g.inputs if v.role == "input" and v.type.rank >= 2 and v.type.shape[1] == self.seq}
        from ...autodiff.recompute import backward_start

        start = backward_start(g)
        self.names = value_names(g)
        for node in old:
            if node is start:
                self.phase = "backward"
            self.current = node
            self.b.set_insertion_before(node)
            self.node(node)
        outs = [self.env.get(v, v) for v in g.outputs]
        g.set_outputs(outs, g.output_aliases)
        results = {node: list(node.results) for node in old}
        for node in reversed(old):
            g.erase(node)
        self.keep_identity(results)
        for why, n in self.why.items():
            self.notes.append(f"cp collective x{n}: {why}")

    def get(self, v: Value) -> Value:
        """The value standing for ``v`` in the rewritten program (a batch input: its rank's
        tokens, permuted here at its first reading)."""
        if v in self.tokens and v not in self.env:
            nv = self.emit("index_select", v, self.positions(), axis=1)
            self.env[v], self.dim[nv] = nv, (1, 1)
        return self.env.get(v, v)

    def node(self, node: Node) -> None:
        """Emit this rank's version of ``node`` and map its results."""
        if node in self.skip:
            done = self.skip[node]
            if done is not None:
                self.bind(node, [done[0]], [done[1]])
            return
        ins = [self.get(v) for v in node.operands]
        seqd = [self.dim.get(v) for v in ins]
        op, attrs = node.op, dict(node.attrs)
        if op == "iota" and tuple(attrs["shape"]) == (self.seq,) and self.indexes(node.results[0]):
            p = self.positions()
            nv = p if attrs["dtype"] == i64 else self.emit("cast", p, dtype=attrs["dtype"])
            self.bind(node, [nv], [(0, 1)])
            return
        if op == "recv" and self.token_dim(node) is not None:
            k = self.token_dim(node)
            assert k is not None
            attrs["shape"] = self.local_shape(attrs["shape"], k)
            self.bind(node, self.emit_like(node, ins, attrs), [(k, 1)])
            return
        if op == "send":
            self.op_send(node, ins, seqd, attrs)
            return
        if all(d is None for d in seqd) and op not in ("attention", "attention_grad"):
            self.bind(node, self.emit_like(node, ins, attrs), [None] * len(node.results))
            return
        if any(v in self.pieced for v in ins):
            self.op_piece(node, ins, seqd, attrs)
            return
        handler = getattr(self, "op_" + op, None)
        if handler is not None:
            handler(node, ins, seqd, attrs)
        elif OPS[op].elementwise or op in ("where",):
            self.op_broadcast(node, ins, seqd, attrs)
        elif op in _ROW_OPS or op in _TOKEN_SUMS:
            self.op_rows(node, ins, seqd, attrs)
        else:
            raise StrategyError(f"strategy cp: the op {op} of the per-rank program reads a value split along the "
                                f"sequence ({', '.join(str(v.type) for v in ins)}) and cp has no rule for it")

    def token_dim(self, node: Node) -> int | None:
        """The sequence dim of what a pipeline send or recv carries between stages: a
        microbatch's activations or gradients (``[batch, seq, ...]``) or a position table made
        from the sequence (``[1, 1, seq, head_dim]``, a rotary cos/sin): the first dim of the
        sequence's length, dim 1 first (dim 0 last, the batch); None when no dim has it. Both
        ends of a transfer take the same dim (the send checks that its value is split there)."""
        shape = node.attrs["shape"] if node.op == "recv" else node.operands[0].type.shape
        if re.match(r"(activation|gradient) \d", node.attrs.get("tag", "")) is None or len(shape) < 2:
            return None
        for k in [*range(1, len(shape)), 0]:
            if shape[k] == self.seq:
                return k
        return None

    @staticmethod
    def indexes(v: Value) -> bool:
        """Whether ``v`` (an iota as long as the sequence) is looked up as indices (a learned
        position table's rows, through casts and reshapes): then it is the rank's positions
        from the start. Any other iota of that length (a rotary table's positions, or a
        frequency index that happens to be as long) stays whole; where a value made from it
        meets the rank's tokens it takes the rank's rows (``own_rows``)."""
        todo, seen = [v], set()
        while todo:
            x = todo.pop()
            for u in x.users:
                if u.op in ("embedding", "gather", "index_select") and x is not u.operands[0]:
                    return True
                if u.op in ("cast", "reshape", "unsqueeze", "squeeze", "broadcast_to") and u not in seen:
                    seen.add(u)
                    todo.extend(u.results)
        return False

    def position_only(self, v: Value) -> bool:
        """Whether ``v`` depends on positions alone: computed from constants, ``iota``s and
        ``full``s, no graph input or received value in its making (a rotary table, a mask
        built from shapes)."""
        known = self.positional
        todo = [v]
        while todo:
            x = todo[-1]
            if x in known:
                todo.pop()
                continue
            p = x.producer
            if p is None or p.op == "axis_index" or self.has_effects(p):
                known[x] = False
                todo.pop()
                continue
            pending = [o for o in p.operands if o not in known]
            if pending:
                todo.extend(pending)
                continue
            known[x] = all(known[o] for o in p.operands)
            todo.pop()
        return known[v]

    @staticmethod
    def has_effects(node: Node) -> bool:
        """Whether ``node`` communicates, draws random numbers or does io (a recv, a dropout mask)."""
        e = OPS[node.op].effects
        return bool(e(node.attrs) if callable(e) else e)

    def own_rows(self, new: Value, k: int) -> Value:
        """The rows of this rank's positions (its two chunks) of a position-only value whole
        along the sequence dim ``k``: ``index_select`` of the rank's positions."""
        key = (new, k)
        if key not in self.rows_taken:
            self.rows_taken[key] = self.emit("index_select", new, self.positions(), axis=k)
            self.dim[self.rows_taken[key]] = (k, 1)
        return self.rows_taken[key]

    def keep_identity(self, results: dict[Node, list[Value]]) -> None:
        """Give the rewritten program the old nodes and values back (erased, with their old
        ``results``): each old node takes the place of the node emitted for it, and each old
        value that of the value it was mapped to, so that what refers to the per-rank program
        from outside (the pipeline's tracking of its stage program) stays valid."""
        g = self.g
        for o, n in self.made.items():
            o.op, o.attrs, o.loc, o.operands = n.op, n.attrs, n.loc, list(n.operands)
            o.results, n.results = n.results, []
            for r in o.results:
                r.producer = o
            g.insert_before(n, o)
            g.erase(n)
        taken: set[Value] = set()
        for rs in results.values():
            for r in rs:
                nv = self.env.get(r)
                if nv is None or nv is r or nv.producer is None or nv in taken or nv.graph is not g:
                    continue
                taken.add(nv)
                p = nv.producer
                r.type, r.producer, r.index, r.graph = nv.type, p, nv.index, g
                r.name = r.name if r.name is not None else nv.name
                p.results[nv.index] = r
                g.replace_all_uses(nv, r)
                nv.graph = None

    def emit_like(self, node: Node, ins: list[Value], attrs: dict) -> list[Value]:
        n = self.b.emit_node(node.op, ins, attrs, loc=node.loc)
        self.made.setdefault(node, n)
        for a, b in zip(n.results, node.results):
            a.name = b.name
        return list(n.results)

    def bind_one(self, old: Value, nv: Value, d: tuple[int, int] | None) -> None:
        """Map the old value ``old`` to ``nv``, split along ``d`` (None: whole)."""
        self.env[old] = nv
        if d is not None:
            self.dim[nv] = d

    def bind(self, node: Node, new: list[Value], dims: list[tuple[int, int] | None]) -> None:
        for old, nv, d in zip(node.results, new, dims):
            self.env[old] = nv
            if d is not None:
                self.dim[nv] = d

    def reduced(self, v: Value, what: str) -> Value:
        """A partial sum over cp all-reduced (float values; others are left alone)."""
        if not v.type.dtype.is_float:
            return v
        return self.coll("all_reduce", v, f"{what} sums over the tokens of every cp rank", op="sum")

    def scale(self, v: Value) -> Value:
        return self.emit("mul", v, self.emit("full", shape=(), value=1.0 / self.cp, dtype=v.type.dtype))

    # --- rules ---------------------------------------------------------------------------
    def local_shape(self, shape: Sequence[int], d: int) -> tuple[int, ...]:
        s = list(shape)
        if s[d] % self.cp:
            raise StrategyError(f"strategy cp: dim {d} of {tuple(shape)} holds the sequence but cp={self.cp} does "
                                "not divide it")
        s[d] //= self.cp
        return tuple(s)

    def op_broadcast(self, node: Node, ins, seqd, attrs) -> None:
        r = node.results[0].type.rank
        out = None
        for v, d, o in zip(ins, seqd, node.operands):
            if d is not None:
                nd = (r - v.type.rank + d[0], d[1])
                if out is not None and out != nd:
                    raise StrategyError(f"strategy cp: {node.op} combines operands split along different dims")
                out = nd
        assert out is not None
        for i, (v, d, o) in enumerate(zip(ins, seqd, node.operands)):
            k = out[0] - (r - o.type.rank)
            if d is None and 0 <= k < o.type.rank and o.type.shape[k] != 1:
                if o.type.shape[k] == self.seq and out[1] == 1 and self.position_only(o):
                    ins[i] = self.own_rows(v, k)
                    continue
                raise StrategyError(f"strategy cp: {node.op} reads {o.type}, which is whole along the sequence "
                                    f"dim {k}, with a value split along it; cp cannot split it (it takes the rows of "
                                    "its positions only of a value made from positions alone: constants, iota)")
        self.bind(node, self.emit_like(node, ins, attrs), [out] * len(node.results))

    def op_rows(self, node: Node, ins, seqd, attrs) -> None:
        d = next(x for x in seqd if x is not None)
        src = next(v for v, x in zip(node.operands, seqd) if x is not None)
        for key in ("axis", "axes"):
            a = attrs.get(key)
            if a is None:
                continue
            axes = [a] if isinstance(a, int) else [x for x in a if isinstance(x, int)] if isinstance(a, (list, tuple)) \
                else []
            if any(x % src.type.rank == d[0] for x in axes) and node.op not in ("sum",):
                raise StrategyError(f"strategy cp: {node.op} works along the sequence dim of {src.type}")
        if node.op == "sum":
            axes = [x % src.type.rank for x in (attrs["axes"] or range(src.type.rank))]
            if d[0] in axes:
                nv = self.emit_like(node, ins, attrs)[0]
                self.bind(node, [self.reduced(nv, "sum")], [None])
                return
            keep = attrs.get("keepdim")
            nd = d[0] if keep else d[0] - sum(1 for x in axes if x < d[0])
            self.bind(node, self.emit_like(node, ins, attrs), [(nd, d[1])])
            return
        if node.op == "slice_grad":
            pass
        new = self.emit_like(node, ins, attrs)
        dims: list[tuple[int, int] | None] = []
        outs: list[Value] = []
        for o, nv in zip(node.results, new):
            if o.type.rank > d[0] and o.type.shape[d[0]] == src.type.shape[d[0]]:
                dims.append(d)
                outs.append(nv)
            elif node.op in _TOKEN_SUMS:
                dims.append(None)
                outs.append(self.reduced(nv, f"{node.op}'s gradient of a weight"))
            else:
                raise StrategyError(f"strategy cp: {node.op} drops the sequence dim of {src.type}")
        self.bind(node, outs, dims)

    def op_piece(self, node: Node, ins, seqd, attrs) -> None:
        """A value reduce-scattered along the sequence (``pieced``) goes through an all_reduce
        or a cast whole, and back together by the all_gather of its axis."""
        axis = next(self.pieced[v] for v in ins if v in self.pieced)
        if node.op == "all_gather":
            self.op_all_gather(node, ins, seqd, attrs)
            return
        if node.op not in ("all_reduce", "cast") or len(ins) != 1:
            raise StrategyError(f"strategy cp: {node.op} reads {node.operands[0].type}, reduce-scattered over '{axis}' "
                                "along the sequence dim; cp follows such a value only through an all_reduce or a "
                                f"cast to the all_gather over '{axis}' that puts it back together")
        new = self.emit_like(node, ins, attrs)
        self.pieced[new[0]] = axis
        self.bind(node, new, [seqd[0]])

    def op_send(self, node: Node, ins, seqd, attrs) -> None:
        """A pipeline send: of this rank's tokens where it carries a sequence dim (the peer's
        recv takes the same piece, ``token_dim``), a position-only value whole along it cut
        to this rank's rows first."""
        k, d = self.token_dim(node), seqd[0]
        src = node.operands[0]
        if k is not None and d is None and self.position_only(src):
            ins = [self.own_rows(ins[0], k), *ins[1:]]
        elif d != (None if k is None else (k, 1)):
            held = "whole" if d is None else f"split along dim {d[0]}" + (f" (stride {d[1]})" if d[1] != 1 else "")
            want = "whole" if k is None else f"split along dim {k}"
            raise StrategyError(f"strategy cp: the pipeline sends {src.type} ({node.attrs.get('tag', '')}) {held}, "
                                f"but its receiver takes it {want} (the first dim of the sequence's length {self.seq}); "
                                "cp splits only token values and position tables passed between stages")
        self.emit_like(node, ins, attrs)

    def op_all_gather(self, node: Node, ins, seqd, attrs) -> None:
        """A collective of another axis along another dim (a pipeline's microbatch gathered
        over dp) keeps the sequence split. Along the sequence dim, a reduce_scatter cuts the
        rank's tokens into pieces (``pieced``: zero2's scatter of a position table's gradient
        over dp) and the all_gather of the same axis puts them back together; nothing else
        may read a piece."""
        (d, inner), = seqd
        x = ins[0]
        if attrs["dim"] % x.type.rank == d:
            whole = node.op == "reduce_scatter" and x not in self.pieced
            back = node.op == "all_gather" and self.pieced.get(x) == attrs["axis"]
            if inner != 1 or not (whole or back):
                raise StrategyError(f"strategy cp: {node.op} over '{attrs['axis']}' works along the sequence dim of "
                                    f"{node.operands[0].type}")
            new = self.emit_like(node, ins, attrs)
            if whole:
                self.pieced[new[0]] = attrs["axis"]
            self.bind(node, new, [(d, inner)])
            return
        self.bind(node, self.emit_like(node, ins, attrs), [(d, inner)])

    op_reduce_scatter = op_all_gather
    op_shard_slice = op_all_gather  # a replicated value cut over another axis (dp's microbatch rows)

    def op_all_to_all(self, node: Node, ins, seqd, attrs) -> None:
        """An all_to_all of another axis (zero1's gathered microbatch gradient) that splits
        and joins other dims keeps the sequence split."""
        (d, inner), = seqd
        r = ins[0].type.rank
        if d in (attrs["split_dim"] % r, attrs["concat_dim"] % r):
            raise StrategyError(f"strategy cp: all_to_all over '{attrs['axis']}' works along the sequence dim of "
                                f"{node.operands[0].type}")
        self.bind(node, self.emit_like(node, ins, attrs), [(d, inner)])

    def op_embedding_grad(self, node: Node, ins, seqd, attrs) -> None:
        nv = self.emit_like(node, ins, attrs)[0]
        self.bind(node, [self.reduced(nv, "embedding_grad")], [None])

    def op_gather(self, node: Node, ins, seqd, attrs) -> None:
        d = seqd[1] or seqd[0]
        assert d is not None
        if d[0] == attrs["axis"] % node.operands[0].type.rank:
            raise StrategyError(f"strategy cp: gather along the sequence dim of {node.operands[0].type}")
        self.bind(node, self.emit_like(node, ins, attrs), [d])

    def op_embedding(self, node: Node, ins, seqd, attrs) -> None:
        d = seqd[1]
        assert d is not None and seqd[0] is None
        self.bind(node, self.emit_like(node, ins, attrs), [d])

    def op_reshape(self, node: Node, ins, seqd, attrs) -> None:
        (d, inner), = seqd
        old_in, old_out = node.operands[0].type.shape, node.results[0].type.shape
        found = reshaped_dim(old_in, old_out, d, inner, self.seq)
        if found is not None:
            attrs["shape"] = self.local_shape(old_out, found[0])
            self.bind(node, self.emit_like(node, ins, attrs), [found])
            return
        raise StrategyError(f"strategy cp: reshape {old_in} -> {old_out} splits the sequence dim {d}")

    def op_broadcast_to(self, node: Node, ins, seqd, attrs) -> None:
        (d, inner), = seqd
        r = len(attrs["shape"])
        nd = r - ins[0].type.rank + d
        attrs["shape"] = self.local_shape(node.results[0].type.shape, nd)
        self.bind(node, self.emit_like(node, ins, attrs), [(nd, inner)])

    def op_slice_grad(self, node: Node, ins, seqd, attrs) -> None:
        (d, inner), = seqd
        attrs["shape"] = self.local_shape(attrs["shape"], d)
        self.bind(node, self.emit_like(node, ins, attrs), [(d, inner)])

    def op_transpose(self, node: Node, ins, seqd, attrs) -> None:
        (d, inner), = seqd
        perm = list(attrs["perm"])
        self.bind(node, self.emit_like(node, ins, attrs), [(perm.index(d), inner)])

    def op_unsqueeze(self, node: Node, ins, seqd, attrs) -> None:
        (d, inner), = seqd
        r = node.results[0].type.rank
        axes = sorted(a % r for a in attrs["axes"])
        nd = d
        for a in axes:
            if a <= nd:
                nd += 1
        self.bind(node, self.emit_like(node, ins, attrs), [(nd, inner)])

    def op_squeeze(self, node: Node, ins, seqd, attrs) -> None:
        (d, inner), = seqd
        shp = node.operands[0].type.shape
        axes = attrs.get("axes") or [i for i, s in enumerate(shp) if s == 1]
        nd = d - sum(1 for a in axes if a % len(shp) < d)
        self.bind(node, self.emit_like(node, ins, attrs), [(nd, inner)])

    def op_matmul(self, node: Node, ins, seqd, attrs) -> None:
        a, b = node.operands
        ra, rb, r = a.type.rank, b.type.rank, node.results[0].type.rank
        da, db = seqd
        if (da is not None and da[0] == ra - 1) or (db is not None and db[0] == rb - 2):
            if da is None or db is None or da[0] != ra - 1 or db[0] != rb - 2:
                raise StrategyError("strategy cp: a matmul contracts a split sequence dim with a whole one")
            nv = self.emit_like(node, ins, attrs)[0]
            self.bind(node, [self.reduced(nv, "a matmul over the tokens (a weight gradient)")], [None])
            return
        out = None
        if da is not None:
            out = (r - 2, da[1]) if da[0] == ra - 2 else (r - ra + da[0], da[1])
        if db is not None:
            out = (r - 1, db[1]) if db[0] == rb - 1 else (r - rb + db[0], db[1])
        self.bind(node, self.emit_like(node, ins, attrs), [out])

    def op_cross_entropy(self, node: Node, ins, seqd, attrs) -> None:
        if attrs["reduction"] == "none":
            self.bind(node, self.emit_like(node, ins, attrs), [seqd[1]])
            return
        nv = self.emit_like(node, ins, attrs)[0]
        nv = self.reduced(nv, "the loss")
        self.bind(node, [self.scale(nv) if attrs["reduction"] == "mean" else nv], [None])

    def op_cross_entropy_grad(self, node: Node, ins, seqd, attrs) -> None:
        d = seqd[1] if seqd[1] is not None else seqd[2]
        nv = self.emit_like(node, ins, attrs)[0]
        self.bind(node, [self.scale(nv) if attrs["reduction"] == "mean" else nv], [d])

    def repeat_chain(self, old: Value) -> tuple[Value, list[Node]] | None:
        """``(x, chain)`` when the k or v operand ``old`` is a repeat of fewer heads: the views
        (``unsqueeze``, ``broadcast_to``, ``reshape``, ``squeeze``) from the smallest value
        ``x`` before it that is split along its sequence dim to ``old``, in order (grouped-
        query attention's repeat of the k/v heads, in any spelling); None otherwise."""
        chain: list[Node] = []
        best: tuple[Value, int] | None = None   # the smallest split value so far, its place
        x = old
        while True:
            nv = self.env.get(x)
            d = self.dim.get(nv) if nv is not None else None
            if d is not None and d[1] == 1 and (best is None or x.type.numel <= best[0].type.numel):
                best = (x, len(chain))
            p = x.producer
            if p is None or p.op not in _VIEWS or len(p.operands) != 1:
                break
            chain.append(p)
            x = p.operands[0]
        if best is None or best[0].type.numel * 2 > old.type.numel:
            return None
        return best[0], list(reversed(chain[:best[1]]))

    def replay(self, chain: list[Node], x: Value, local: bool) -> Value:
        """The views of ``chain`` applied to ``x``: with their attrs as this rank emitted them
        (``local``: this rank's tokens) or as the single-device program has them (all tokens)."""
        for n in chain:
            src = self.made[n] if local and n in self.made else n
            x = self.emit(n.op, x, **dict(src.attrs))
        return x

    def gathered(self, old: Value, new: Value, what: str) -> Value:
        """The copy of ``new`` (k or v) all-gathered over cp along the sequence, made once; of
        a repeat of fewer heads (grouped-query attention), the source heads are gathered and
        the repeat applied after (``rep`` times fewer bytes)."""
        if old in self.kv:
            return self.kv[old]
        found = self.repeat_chain(old)
        if found is None:
            self.kv[old] = self.coll("all_gather", new, f"attention reads every {what} of the sequence",
                                     dim=new.type.rank - 2)
            return self.kv[old]
        x, chain = found
        xs = self.env[x]
        d = self.dim[xs][0]
        xg = self.coll("all_gather", xs, f"attention reads every {what} of the sequence (its k/v heads, before they "
                                         "are repeated)", dim=d)
        self.kv[old] = self.replay(chain, xg, local=False)
        return self.kv[old]

    def fold_chain(self, old: Value) -> tuple[list[tuple[Node, dict, dict]], int] | None:
        """The repeat's backward that reads the gradient ``old`` of repeated heads: the chain of
        ``reshape``/``sum``/``squeeze``/``unsqueeze`` nodes, each the only reader of the one
        before, that sums it onto fewer heads without summing over the sequence, as ``(node,
        attrs on all tokens, attrs on this rank's tokens)`` with the sequence dim of its end;
        None when there is none."""
        d, inner = old.type.rank - 2, 1
        x, chain = old, []
        found: tuple[list[tuple[Node, dict, dict]], int] | None = None
        while len(x.users) == 1:
            n = next(iter(x.users))
            if n.op not in ("reshape", "sum", "squeeze", "unsqueeze") or len(n.results) != 1:
                break
            y = n.results[0]
            attrs = dict(n.attrs)
            local = dict(attrs)
            if n.op == "reshape":
                k = reshaped_dim(x.type.shape, y.type.shape, d, inner, self.seq)
                if k is None:
                    break
                d, inner = k
                local["shape"] = self.local_shape(attrs["shape"], d)
            elif n.op == "sum":
                axes = [a % x.type.rank for a in (attrs.get("axes") or range(x.type.rank))]
                if d in axes:
                    break
                d = d if attrs.get("keepdim") else d - sum(1 for a in axes if a < d)
            elif n.op == "squeeze":
                axes = attrs.get("axes") or [i for i, s in enumerate(x.type.shape) if s == 1]
                d -= sum(1 for a in axes if a % x.type.rank < d)
            else:
                r = y.type.rank
                for a in sorted(a % r for a in attrs["axes"]):
                    d += a <= d
            chain.append((n, attrs, local))
            x = y
            if inner == 1 and x.type.numel * 2 <= old.type.numel and any(c[0].op == "sum" for c in chain):
                found = (list(chain), d)
        return found

    def scattered_grad(self, old: Value, full: Value, what: str) -> tuple[Value, bool]:
        """The gradient of gathered keys or values sent back to the ranks that hold those
        tokens: folded onto the k/v heads first where the repeat's backward does it next
        (then those nodes are made here; True), else as it is (False)."""
        why = f"the gradient of the gathered {what} goes back to the rank that holds those tokens"
        found = self.fold_chain(old)
        if found is None:
            return self.coll("reduce_scatter", full, why, dim=full.type.rank - 2, op="sum"), False
        chain, d = found
        folded = full
        for n, attrs, _ in chain:
            folded = self.emit(n.op, folded, **attrs)
        out = self.coll("reduce_scatter", folded, why + " (summed over the repeated heads first)", dim=d, op="sum")
        self.skip_chain(chain, out, d)
        return out, True

    def skip_chain(self, chain: list[tuple[Node, dict, dict]], out: Value, d: int) -> None:
        """The nodes of ``chain`` are made already; its last result stands for ``out``."""
        for n, _, _ in chain[:-1]:
            self.skip[n] = None
        self.skip[chain[-1][0]] = (out, (d, 1))

    def check_attention(self, node: Node, seqd, first: int) -> None:
        for i in range(first, first + 3):
            d = seqd[i]
            if d is None or d[0] != node.operands[i].type.rank - 2:
                raise StrategyError(f"strategy cp: {node.op}'s operand {i} {node.operands[i].type} is not split "
                                    "along its sequence dim (-2)")
        if len(node.operands) > (3 if node.op == "attention" else 6):
            raise StrategyError(f"strategy cp: {node.op} with a mask operand is not supported; cp builds the causal "
                                "mask itself")

    def mark_causal(self, attrs: dict) -> None:
        """A causal attention's attributes on the gathered keys: the mask (``causal_mask``)
        replaces the causal flag, and ``causal_cp`` tells the cost it is the balanced causal
        mask, so a rank is priced by the pairs it keeps (as a flash kernel run per query chunk
        against the keys up to it), not by every (query, key) pair."""
        if attrs["causal"]:
            attrs["causal_cp"] = self.cp
        attrs["causal"] = False

    def op_attention(self, node: Node, ins, seqd, attrs) -> None:
        self.check_attention(node, seqd, 0)
        if self.ring:
            self.ring_attention(node, ins, attrs)
            return
        q, k, v = ins
        kf = self.gathered(node.operands[1], k, "key")
        vf = self.gathered(node.operands[2], v, "value")
        mask = [self.causal_mask()] if attrs["causal"] else []
        self.mark_causal(attrs)
        r = q.type.rank
        self.bind(node, self.emit_like(node, [q, kf, vf, *mask], attrs), [(r - 2, 1), (r - 2, 1)])

    def op_attention_grad(self, node: Node, ins, seqd, attrs) -> None:
        self.check_attention(node, seqd, 1)
        if self.ring:
            self.ring_attention_grad(node, ins, attrs)
            return
        dout, q, k, v, out, lse = ins[:6]
        kf = self.gathered(node.operands[2], k, "key")
        vf = self.gathered(node.operands[3], v, "value")
        mask = [self.causal_mask()] if attrs["causal"] else []
        self.mark_causal(attrs)
        dq, dk, dv = self.emit_like(node, [dout, q, kf, vf, out, lse, *mask], attrs)
        r = q.type.rank
        dk, fk = self.scattered_grad(node.results[1], dk, "keys")
        dv, fv = self.scattered_grad(node.results[2], dv, "values")
        # A gradient folded onto the k/v heads stands for the repeat's backward (its sum), not
        # for attention_grad's result, which nothing else reads.
        for old, nv, folded in zip(node.results, (dq, dk, dv), (False, fk, fv)):
            if not folded:
                self.bind_one(old, nv, (r - 2, 1))

    # --- ring attention ------------------------------------------------------------------
    def shifted(self, x: Value, what: str) -> Value:
        """``x`` handed one place forward around the cp ring (this rank gets rank r-1's)."""
        return self.coll("ring_shift", x, what, shift=1)

    def ring_attention(self, node: Node, ins: list[Value], attrs: dict) -> None:
        """Attention of this rank's queries against the cp blocks of keys and values as they
        come around the ring, each block's (out, lse) folded into the running result by
        their log-sum-exp; a block whose keys all come after a query row counts for nothing
        in that row."""
        q, k, v = ins
        (k, kc), (v, vc) = self.ring_source(node.operands[1], k), self.ring_source(node.operands[2], v)
        attrs["causal"] = False
        out: Value | None = None
        lse: Value | None = None
        for j in range(self.cp):
            mask, rows = self.ring_block(j)
            kj, vj = self.replay(kc, k, local=True), self.replay(vc, v, local=True)
            if j + 1 < self.cp:
                # The next block is on its way while this one is attended to.
                k = self.shifted(k, "ring attention hands each rank's keys to the next rank")
                v = self.shifted(v, "ring attention hands each rank's values to the next rank")
            o_j, l_j = self.emit_like(node, [q, kj, vj, mask], dict(attrs))
            o_j, l_j = self.masked_rows(o_j, l_j, rows)
            out, lse = (o_j, l_j) if out is None or lse is None else self.fold(out, lse, o_j, l_j)
        assert out is not None and lse is not None
        if out.type.dtype != q.type.dtype:
            out = self.emit("cast", out, dtype=q.type.dtype)
        r = q.type.rank
        self.bind(node, [out, lse], [(r - 2, 1), (r - 2, 1)])

    def masked_rows(self, o: Value, lse: Value, rows: Value) -> tuple[Value, Value]:
        """A block's (out, lse) with the rows that keep no key at 0 and a log-sum-exp of
        -1e30 (no weight when folded); out in f32 (lse's dtype) for the folding."""
        if o.type.dtype != lse.type.dtype:
            o = self.emit("cast", o, dtype=lse.type.dtype)
        zero = self.emit("full", shape=(), value=0.0, dtype=o.type.dtype)
        never = self.emit("full", shape=(), value=-1e30, dtype=lse.type.dtype)
        o = self.emit("where", self.emit("unsqueeze", rows, axes=(-1,)), o, zero)
        return o, self.emit("where", rows, lse, never)

    def fold(self, o: Value, lse: Value, o_j: Value, l_j: Value) -> tuple[Value, Value]:
        """The attention over two disjoint key sets from each one's (out, lse):
        lse = log(e^lse + e^l_j), out = out e^(lse_old - lse) + out_j e^(l_j - lse)."""
        m = self.emit("maximum", lse, l_j)
        a = self.emit("exp", self.emit("sub", lse, m))
        b = self.emit("exp", self.emit("sub", l_j, m))
        total = self.emit("add", m, self.emit("log", self.emit("add", a, b)))
        wa = self.emit("unsqueeze", self.emit("exp", self.emit("sub", lse, total)), axes=(-1,))
        wb = self.emit("unsqueeze", self.emit("exp", self.emit("sub", l_j, total)), axes=(-1,))
        return self.emit("add", self.emit("mul", o, wa), self.emit("mul", o_j, wb)), total

    def ring_attention_grad(self, node: Node, ins: list[Value], attrs: dict) -> None:
        """The backward around the ring again: each block's attention_grad from the final
        (out, lse) gives this rank's share of dq and of that block's dk and dv; the dk and
        dv sums travel with their block and are handed home at the end."""
        dout, q, k, v, out, lse = ins[:6]
        (k, kc), (v, vc) = self.ring_source(node.operands[2], k), self.ring_source(node.operands[3], v)
        folds = [self.fold_chain(r) if c else None for r, c in ((node.results[1], kc), (node.results[2], vc))]
        attrs["causal"] = False
        grads: tuple[Value, Value, Value] | None = None   # (dq, dk, dv) so far
        for j in range(self.cp):
            mask, _ = self.ring_block(j)
            kj, vj = self.replay(kc, k, local=True), self.replay(vc, v, local=True)
            if j + 1 < self.cp:
                k = self.shifted(k, "ring attention's backward hands each rank's keys to the next rank")
                v = self.shifted(v, "ring attention's backward hands each rank's values to the next rank")
            if grads is not None:   # the sums so far move on with their block before this one is computed
                grads = (grads[0], self.shifted(grads[1], "the key gradients travel with their block around the ring"),
                         self.shifted(grads[2], "the value gradients travel with their block around the ring"))
            dq_j, dk_j, dv_j = self.emit_like(node, [dout, q, kj, vj, out, lse, mask], dict(attrs))
            dk_j, dv_j = (self.fold_local(g, f) for g, f in ((dk_j, folds[0]), (dv_j, folds[1])))
            if grads is not None:
                dq, dk, dv = grads
                dq_j, dk_j, dv_j = (self.emit("add", a, b) for a, b in ((dq, dq_j), (dk, dk_j), (dv, dv_j)))
            grads = (dq_j, dk_j, dv_j)
        assert grads is not None
        dq, dk, dv = grads
        if self.cp > 1:
            dk = self.shifted(dk, "the key gradients travel with their block around the ring")
            dv = self.shifted(dv, "the value gradients travel with their block around the ring")
        r = q.type.rank
        self.bind_one(node.results[0], dq, (r - 2, 1))
        for old, nv, f in zip(node.results[1:], (dk, dv), folds):
            if f is None:
                self.bind_one(old, nv, (r - 2, 1))
            else:   # folded onto the k/v heads: it stands for the repeat's backward
                self.skip_chain(f[0], nv, f[1])

    def ring_source(self, old: Value, new: Value) -> tuple[Value, list[Node]]:
        """What goes around the ring for the k or v operand ``old`` (``new`` on this rank), and
        the views that make the operand from it: of a repeat of fewer heads, the source heads
        and the repeat (``rep`` times fewer bytes per shift); else ``new`` itself."""
        found = self.repeat_chain(old)
        if found is None:
            return new, []
        return self.env[found[0]], found[1]

    def fold_local(self, g: Value, fold: tuple[list[tuple[Node, dict, dict]], int] | None) -> Value:
        """A block's gradient of repeated heads summed onto the k/v heads (this rank's tokens)."""
        if fold is None:
            return g
        for n, _, local in fold[0]:
            g = self.emit(n.op, g, **local)
        return g


register(ContextParallel)
register(RingContextParallel)

__all__ = ["ContextParallel", "RingContextParallel", "SeqRewrite", "balanced_positions"]
