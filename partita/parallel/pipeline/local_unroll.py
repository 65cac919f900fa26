"""Unroll a pipeline rank's one-microbatch template, after the SPMD partition, into the
rank's program for the whole step.

Parallelizing each stage's program costs what the program costs, so a pipeline does not
parallelize the step unrolled over ``M`` microbatches: it parallelizes a template with one
microbatch (every chunk's F, B and W, their sends and recvs, the gradient sums and the
optimizer: build.py, ``template=True``) and then copies the template's local pieces here,
once per schedule action. Compile time is then independent of ``M``, and the program grows
linearly in it.

Every node of the local template belongs to a section (what the partition made for one
global node belongs to that node's section): ``("F", c)``, ``("B", c)``, ``("W", c)`` are
copied per microbatch, as are the transfers ``("send"|"recv", "act"|"grad", c)`` (their
tags and names get the microbatch for "MB"); ``("tied",)``, ``("opt",)``, ``("tail",)`` are copied
once, where a value of the template that stands for a sum over the microbatches (a
parameter's gradient, the loss share) reads the sum this module builds instead.

Which schedule action each node of an unrolled program was made for is kept beside the
program (``schedule_actions``): ``(kind, mb, chunk)`` with kind ``F``, ``B`` (with its
``W`` when the backward is not split), ``W``, ``send-act``, ``send-grad``, ``recv-act``,
``recv-grad`` (a transfer's chunk is that of the action it serves on this rank: the sending
F or B, the receiving F or B), ``tied`` and ``opt`` (the once-per-step sections after the
last action; ``mb`` and ``chunk`` -1). The runtime times each action by it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from ...ir.builder import Builder
from ...ir.graph import Graph, Node, Value, bulk_build
from ...ir.types import TensorType
from ...ir.verifier import verify
from ...ops.registry import OPS
from .build import MB_AXIS
from .schedule import Action, PipelineError, Schedule, Transfer


# Per unrolled program: the schedule action each of its nodes was copied for (see the module's
# docstring). A side table, so the program's text and behaviour do not change.
_ACTIONS: "weakref.WeakKeyDictionary[Graph, dict[Node, tuple[str, int, int]]]" = weakref.WeakKeyDictionary()


# Per unrolled program: the adds that sum a gradient or the loss shares over the microbatches
# (one add per microbatch where the pipeline runs them; the simulator prices each alone).
_SUMS: "weakref.WeakKeyDictionary[Graph, set[Node]]" = weakref.WeakKeyDictionary()


def microbatch_sums(graph: Graph) -> set[Node]:
    """The adds of the unrolled pp rank program ``graph`` that sum a param's gradient or the
    loss shares over the microbatches (empty for a graph ``unroll_local`` did not make)."""
    return _SUMS.get(graph, set())


def schedule_actions(graph: Graph) -> dict[Node, tuple[str, int, int]] | None:
    """The ``(kind, mb, chunk)`` of the schedule action each node of the unrolled pp rank
    program ``graph`` was made for (nodes made for none, such as the microbatch slices or a
    pass's buckets, are absent); None for a graph ``unroll_local`` did not make."""
    return _ACTIONS.get(graph)


def _inherit(nodes: list[Node], out: dict[Node, tuple], default: tuple) -> None:
    """Give each node of ``nodes`` without a section its first reader's, else its operands'."""
    pos = {n: i for i, n in enumerate(nodes)}
    for n in reversed(nodes):
        if n in out:
            continue
        users = [u for r in n.results for u in r.users if u in out and u in pos]
        if users:
            out[n] = out[min(users, key=lambda u: pos[u])]
    for n in nodes:
        if n not in out:
            prods = [v.producer for v in n.operands if v.producer is not None and v.producer in out]
            out[n] = out[prods[-1]] if prods else default


def is_collective(node: Node) -> bool:
    """Whether ``node`` is a group-wide collective (all_reduce, all_gather, ...)."""
    return OPS[node.op].collective is not None


def local_sections(local: Graph, sections: dict[Node, tuple],
                   spans: dict[Node, list[Node]] | None, copy: "tuple[Graph, dict[Node, Node]] | None" = None
                   ) -> dict[Node, tuple]:
    """The section of every node of the local template ``local``: that of the template node
    it was made for (``spans``, keyed by the nodes of ``copy``'s graph, the strategies' copy
    of the template, whose original nodes ``copy``'s map names; None: ``local`` is the
    template itself). A node a strategy or the partition added takes its first reader's
    section, else its operands'; what partition adds for the outputs is ``("tail",)``. A
    collective a strategy's pass added on a microbatch's value for the optimizer or a tied
    weight's exchange (cp's all_reduce of a weight gradient over its tokens) is that
    microbatch's."""
    out: dict[Node, tuple] = {}
    if spans is None:
        return {n: sections.get(n, ("opt",)) for n in local.nodes}
    if copy is not None:
        g, origin = copy
        sec = {origin[n]: k for n, k in sections.items() if n in origin}
        _inherit(list(g.nodes), sec, ("opt",))
        sections = sec
    for gn, made in spans.items():
        key = sections.get(gn, ("opt",))
        for n in made:
            out[n] = key
    seen_last = False
    nodes = list(local.nodes)
    for n in reversed(nodes):
        if n in out:
            seen_last = True
            continue
        users = [u for r in n.results for u in r.users if u in out]
        source = n.operands[0].producer if n.operands and is_collective(n) else None
        if users and source is not None and source in out and out[source][0] in ("F", "B", "W") and \
                all(out[u][0] in ("opt", "tied") for u in users):
            out[n] = out[source]
        elif users:
            out[n] = out[min(users, key=lambda u: u._order)]
        elif not seen_last:
            out[n] = ("tail",)
    for n in nodes:
        if n not in out:
            prods = [v.producer for v in n.operands if v.producer is not None and v.producer in out]
            out[n] = out[prods[-1]] if prods else ("opt",)
    return out


class _Unroll:
    def __init__(self, local: Graph, section: dict[Node, tuple], sched: Schedule, rank: int, *,
                 batch: dict[str, int], chunk_grads: dict[int, list[tuple[str, Value]]],
                 acc_values: dict[str, Value], loss_share: Value | None,
                 finals: list[tuple[Value, int | None]], mesh: Any = None,
                 once_nodes: "set[Node] | None" = None) -> None:
        self.L = local
        self.once_nodes = once_nodes
        self.sched = sched
        self.rank = rank
        self.M = sched.microbatches
        self.batch = batch
        self.chunk_grads = chunk_grads
        self.acc_values = acc_values
        self.loss_share = loss_share
        self.finals = finals
        self.by_key: dict[tuple, list[Node]] = {}
        for n in local.nodes:
            self.by_key.setdefault(section[n], []).append(n)
        self.U = Graph(local.name)
        self.U.mesh = local.mesh if mesh is None else mesh
        self.U.loc = local.loc
        self.b = Builder(self.U)
        self.shared: dict[Value, Value] = {}
        self.env: list[dict[Value, Value]] = [dict() for _ in range(self.M)]
        self.once: dict[Value, Value] = {}
        self.last: dict[Value, Value] = {}
        self.acc: dict[str, Value] = {}
        self.loss_parts: list[Value] = []
        self.action_of: dict[Node, tuple[str, int, int]] = {}
        self.sum_nodes: set[Node] = set()

    def claim(self, before: int, key: tuple[str, int, int]) -> None:
        """Record ``key`` as the action of the nodes appended since the program had ``before`` nodes."""
        new = len(self.U) - before
        if new <= 0:
            return
        for n in self.U.reversed_nodes():
            self.action_of.setdefault(n, key)
            new -= 1
            if new == 0:
                break

    def lookup(self, v: Value, m: int | None) -> Value:
        if m is not None:
            # A microbatch's section reads its own microbatch's values (of any chunk on this
            # rank) and the step's inputs, nothing else.
            for d in (self.env[m], self.shared):
                if v in d:
                    return d[v]
        else:
            for d in (self.shared, self.once, self.last):
                if v in d:
                    return d[v]
        where = f"{v.producer.op}" if v.producer is not None else "an input"
        raise PipelineError(f"pipeline unroll (rank {self.rank}): the template's %{v.name or '?'} ({where}) is read "
                            f"{'for microbatch ' + str(m) if m is not None else 'once per step'} before it is made; "
                            "this is an internal error of the pipeline's sections")

    def copy(self, key: tuple, m: int | None) -> None:
        """Append a copy of section ``key`` for microbatch ``m`` (None: the once-per-step
        sections). The template is typed and verified: its nodes are copied with their
        types, not inferred again (the whole program is verified once at the end)."""
        store = self.env[m] if m is not None else self.once
        append = self.U._append_unchecked
        for n in self.by_key.get(key, ()):
            if n.op == "axis_index" and n.attrs.get("axis") == MB_AXIS:
                # The microbatch's index (a split dropout's origin along the batch): microbatch
                # m's copy knows it.
                if m is None:
                    raise PipelineError(f"pipeline unroll (rank {self.rank}): the microbatch index is read once per "
                                        "step; this is an internal error of the pipeline's sections")
                node = Node("full", [], {"shape": (), "value": m, "dtype": n.results[0].type.dtype},
                            [n.results[0].type], n.loc)
                append(node)
                store[n.results[0]] = self.last[n.results[0]] = node.results[0]
                continue
            attrs = dict(n.attrs)
            tag = attrs.get("tag")
            if m is not None and isinstance(tag, str):
                attrs["tag"] = tag.replace("MB", str(m))
            node = Node(n.op, [self.lookup(o, m) for o in n.operands], attrs, [r.type for r in n.results], n.loc)
            append(node)
            if m is None and self.once_nodes is not None:
                self.once_nodes.add(node)
            for a, x in zip(n.results, node.results):
                store[a] = x
                self.last[a] = x
                if a.name is not None and not str(a.name).isdigit():
                    x.name = str(a.name).replace("MB", str(m)) if m is not None else a.name

    def run(self, items: list[Action | Transfer]) -> Graph:
        with bulk_build():
            out = self._run(items)
        _ACTIONS[out] = self.action_of
        _SUMS[out] = self.sum_nodes
        return out

    def _run(self, items: list[Action | Transfer]) -> Graph:
        L, U, b = self.L, self.U, self.b
        for v in L.inputs:
            name = str(v.name)
            if name in self.batch:
                d = self.batch[name]
                shape = list(v.type.shape)
                full = TensorType(tuple(shape[:d] + [shape[d] * self.M] + shape[d + 1:]), v.type.dtype)
                x = U.add_input(name, full, v.role or "input")
                n = shape[d]
                for m in range(self.M):
                    self.env[m][v] = x if self.M == 1 else \
                        b.slice(x, axis=d, start=m * n, end=(m + 1) * n, name=f"{name}.mb{m}")
            else:
                self.shared[v] = U.add_input(name, v.type, v.role or "input")
        U.weights = type(L.weights)(dict(L.weights))
        split = self.sched.split
        tied_done = False
        for it in items:
            before = len(U)
            self.item(it, split, tied_done)
            if isinstance(it, Transfer) and it.what == "tied":
                tied_done = True
            self.claim(before, action_key(it, self.rank))
        before = len(U)
        self.sums()
        self.copy(("loss",), None)
        self.copy(("final",), None)
        self.copy(("opt",), None)
        self.copy(("tail",), None)
        self.claim(before, ("opt", -1, -1))
        return self.finish()

    def item(self, it: "Action | Transfer", split: bool, tied_done: bool) -> None:
        """Append the copies of the sections one schedule item runs on this rank."""
        if isinstance(it, Action):
            c, m = it.chunk, it.mb
            if it.kind == "F":
                self.copy(("F", c), m)
                if self.loss_share is not None and c == self.sched.chunks - 1:
                    self.loss_parts.append(self.env[m][self.loss_share])
            elif it.kind == "B":
                self.copy(("B", c), m)
                if not split:
                    self.copy(("W", c), m)
                    self.accumulate(c, m)
            else:
                self.copy(("W", c), m)
                self.accumulate(c, m)
            return
        t = it
        if t.what == "tied":
            # The tied section holds both directions of the exchange, in this rank's
            # order: it is copied once, at the first of the two transfers.
            if not tied_done:
                self.sums()
                self.copy(("tied",), None)
            return
        if t.src == t.dst:
            return  # both chunks here: the later one reads the earlier's values directly
        assert t.after is not None
        c, m = t.after.chunk, t.after.mb
        side = "send" if t.src == self.rank else "recv"
        self.copy((side, t.what, c), m)

    def finish(self) -> Graph:
        """The program's outputs (the microbatches' pieces put back together), verified."""
        L, U, b = self.L, self.U, self.b
        outs = []
        for v in L.outputs:
            fin = next((d for x, d in self.finals if x is v), "none")
            if fin != "none":
                parts = [self.env[m][v] if v in self.env[m] else self.lookup(v, m) for m in range(self.M)]
                if fin is None and self.M > 1:
                    raise PipelineError("pipeline: an output without a batch dim cannot be put back together from "
                                        "the microbatches; use microbatches=1")
                outs.append(parts[0] if self.M == 1 else b.concat(*parts, axis=int(fin)))  # type: ignore[arg-type]
            else:
                outs.append(self.lookup(v, None))
        by_name = {str(x.name): x for x in U.inputs}
        aliases = [None if a is None else by_name.get(str(a.name)) for a in (L.output_aliases or [None] * len(outs))]
        U.set_outputs(outs, aliases)
        verify(U)
        return U

    def accumulate(self, c: int, m: int) -> None:
        for nm, gv in self.chunk_grads.get(c, []):
            val = self.lookup(gv, m)
            if nm in self.acc:
                val = self.b.add(self.acc[nm], val)
                self.sum_nodes.add(val.producer)
            self.acc[nm] = val

    def sums(self) -> None:
        """What the once-per-step sections read in place of one microbatch's values: each
        param's gradient summed over the microbatches, and the loss shares' sum."""
        for nm, v in self.acc_values.items():
            if nm in self.acc:
                self.once[v] = self.acc[nm]
        if self.loss_share is not None and self.loss_parts:
            total = self.loss_parts[0]
            for x in self.loss_parts[1:]:
                total = self.b.add(total, x)
                self.sum_nodes.add(total.producer)
            self.once[self.loss_share] = total
            self.loss_parts = [total]


def action_key(it: "Action | Transfer", rank: int) -> tuple[str, int, int]:
    """``(kind, mb, chunk)`` of a schedule item as pp rank ``rank`` runs it (the module's docstring)."""
    if isinstance(it, Action):
        return (it.kind, it.mb, it.chunk)
    if it.what == "tied" or it.after is None:
        return ("tied", -1, -1)
    if it.src == rank:
        return (f"send-{it.what}", it.after.mb, it.after.chunk)
    served = it.before if it.before is not None else it.after
    return (f"recv-{it.what}", served.mb, served.chunk)


def unroll_local(local: Graph, sections: dict[Node, tuple], sched: Schedule, rank: int, items: list[Any], *,
                 batch: dict[str, int], chunk_grads: dict[int, list[tuple[str, Value]]],
                 acc_values: dict[str, Value], loss_share: Value | None,
                 finals: list[tuple[Value, int | None]], mesh: Any = None,
                 once_nodes: "set[Node] | None" = None) -> Graph:
    """The program of pp rank ``rank`` for ``sched`` (its ``items``: actions and transfers in
    program order) from its local template ``local`` whose nodes' ``sections`` are known;
    ``batch``: the batch inputs by name with their batch dim; the rest as the template's
    RankProgram records them, mapped to the local template's values; ``mesh``: the whole
    mesh the program runs on (the template's is its stage's). ``once_nodes``: filled with the
    nodes of the once-per-step sections (the gradient reductions the pipeline buckets)."""
    return _Unroll(local, sections, sched, rank, batch=batch, chunk_grads=chunk_grads, acc_values=acc_values,
                   loss_share=loss_share, finals=finals, mesh=mesh, once_nodes=once_nodes).run(items)


# Sections copied once per step (the others once per microbatch).
ONCE_SECTIONS = frozenset({"tied", "loss", "final", "opt", "tail"})


@dataclass
class LocalTemplate:
    """What ``unroll_local`` needs of one pp rank, kept instead of the unrolled program when
    the pipeline is built with ``unroll=False`` (for the section-level simulation,
    partita/cluster/simulator.py): the parallelized one-microbatch template, its nodes'
    sections, the rank's schedule items in program order, and the values the unroll maps."""

    rank: int
    local: Graph
    sections: dict[Node, tuple]
    sched: Schedule
    items: list[Any]
    batch: dict[str, int]
    chunk_grads: dict[int, list[tuple[str, Value]]]
    acc_values: dict[str, Value]
    loss_share: Value | None
    finals: list[tuple[Value, int | None]]


__all__ = ["LocalTemplate", "ONCE_SECTIONS", "action_key", "local_sections", "schedule_actions", "unroll_local"]
