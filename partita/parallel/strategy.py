"""Strategies: presets of placement annotations, and ``parallelize``, the whole pipeline.

A strategy names what to split and leaves the rest to propagation: it annotates a few values
of the global graph (the batch inputs, the optimizer state, some weights) and ``propagate``
places everything else, pricing each conflict by the reshard it costs; ``partition`` then
writes the per-rank program. The presets, each on one mesh axis:

- ``dp``: every ``input``-role graph input (the batch and the targets) is split on dim 0.
  Params stay replicated, so their gradients come out as partial sums that the optimizer
  update needs whole: one all_reduce per gradient (``bucket-gradients`` fuses them).
- ``zero1``, ``zero2``, ``zero3`` (include ``dp``): the optimizer state of each param is split
  over the data-parallel axis on its first dim that divides; each rank updates its slice of
  the param and the new params are all-gathered. ``zero1`` annotates the gradients whole
  (all_reduce, then each rank slices its part), ``zero2`` annotates them split
  (reduce_scatter: each rank receives only its part's sum). ``zero3`` also keeps each param
  split between steps: the forward reads a gathered copy and the backward gathers again
  (two all_gathers per param per step, as FSDP does), each right before its first reader,
  so a gathered param is alive only while it is used.
- ``megatron``: tensor parallelism in pairs, as Megatron-LM does for transformer layers. A
  matmul by a weight whose input is whole on the tensor axis is column-parallel (the weight
  split on its output dim); a matmul whose input arrives split on its contracted dim is
  row-parallel (the weight split on its input dim; the result is a partial sum, reduced
  where a consumer needs it). Attention heads split through the reshapes that follow the
  column-parallel projections. Embedding tables are vocab-parallel (split by rows: a rank
  looks up its rows, the lookup is a partial sum), and a column weight whose split reaches
  a cross_entropy's classes (an LM head) stays split: the loss runs on the rank's logits
  with its log-sum-exp all-reduced, so the logits are never gathered. A vocabulary that the
  tensor axis does not divide is padded first (``partita.parallel.pad``). A column weight
  that neither a row weight nor a loss follows is left whole.
- ``sp`` (``sequence-parallel``, with ``megatron``): the values where a row-parallel partial
  sum is reduced are split on their token dim, so the reduction is a reduce_scatter, the
  norms and residual adds between the parallel regions run on a slice of the tokens, and the
  next column-parallel matmul gathers its input (all_gather) instead.

``partita.parallelize(graph, mesh="dp=2,tp=2", strategy="dp+megatron")`` combines them (one
data-parallel preset and megatron on a 2-D mesh). User ``annotations`` (by value name) are
applied after the preset and win over it.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..ir.diagnostics import PartitaError
from ..ir.graph import Graph, Node, Value, input_name
from ..ir.printer import print_graph, value_names
from ..ops.registry import OPS
from .mesh import Mesh, MeshError
from .pad import PadReport, cut_array, pad_array
from .partition import PartitionReport, local_piece, partition_with_report, piece_index
from .placement import Placement, PlacementError
from .propagate import PropagationError, PropagationReport, placement_from_labels, propagate
from .sharding import Conflict, result_placements, sharding_spec


class StrategyError(PartitaError):
    """A strategy or annotation that cannot be applied (the message says what and how to fix it)."""


DATA_PARALLEL = ("dp", "zero1", "zero2", "zero3")
ALIASES = {"sequence-parallel": "sp", "tp": "megatron", "ddp": "dp", "fsdp": "zero3"}
KNOWN = DATA_PARALLEL + ("megatron", "sp")
UPDATE_OPS = ("adamw_update", "sgd_update")


@dataclass(frozen=True)
class Strategy:
    """A parsed strategy: the data-parallel preset (or None) on ``dp_axis``, Megatron tensor
    parallelism (with sequence parallelism) on ``tp_axis``."""

    data: str | None = None
    dp_axis: str | None = None
    megatron: bool = False
    sequence_parallel: bool = False
    tp_axis: str | None = None

    def __str__(self) -> str:
        parts = ([self.data] if self.data else []) + (["megatron"] if self.megatron else []) + \
            (["sp"] if self.sequence_parallel else [])
        return "+".join(parts) or "none"


def parse_strategy(text: str | None, mesh: Mesh) -> Strategy:
    """Parse ``"dp+megatron"``-style text against ``mesh``: data-parallel presets use the axis
    named ``dp`` (or the only axis), megatron the axis named ``tp`` (or the only axis)."""
    if text is None or text.strip() in ("", "none"):
        return Strategy()
    parts = [ALIASES.get(p.strip(), p.strip()) for p in text.replace(",", "+").split("+") if p.strip()]
    for p in parts:
        if p not in KNOWN:
            near = difflib.get_close_matches(p, KNOWN + tuple(ALIASES), n=1, cutoff=0.5)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise StrategyError(f"unknown strategy '{p}'{hint}; combine {', '.join(KNOWN)} with '+', "
                                "e.g. 'dp+megatron' or 'zero2+megatron+sp'")
    data = [p for p in parts if p in DATA_PARALLEL]
    if len(data) > 1:
        raise StrategyError(f"strategy '{text}' names {' and '.join(data)}; choose one data-parallel preset "
                            "(dp, zero1, zero2 or zero3)")
    megatron = "megatron" in parts
    sp = "sp" in parts
    if sp and not megatron:
        raise StrategyError(f"strategy '{text}': sequence parallelism splits what megatron's row-parallel layers "
                            "reduce; use it as 'megatron+sp'")

    def axis(preferred: str, what: str) -> str:
        if preferred in mesh.names:
            return preferred
        if len(mesh.names) == 1:
            return mesh.names[0]
        raise StrategyError(f"strategy '{text}': {what} needs a mesh axis named '{preferred}' on the mesh {mesh}; "
                            f"name the axes, e.g. mesh='dp=2,tp=2'")
    dp_axis = axis("dp", data[0]) if data else None
    tp_axis = axis("tp", "megatron") if megatron else None
    if dp_axis is not None and dp_axis == tp_axis:
        raise StrategyError(f"strategy '{text}' puts {data[0]} and megatron on the same mesh axis '{dp_axis}'; "
                            "use a 2-D mesh such as 'dp=2,tp=2'")
    return Strategy(data[0] if data else None, dp_axis, megatron, sp, tp_axis)


def parse_placement(text: str | Placement, rank: int, what: str = "the annotation") -> Placement:
    """A placement from its text: ``"replicated"``, or one entry per dim in brackets, ``-`` for
    a whole dim and mesh axes joined by ``@`` for a split one, optionally followed by
    ``partial(axis, ...)``: ``"[dp, -]"``, ``"[-, dp@tp] partial(pp)"`` (what ``str(Placement)``
    prints)."""
    if isinstance(text, Placement):
        return text
    s = text.strip()
    partial: tuple[str, ...] = ()
    if "partial(" in s:
        s, _, rest = s.partition("partial(")
        partial = tuple(a.strip() for a in rest.rstrip().rstrip(")").split(",") if a.strip())
        s = s.strip()
    if s == "replicated":
        return Placement(((),) * rank, partial)
    if not (s.startswith("[") and s.endswith("]")):
        raise StrategyError(f"{what}: cannot read the placement '{text}'; write one entry per dim in brackets, "
                            "'-' for a whole dim, e.g. '[dp, -]' or '[-, tp] partial(dp)', or 'replicated'")
    entries = [e.strip() for e in s[1:-1].split(",")] if s[1:-1].strip() else []
    if len(entries) != rank:
        raise StrategyError(f"{what}: the placement '{text}' has {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
                            f" but the value has {rank} dim(s); give one entry per dim")
    dims = tuple(() if e in ("-", "_", "") else tuple(a.strip() for a in e.split("@")) for e in entries)
    return Placement(dims, partial)


# --- the presets ----------------------------------------------------------------------------------------


class _Annotator:
    """Collects the placements a strategy puts on values of the global graph."""

    def __init__(self, graph: Graph, mesh: Mesh, strategy: Strategy) -> None:
        self.g = graph
        self.mesh = mesh
        self.s = strategy
        self.names = value_names(graph)
        self.notes: list[str] = []
        # Phase 1: annotations that propagation spreads (inputs, weights, gather points).
        self.fixed: dict[Value, Placement] = {}
        # Phase 2: placements of node results that only ask for a reshard where they are
        # produced (gradients, new params), set after propagation so that they do not pull
        # the backward section's operands along with them.
        self.late: dict[Value, Placement] = {}
        # Params the megatron walk split to match a split weight (the bias of a column layer).
        self.followers: dict[Value, Placement] = {}
        # Column weights whose split a node could not carry on (for the plan's notes).
        self.blocked: dict[Value, str] = {}
        # Annotated values that must not pull their producers' operands along (see propagate).
        self.sinks: set[Value] = set()
        # What megatron's vocabulary padding padded (None: nothing).
        self.padding: "PadReport | None" = None

    def name(self, v: Value) -> str:
        return self.names.get(v, "?")

    def place(self, v: Value, p: Placement) -> None:
        self.fixed[v] = p

    def split_dim0(self, v: Value, axis: str, why: str) -> None:
        n = self.mesh.axis_size(axis)
        if v.type.rank == 0:
            return
        if v.type.shape[0] % n:
            raise StrategyError(
                f"{why}: %{self.name(v)} has {v.type.shape[0]} rows in dim 0 ({v.type}), which the mesh axis "
                f"'{axis}' of size {n} does not divide; use a batch that is a multiple of {n} or a smaller '{axis}'")
        self.place(v, Placement.split(v.type.rank, {0: axis}))

    def data_parallel(self) -> None:
        axis = self.s.dp_axis
        assert axis is not None
        batch = [v for v in self.g.inputs if v.role == "input"]
        if not batch:
            raise StrategyError(f"strategy {self.s.data}: @{self.g.name} has no 'input'-role graph input to split "
                                "over the batch; data parallelism needs the batch as an input")
        for v in batch:
            self.split_dim0(v, axis, f"strategy {self.s.data}")
        if self.s.data != "dp":
            self.zero(axis)

    def zero(self, axis: str) -> None:
        n = self.mesh.axis_size(axis)
        updates = [node for node in self.g.nodes if node.op in UPDATE_OPS]
        if not updates:
            raise StrategyError(f"strategy {self.s.data} shards the optimizer state, but @{self.g.name} has no "
                                "optimizer update; build the graph with partita.training_step(..., optimizer='adamw')")
        for node in updates:
            p, grad = node.operands[0], node.operands[1]
            tp = self.fixed.get(p) or Placement.replicated(p.type.rank)
            dims = [d for d in range(p.type.rank) if not tp.dims[d] and p.type.shape[d] %
                    (n * math.prod(self.mesh.axis_size(a) for a in tp.dims[d])) == 0]
            if not dims:
                self.notes.append(f"%{self.name(p)} {p.type} is not sharded over '{axis}': no dim divides by {n}")
                continue
            d = dims[0]
            sharded = Placement(tuple(tp.dims[i] + ((axis,) if i == d else ()) for i in range(p.type.rank)))
            for s in node.operands[2:]:
                if s.type.shape == p.type.shape:
                    self.place(s, sharded)
            if self.s.data != "zero3":
                # Pinned: left free, the param would take the split of its sharded state.
                self.place(p, tp)
            if grad.producer is not None:
                self.late[grad] = tp if self.s.data == "zero1" else sharded
            new_p = node.results[0]
            if self.s.data == "zero3":
                self.place(p, sharded)
                self.late[new_p] = sharded
                self.gather_point(p, node, tp)
            else:
                self.late[new_p] = tp

    def gather_point(self, p: Value, update: Node, whole: Placement) -> None:
        """Every reader of a zero3-sharded param but its update reads a gathered copy: a
        same-shape reshape whose result is annotated whole over the data axis, which the
        partition turns into one all_gather right before the first reader. The forward's
        readers and the backward's get one copy each, as FSDP gathers twice: the forward's
        copy dies after its last forward reader instead of living until the backward."""
        from ..autodiff.memory import backward_start
        from ..ir.builder import Builder

        readers = [u for u in list(p.users) if u is not update]
        if not readers:
            return
        stop = backward_start(self.g)
        forward = [u for u in readers if stop is None or u.is_before(stop)]
        backward = [u for u in readers if u not in forward]
        if forward and backward and not _reads_param_between(max(forward, key=lambda u: u._order),
                                                              min(backward, key=lambda u: u._order), p):
            # No other param is read from the forward's last use to the backward's first (the
            # LM head's matmul, the loss, the head's gradient): a second gather would fetch
            # the same rows again with nothing gained, so one copy serves both, as FSDP keeps
            # its root unit's params (the embedding, the tied head) for the backward.
            forward, backward = forward + backward, []
        groups = [forward, backward]
        for k, group in enumerate(g for g in groups if g):
            first = min(group, key=lambda u: u._order)
            b = Builder(self.g).set_insertion_before(first)
            suffix = ".gathered" if k == 0 else ".regathered"
            copy = b.reshape(p, shape=tuple(p.type.shape), name=f"{p.name}{suffix}", loc=first.loc)
            for u in group:
                for i, o in enumerate(list(u.operands)):
                    if o is p:
                        self.g.set_operand(u, i, copy)
            self.place(copy, whole)

    # --- megatron -----------------------------------------------------------------------------------
    def megatron(self) -> None:
        axis = self.s.tp_axis
        assert axis is not None
        self.pad_vocabulary(axis)
        excluded: set[Value] = set()
        for _ in range(8):
            self.followers = {}
            cols, rows, confirmed, reduced = self.track(axis, excluded)
            loose = set(cols) - confirmed
            if not loose:
                break
            excluded |= loose
        for w, p in list(cols.items()) + list(rows.items()) + list(self.followers.items()):
            if w not in self.fixed:
                self.place(w, p)
        self.vocab_parallel(axis)
        for w in sorted(excluded, key=lambda v: v.index):
            why = f"its column split stops at {self.blocked[w]}, which needs that dim whole" if w in self.blocked \
                else "no row-parallel matmul follows its column-parallel use"
            if w in self.blocked and self.blocked[w].endswith("= split"):
                why += " (a fused projection: run the split-projections pass on the forward graph first)"
            self.notes.append(f"%{self.name(w)} kept whole over '{axis}': {why}")
        if self.s.sequence_parallel:
            for v in reduced:
                p = self.token_split(v)
                if p is not None and v not in self.fixed:
                    self.place(v, p)
                    self.sinks.add(v)
        # Optimizer state follows its param (a ZeRO preset shards it further).
        for node in self.g.nodes:
            if node.op in UPDATE_OPS and node.operands[0] in self.fixed:
                for st in node.operands[2:]:
                    if st.type.shape == node.operands[0].type.shape:
                        self.place(st, self.fixed[node.operands[0]])

    def pad_vocabulary(self, axis: str) -> None:
        """Pad each token table whose rows ``axis`` does not divide (and everything that
        shares its index: a tied or untied LM head, the logits, the optimizer state) to the
        next multiple of the axis size, as Megatron-LM pads its vocabulary; see
        ``partita.parallel.pad``."""
        from .pad import pad_dims

        n = self.mesh.axis_size(axis)
        seeds = [(t, 0) for t in self.token_tables() if t.type.shape[0] % n]
        if not seeds:
            return
        sizes = {t.type.shape[0] for t, _ in seeds}
        for node in self.g.nodes:
            if node.op == "cross_entropy":
                logits = node.operands[0]
                cdim = 1 if logits.type.rank >= 2 else 0
                if logits.type.shape[cdim] in sizes:  # an untied LM head over the same vocabulary
                    seeds.append((logits, cdim))
        rep = pad_dims(self.g, seeds, n)
        if not rep:
            return
        # The graph's own weights keep their real sizes: shard_weights pads what it cuts.
        self.padding = rep
        self.names = value_names(self.g)
        for name, dims in rep.inputs.items():
            for d, real in dims.items():
                self.notes.append(f"%{name} padded from {real} to {rep.padded} along dim {d} so that '{axis}' "
                                  f"(size {n}) splits it; the extra entries hold zeros")
        for why in dict.fromkeys(rep.cut):
            self.notes.append(f"the padded vocabulary is cut back to {rep.size} before {why}")

    def token_tables(self) -> list[Value]:
        """The embedding tables megatron may split by rows: params not yet placed whose
        lookups read the data (token ids; not position tables indexed by an iota), in
        program order, each once."""
        out: dict[Value, None] = {}
        for node in self.g.nodes:
            if node.op != "embedding":
                continue
            table = node.operands[0]
            if table.is_input and table.role == "param" and table not in self.fixed \
                    and _reads_data(node.operands[1]):
                out[table] = None
        return list(out)

    def vocab_parallel(self, axis: str) -> None:
        """Split each token embedding table param by rows over ``axis`` (Megatron's
        vocab-parallel embedding; a tied LM head follows it through propagation). A table
        whose indices do not come from the data (positions from an iota) stays whole, as in
        Megatron: it is small, and its lookup would only add a partial sum to reduce."""
        n = self.mesh.axis_size(axis)
        for table in self.token_tables():
            if table.type.shape[0] % n:
                self.notes.append(f"%{self.name(table)} kept whole over '{axis}': its {table.type.shape[0]} rows "
                                  f"do not split into {n} (pad the vocabulary to a multiple of {n})")
                continue
            self.place(table, Placement.split(2, {0: axis}))
            self.notes.append(f"%{self.name(table)} is vocab-parallel over '{axis}' (split by rows)")

    def token_split(self, v: Value) -> Placement | None:
        """The sequence-parallel placement of activation ``v``: its leading dim (the batch,
        or batch x sequence once flattened) split over the data axis and then the tensor
        axis, which stays contiguous through the reshapes that flatten [B, S, C] to [B*S, C];
        else its dim 1 (the sequence of [B, S, C])."""
        tp = self.s.tp_axis
        assert tp is not None
        lead = ((self.s.dp_axis,) if self.s.dp_axis else ()) + (tp,)
        shape = v.type.shape
        if not shape:
            return None
        if shape[0] % math.prod(self.mesh.axis_size(a) for a in lead) == 0:
            return Placement(((lead),) + ((),) * (len(shape) - 1))
        if len(shape) == 3 and shape[1] % self.mesh.axis_size(tp) == 0:
            return Placement((lead[:-1], (tp,), ()))
        return None

    def weight_of(self, node: Node) -> tuple[Value, bool] | None:
        """The param a matmul multiplies by on the right (directly or transposed), if any."""
        if node.op != "matmul" or len(node.operands) != 2:
            return None
        rhs = node.operands[1]
        if rhs.is_input and rhs.role == "param" and rhs.type.rank == 2:
            return rhs, False
        prod = rhs.producer
        if prod is not None and prod.op == "transpose" and prod.operands[0].is_input and \
                prod.operands[0].role == "param" and prod.operands[0].type.rank == 2:
            return prod.operands[0], True
        return None

    def track(self, axis: str, excluded: set[Value]):
        """One forward walk deciding column and row weights; see the module docstring."""
        from ..autodiff.memory import backward_start

        stop = backward_start(self.g)
        n = self.mesh.axis_size(axis)
        embedded = {node.operands[0] for node in self.g.nodes if node.op == "embedding"}
        state: dict[Value, Placement] = {}
        origin: dict[Value, frozenset] = {}
        cols: dict[Value, Placement] = {}
        rows: dict[Value, Placement] = {}
        confirmed: set[Value] = set()
        reduced: list[Value] = []
        weight_transposes = {}
        for node in self.g.nodes:
            w = self.weight_of(node)
            if w is not None and w[1]:
                weight_transposes[node.operands[1].producer] = w[0]

        def pl(v: Value) -> Placement:
            if v in state:
                return state[v]
            if v in cols:
                return cols[v]
            if v in rows:
                return rows[v]
            return Placement.replicated(v.type.rank)

        def on_axis(p: Placement) -> Placement:
            return Placement(tuple(tuple(a for a in d if a == axis) for d in p.dims),
                             tuple(a for a in p.partial if a == axis))

        for node in self.g.nodes:
            if node is stop:
                break
            if node in weight_transposes and weight_transposes[node] not in cols and \
                    weight_transposes[node] not in rows:
                continue  # decided at its matmul
            w = self.weight_of(node)
            if w is not None and w[0] not in cols and w[0] not in rows and w[0] not in excluded \
                    and w[0] not in embedded:
                param, transposed = w
                xs = pl(node.operands[0])
                k_dim = node.operands[0].type.rank - 1
                if xs.is_replicated:
                    d = 0 if transposed else 1
                    if param.type.shape[d] % n == 0:
                        cols[param] = Placement.split(2, {d: axis})
                elif xs.dims[k_dim] == (axis,) and not xs.partial and \
                        all(not a for i, a in enumerate(xs.dims) if i != k_dim):
                    d = 1 if transposed else 0
                    if param.type.shape[d] % n == 0:
                        rows[param] = Placement.split(2, {d: axis})
                        confirmed |= origin.get(node.operands[0], frozenset())
                if transposed:
                    tnode = node.operands[1].producer
                    assert tnode is not None  # weight_of found the transpose
                    state[tnode.results[0]] = Placement(tuple(reversed(pl(param).dims)))
            results = self.infer(node, [pl(o) for o in node.operands], axis)
            if results is None:
                for o in node.operands:
                    if any(pl(o).dims):
                        for w0 in origin.get(o, frozenset()):
                            self.blocked.setdefault(w0, f"%{self.name(node.results[0])} = {node.op}" if node.results
                                                    else node.op)
                # The rule rejects the partial sums: they are reduced here.
                if any(pl(o).partial for o in node.operands):
                    reduced.extend(o for o in node.operands if pl(o).partial and o not in reduced)
                ops = [Placement(pl(o).dims, ()) for o in node.operands]
                results = self.infer(node, ops, axis)
            if results is None:
                results = [Placement.replicated(r.type.rank) for r in node.results]
            if node.op == "cross_entropy" and node.operands[0] in origin:
                # Logits split on the classes: the vocab-parallel loss takes them as they are.
                logits = node.operands[0]
                if pl(logits).dims[1 if logits.type.rank >= 2 else 0] == (axis,):
                    confirmed |= origin[logits]
            src = frozenset().union(*(origin.get(o, frozenset()) for o in node.operands))
            if w is not None and w[0] in cols:
                src = frozenset({w[0]})
            for r, p in zip(node.results, results):
                state[r] = on_axis(p)
                if not state[r].is_replicated:
                    origin[r] = src
        return cols, rows, confirmed, reduced

    def infer(self, node: Node, placements: list[Placement], axis: str) -> list[Placement] | None:
        spec = sharding_spec(node.op, [o.type for o in node.operands], node.attrs)
        if spec is None:
            return None if any(not p.is_replicated for p in placements) else \
                [Placement.replicated(r.type.rank) for r in node.results]
        # Operands that are still free (biases, norm weights) follow the split of the others.
        label_axes: dict[str, tuple[str, ...]] = {}
        for labels, o, p in zip(spec.operands, node.operands, placements):
            if (o.is_input and o.role == "param" and o not in self.fixed) or \
                    (o.producer is not None and o.producer.op == "constant"):
                continue
            for lab, axes in zip(labels, p.dims):
                if lab is not None and axes:
                    label_axes.setdefault(lab, axes)
        ops = []
        for labels, o, p in zip(spec.operands, node.operands, placements):
            if o.is_input and o.role == "param" and o not in self.fixed and p.is_replicated:
                p = placement_from_labels(labels, label_axes, o.type.shape, self.mesh)
                if not p.is_replicated:
                    self.followers.setdefault(o, p)
            elif o.producer is not None and o.producer.op == "constant" and p.is_replicated:
                # A constant (the padded vocabulary's mask) is cut to whatever split it meets.
                p = placement_from_labels(labels, label_axes, o.type.shape, self.mesh)
            ops.append(p)
        got = result_placements(spec, ops, [o.type for o in node.operands], self.mesh,
                                [r.type for r in node.results])
        return None if isinstance(got, Conflict) else got


def _reads_param_between(first: Node, last: Node, p: Value) -> bool:
    """Whether a node after ``first`` and before ``last`` reads a param other than ``p``."""
    n = first.next
    while n is not None and n is not last:
        if any(o.is_input and o.role == "param" and o is not p for o in n.operands):
            return True
        n = n.next
    return False


def _reads_data(v: Value) -> bool:
    """Whether ``v`` depends on an ``input``-role graph input (not only on params or constants)."""
    seen: set[Value] = set()
    stack = [v]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.is_input:
            if u.role == "input":
                return True
            continue
        assert u.producer is not None  # a value that is not an input has a producer
        stack.extend(u.producer.operands)
    return False


# --- the plan report ------------------------------------------------------------------------------------


@dataclass
class PlanReport:
    """What ``parallelize`` decided, for people (``text()``) and tools (``to_json()``)."""

    mesh: Mesh
    strategy: str
    placements: dict[str, str]
    collectives: list[dict]
    replicated: list[str]
    notes: list[str]
    param_bytes: int
    state_bytes: int
    activation_bytes: int
    global_param_bytes: int
    timings: dict[str, float] = field(default_factory=dict)
    buckets: list[dict] = field(default_factory=list)
    program_collectives: int = 0

    @property
    def comm_bytes(self) -> int:
        """Bytes each rank sends per step over every collective of the per-rank program."""
        return sum(c["bytes"] for c in self.collectives)

    def count(self, op: str | None = None, axis: str | None = None, phase: str | None = None) -> int:
        """How many collectives match ``op``, ``axis`` and ``phase`` ("forward", "backward",
        "update"; None: any)."""
        return sum(1 for c in self.collectives if (op is None or c["op"] == op) and
                   (axis is None or c["axis"] == axis) and (phase is None or c["phase"] == phase))

    def to_dict(self) -> dict:
        return {"mesh": str(self.mesh), "strategy": self.strategy, "placements": self.placements,
                "collectives": self.collectives, "comm_bytes_per_step": self.comm_bytes,
                "per_rank": {"param_bytes": self.param_bytes, "optimizer_state_bytes": self.state_bytes,
                             "activation_bytes": self.activation_bytes},
                "global_param_bytes": self.global_param_bytes, "replicated_no_rule": self.replicated,
                "notes": self.notes, "timings_s": self.timings, "buckets": self.buckets,
                "collectives_in_program": self.program_collectives}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def summary(self) -> str:
        """A few lines: mesh, strategy, bytes per rank, collectives by op, axis and phase."""
        lines = [f"plan: {self.strategy} on {self.mesh} ({self.mesh.size} ranks)",
                 f"  per rank: params {_fmt(self.param_bytes)} (of {_fmt(self.global_param_bytes)}), optimizer "
                 f"state {_fmt(self.state_bytes)}, peak activations {_fmt(self.activation_bytes)}",
                 f"  communication per step: {_fmt(self.comm_bytes)} sent per rank in {len(self.collectives)} "
                 "collective(s)"]
        groups: dict[tuple[str, str, str], list[int]] = {}
        for c in self.collectives:
            groups.setdefault((c["phase"], c["op"], c["axis"]), []).append(c["bytes"])
        for (phase, op, axis), bs in sorted(groups.items()):
            lines.append(f"    {phase:8} {op:14} over {axis:4} x{len(bs):<4} {_fmt(sum(bs))}")
        for b in self.buckets:
            lines.append(f"  bucket: {len(b['members'])} {b['op']}s over {b['axis']} fused into one "
                         f"({_fmt(b['bytes'])})")
        if self.program_collectives:
            lines.append(f"  the per-rank program issues {self.program_collectives} collective(s)")
        if self.replicated:
            lines.append(f"  replicated for lack of a sharding rule: {len(self.replicated)} op(s)")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)

    def text(self) -> str:
        """The full report: the summary, every collective with its reason, every placement."""
        lines = [self.summary(), "collectives (why each was inserted):"]
        for c in self.collectives:
            at = f" at {c['source']}" if c.get("source") else ""
            if c.get("inside"):
                lines.append(f"  [{c['phase']}] {c['op']} over {c['axis']}: inside {c['consumer']}{at} (its "
                             f"distributed form), {c['bytes']} bytes")
                continue
            lines.append(f"  [{c['phase']}] {c['op']} over {c['axis']}: %{c['value']} {c['have']} -> {c['want']} "
                         f"for {c['consumer']}{at}, {c['bytes']} bytes")
        if self.replicated:
            lines.append("replicated (no sharding rule):")
            lines += [f"  {r}" for r in self.replicated]
        lines.append("placements:")
        lines += [f"  %{k}: {v}" for k, v in self.placements.items()]
        return "\n".join(lines)


def _fmt(n: int) -> str:
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024 or unit == "GiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return str(x)


def _nbytes(v: Value) -> int:
    return math.prod(v.type.shape) * v.type.dtype.itemsize


# --- the program --------------------------------------------------------------------------------------


@dataclass
class ParallelProgram:
    """The result of ``parallelize``: the placed global graph, the per-rank program, the mesh
    and the plan. Arrays move between the two views with ``shard_*`` and ``assemble*``."""

    graph: Graph
    local: Graph
    mesh: Mesh
    strategy: Strategy
    plan: PlanReport
    propagation: PropagationReport
    partition: PartitionReport
    # The single-device graph that was parallelized (what ``--check`` runs), and what the
    # vocabulary padding padded (``graph`` holds padded params; the arrays that go in and
    # come out through the methods below have the real sizes).
    source: Graph | None = None
    padding: PadReport | None = None

    @property
    def single_device(self) -> Graph:
        """The graph the per-rank programs must agree with (``source``, else ``graph``)."""
        return self.source if self.source is not None else self.graph

    def _pads(self, name: str) -> dict[int, int]:
        return self.padding.inputs.get(name, {}) if self.padding is not None else {}

    def shard_weights(self, weights: Mapping[str, Any] | None = None) -> list[dict[str, np.ndarray]]:
        """Each rank's pieces of the params and optimizer state (default: the graph's own
        weights; missing optimizer state starts at zeros, as training_step's does)."""
        src = dict(self.graph.weights if weights is None else weights)
        out: list[dict[str, np.ndarray]] = [{} for _ in range(self.mesh.size)]
        for v in self.graph.inputs:
            if v.role not in ("param", "state"):
                continue
            name = input_name(v)
            if name not in src:
                if v.role == "state":
                    src[name] = np.zeros(v.type.shape, v.type.dtype.np)
                else:
                    raise StrategyError(f"no value for the param %{name} {v.type}; pass weights= with every param")
            arr = src[name]
            pads = self._pads(name)
            if pads and np.ndim(arr) == v.type.rank and all(np.shape(arr)[d] == n for d, n in pads.items()):
                arr = pad_array(arr, pads, v.type.shape)
            for r in range(self.mesh.size):
                out[r][name] = np.array(local_piece(arr, v.placement, self.mesh, r, f"weight %{name}"))
        return out

    def shard_inputs(self, inputs: Mapping[str, Any]) -> list[dict[str, np.ndarray]]:
        """Each rank's pieces of the data inputs (``input``-role, by name)."""
        out: list[dict[str, np.ndarray]] = [{} for _ in range(self.mesh.size)]
        for v in self.graph.inputs:
            if v.role != "input":
                continue
            name = input_name(v)
            if name not in inputs:
                raise StrategyError(f"no value for the input %{name} {v.type}")
            for r in range(self.mesh.size):
                out[r][name] = np.array(local_piece(inputs[name], v.placement, self.mesh, r, f"input %{name}"))
        return out

    def assemble_outputs(self, outputs_by_rank: Sequence[Sequence[Any]]) -> list[np.ndarray]:
        """The global outputs from every rank's pieces (the partition reduces pending sums)."""
        res = []
        for i, v in enumerate(self.graph.outputs):
            p = Placement(v.placement.dims, ()) if v.placement is not None else None
            full = assemble([np.asarray(o[i]) for o in outputs_by_rank], p, self.mesh, v.type.shape)
            pads = self.padding.outputs.get(i) if self.padding is not None else None
            res.append(cut_array(full, pads) if pads else full)
        return res

    def assemble_weights(self, weights_by_rank: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        """The global params and optimizer state from every rank's pieces."""
        out: dict[str, np.ndarray] = {}
        for v in self.graph.inputs:
            name = input_name(v)
            if v.role in ("param", "state") and all(name in w for w in weights_by_rank):
                full = assemble([np.asarray(w[name]) for w in weights_by_rank], v.placement, self.mesh,
                                v.type.shape)
                pads = self._pads(name)
                out[name] = cut_array(full, pads) if pads else full
        return out

    def simulate(self, inputs: Mapping[str, Any], weights: Mapping[str, Any] | None = None) -> list[np.ndarray]:
        """Run every rank's program in this process (NumPy reference, exact collectives) on
        the global ``inputs``; returns the assembled global outputs."""
        from .simulate import run_mesh

        outs = run_mesh(self.local, self.mesh, self.shard_inputs(inputs), self.shard_weights(weights))
        return self.assemble_outputs(outs)

    def text(self) -> str:
        """The per-rank program's text form."""
        return print_graph(self.local)


def assemble(pieces: Sequence[np.ndarray], placement: Placement | None, mesh: Mesh,
             shape: Sequence[int]) -> np.ndarray:
    """The global array whose ``local_piece`` on each rank is ``pieces[rank]`` (the inverse
    of ``local_piece``; ranks that hold the same piece must agree, rank 0's copy wins)."""
    if placement is None or placement.is_replicated:
        return np.asarray(pieces[0])
    out = np.empty(tuple(shape), dtype=np.asarray(pieces[0]).dtype)
    for r in range(mesh.size):
        out[piece_index(shape, placement, mesh, r)] = pieces[r]
    return out


# --- the pipeline --------------------------------------------------------------------------------------


def parallelize(graph: Graph, mesh: Mesh | str, strategy: str | None = None,
                annotations: Mapping[str, str | Placement] | None = None, *,
                allow_replication: bool = False, bucket_mb: float | None = 25.0,
                first_bucket_mb: float | None = 1.0, order: bool = True, prefetch: int = 1,
                gather_mb: float | None = 4.0) -> ParallelProgram:
    """Rewrite ``graph`` (forward or training step; not changed) for ``mesh``.

    ``strategy``: presets joined with ``+`` (see the module docstring); ``annotations``:
    placements by value name (as ``print_graph`` names the values), e.g. ``{"x": "[dp, -]"}``,
    applied after the preset. Ops without a sharding rule are replicated; where that makes a
    rank gather a value the strategy split (the batch, a weight), this raises a StrategyError
    naming the op unless ``allow_replication`` is true (the plan lists those ops either way).
    ``bucket_mb``: gradient all_reduces and reduce_scatters of the per-rank program are
    fused into buckets of at most this many MiB (None: not bucketed), the first of each kind
    at most ``first_bucket_mb`` so that it starts early in the backward pass, as DDP's 25 MiB
    buckets after a 1 MiB first one; ``order``: the collectives get one program-derived order (order-collectives).
    ``prefetch``: zero3 issues each param's all_gather this many param gathers ahead of its
    use, so that it overlaps the compute before (0: just in time, the least memory).
    ``gather_mb``: zero3's param all_gathers are fused into buckets of at most this many MiB
    of gathered params, taken in the order the program reads them (None: one per param).
    """
    import time

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        m = Mesh.of(mesh.replace(":", "=") if isinstance(mesh, str) else mesh)
    except MeshError as e:
        raise StrategyError(f"bad mesh '{mesh}': {e}") from e
    s = parse_strategy(strategy, m)
    g = graph.clone()
    for v in g.values():
        v.placement = None
    g.mesh = m
    ann = _Annotator(g, m, s)
    # Megatron first: the ZeRO presets shard the optimizer state on top of its weight splits.
    if s.megatron:
        ann.megatron()
    if s.data is not None:
        ann.data_parallel()
    if annotations:
        names = {name: v for v, name in value_names(g).items()}
        for name, text in annotations.items():
            key = name.lstrip("%")
            if key not in names:
                near = difflib.get_close_matches(key, list(names), n=3)
                hint = f"; did you mean {', '.join('%' + x for x in near)}?" if near else \
                    "; value names are as print_graph prints them"
                raise StrategyError(f"annotation on %{key}: @{graph.name} has no value of that name{hint}")
            v = names[key]
            p = parse_placement(text, v.type.rank, f"annotation on %{key}")
            try:
                p.validate(v.type.shape, m, f"%{key}")
            except PlacementError as e:
                raise StrategyError(f"annotation on %{key} {v.type}: {e}") from e
            ann.place(v, p)
    if s.data or s.megatron:
        # Whatever the preset left free among the inputs is whole: propagation then runs
        # forward from the inputs, and no annotated intermediate pulls its producers along.
        for v in g.inputs:
            ann.fixed.setdefault(v, Placement.replicated(v.type.rank))
    for v, p in ann.fixed.items():
        v.placement = p
    timings["annotate"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    try:
        prop = propagate(g, sinks=list(ann.sinks))
    except PropagationError as e:
        raise StrategyError(f"strategy {s}: {e}") from e
    if ann.late:
        # Everything is placed now: this second run only settles each node against its rule
        # and records the reshards the late placements ask for.
        for v, p in ann.late.items():
            v.placement = p
        try:
            prop = propagate(g)
        except PropagationError as e:
            raise StrategyError(f"strategy {s}: {e}") from e
    timings["propagate"] = time.perf_counter() - t1
    forced = _forced_replication(g, prop)
    if forced and not allow_replication and (s.data or s.megatron):
        raise StrategyError(
            f"strategy {s} on {m}: {forced[0]}; the op has no sharding rule, so every rank would gather its "
            "operands whole. Add a rule for it in partita/parallel/sharding.py, or pass allow_replication=True "
            "to accept the gather" + (f" ({len(forced)} such ops)" if len(forced) > 1 else ""))
    t2 = time.perf_counter()
    local, part = partition_with_report(g, prop.reshards,
                                        real_sizes=ann.padding.values if ann.padding is not None else None)
    timings["partition"] = time.perf_counter() - t2
    buckets = None
    gathers = None
    if bucket_mb is not None or order or gather_mb is not None:
        from .bucket import bucket_gathers, bucket_gradients, order_collectives

        t3 = time.perf_counter()
        if bucket_mb is not None:
            buckets = bucket_gradients(local, bucket_mb, first_bucket_mb)
        if gather_mb is not None:
            gathers = bucket_gathers(local, gather_mb)
        if order:
            order_collectives(local, prefetch)
        timings["bucket+order"] = time.perf_counter() - t3
    timings["total"] = time.perf_counter() - t0
    plan = _plan(g, local, m, s, prop, part, ann.notes + [f"replicated: {f}" for f in forced], timings)
    if buckets is not None or gathers is not None:
        plan.buckets = [{"op": b.op, "axis": b.axis, "members": list(b.members), "bytes": b.bytes}
                        for rep in (buckets, gathers) if rep is not None for b in rep.fused]
    plan.program_collectives = sum(1 for n in local.nodes if OPS[n.op].collective is not None)
    return ParallelProgram(g, local, m, s, plan, prop, part, source=graph, padding=ann.padding)


def _forced_replication(g: Graph, prop: PropagationReport) -> list[str]:
    """Ops without a rule whose operands arrive split or partial (a gather or reduction that
    only the missing rule forces)."""
    names = value_names(g)
    out = []
    for node in g.nodes:
        if sharding_spec(node.op, [o.type for o in node.operands], node.attrs) is not None:
            continue
        # The placements before the forced reshard are the producers' own.
        bad = [o for o in node.operands if o.placement is not None and not o.placement.is_replicated]
        if bad:
            res = ", ".join(f"%{names.get(r, '?')}" for r in node.results)
            line = f" (line {node.loc.line})" if node.loc is not None and getattr(node.loc, "line", None) else ""
            out.append(f"{res} = {node.op}{line} gets %{names.get(bad[0], '?')} placed {bad[0].placement}")
    return out


def _plan(g: Graph, local: Graph, mesh: Mesh, s: Strategy, prop: PropagationReport, part: PartitionReport,
          notes: list[str], timings: dict[str, float]) -> PlanReport:
    from ..autodiff.memory import backward_start

    names = value_names(g)
    order = {}
    start = backward_start(g)
    phase = "forward"
    for node in g.nodes:
        if node is start:
            phase = "backward"
        if node.op in UPDATE_OPS:
            ph = "update"
        else:
            ph = phase
        res = ", ".join(f"%{names.get(r, '?')}" for r in node.results)
        order[f"{res + ' = ' if res else ''}{node.op}"] = ph
        order[f"result of {res + ' = ' if res else ''}{node.op}"] = ph
    colls = []
    for c in part.collectives:
        ph = order.get(c.consumer, "output" if c.consumer.startswith("output") else "forward")
        colls.append({"op": c.op, "axis": c.axis, "value": c.value, "consumer": c.consumer,
                      "operand": c.operand, "have": str(c.have), "want": str(c.want), "bytes": c.bytes,
                      "phase": ph, "inside": c.inside, "source": c.source})
    param_b = sum(_nbytes(v) for v in local.inputs if v.role == "param")
    state_b = sum(_nbytes(v) for v in local.inputs if v.role == "state")
    from ..autodiff.memory import analyze

    # The peak of live bytes over the per-rank program's node order, inputs excluded.
    mem = analyze(local)
    act_b = max(mem.peak_bytes - mem.input_bytes, 0)
    gparam = sum(_nbytes(v) for v in g.inputs if v.role == "param")
    return PlanReport(mesh, str(s), dict(prop.placements), colls, list(prop.replicated), notes, param_b, state_b,
                      act_b, gparam, timings)
