"""Padding a dimension so that a mesh axis divides it (the vocabulary of a vocab-parallel model).

A placement splits a dim only when the mesh axes divide it (``Placement.validate``). GPT-2's
vocabulary has 50,257 words, which no even tensor-parallel axis divides, so without padding
its token table (a third of GPT-2 small's params) would stay whole on every rank. Megatron-LM
pads the vocabulary with unused rows; ``pad_dims`` does that to the global graph, before
propagation, as a rewrite whose meaning is checked like any pass's: run on inputs padded
with zeros, the padded graph gives the original's outputs in their first ``size`` entries.

What the rewrite does, from a seed (a param's dim, usually a token table's rows):

1. The *class* of the seed: every (value, dim) that the ops' sharding rules (``DimSpec``)
   label as the same index space, found by union-find over the graph. The params and
   optimizer state in it are padded (they are stored padded on the ranks: ``shard_weights``
   pads the user's arrays with zero rows, ``assemble_weights`` drops the rows again).
2. A forward walk carries the padding from operands to results where the op is safe on a
   padded dim, and keeps track of which padded values hold zeros in their padding:
   - a label that reaches a result (elementwise ops, transposes, a matmul's free dims, the
     optimizer updates) passes the padding on; whether the result's padding holds zeros is the
     op record's ``pad_zeros`` fact (ops/registry.py, ``PAD_ZEROS``);
   - a label the op sums over (a matmul's contraction) is safe when the padding is zero
     (for a product, in one operand): the extra terms add nothing;
   - a ranged label (an index range the op looks up) is safe where the record's
     ``pad_ranged`` says so: ``embedding`` over a padded table never reads the padded rows
     (ids are below the real size, checked at run time against it); ``embedding_grad`` gives
     zero rows there (its ``size_attrs`` restate ``num_embeddings``);
   - ``cross_entropy`` and its gradient over padded classes (``pad_logits``: the operand of
     the logits) get the logits plus a constant that is ``-inf`` on the padded classes, whose
     exponentials are then 0: the loss and the gradient are the unpadded ones, and the
     gradient's padded classes are zeros;
   - anything else (a softmax or a mean along the padded dim, an op without a rule, label
     smoothing, an operand of the same index that is not padded) gets its operand cut back to
     the real size with a ``slice`` first, so it sees exactly what it saw before.
3. Every op whose operand types changed is re-typed by its own type rule; a disagreement
   with the predicted padded types makes the op take the cut-back operands instead.

Outputs keep their padding; ``PadReport`` says which outputs and inputs are padded on which
dims, so that the caller pads what goes in and cuts what comes out. A new param or state
output is forced to hold zeros in its padding (a multiply by a 0/1 mask where the walk could
not show it), so that the next step's input is zero-padded again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..ir.attrs import DenseAttr
from ..ir.builder import Builder
from ..ir.diagnostics import PartitaError
from ..ir.graph import Graph, Node, Value, input_name
from ..ir.types import TensorType
from ..ops.registry import OPS
from .sharding import DimSpec, sharding_spec



@dataclass
class PadReport:
    """What ``pad_dims`` padded: ``inputs`` and ``outputs`` map an input's name (an output's
    index) to ``{dim: real size}``; ``values`` the same for every padded value of the graph
    (the partition's local forms check ids and targets against the real sizes); ``cut`` names
    the ops that needed the real size back (a gather of the padded dim on the ranks)."""

    size: int = 0
    padded: int = 0
    inputs: dict[str, dict[int, int]] = field(default_factory=dict)
    outputs: dict[int, dict[int, int]] = field(default_factory=dict)
    values: dict[Value, dict[int, int]] = field(default_factory=dict)
    cut: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.inputs)


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[tuple[Value, int], tuple[Value, int]] = {}

    def find(self, x: tuple[Value, int]) -> tuple[Value, int]:
        root = x
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while x != root:
            nxt = self.parent.get(x, x)
            self.parent[x] = root
            x = nxt
        return root

    def union(self, a: tuple[Value, int], b: tuple[Value, int]) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


def index_classes(graph: Graph) -> _UnionFind:
    """Union-find over (value, dim): dims that some op's sharding rule labels alike."""
    uf = _UnionFind()
    for node in graph.nodes:
        spec = sharding_spec(node.op, [o.type for o in node.operands], node.attrs)
        if spec is None:
            continue
        first: dict[str, tuple[Value, int]] = {}
        for vals, labels in ((node.operands, spec.operands), (node.results, spec.results)):
            for v, labs in zip(vals, labels):
                for d, lab in enumerate(labs):
                    if lab is None:
                        continue
                    if lab in first:
                        uf.union(first[lab], (v, d))
                    else:
                        first[lab] = (v, d)
    return uf


def pad_dims(graph: Graph, seeds: Sequence[tuple[Value, int]], multiple: int) -> PadReport:
    """Pad, in place, the index class of each seed ``(input, dim)`` to a multiple of
    ``multiple`` (see the module docstring). Returns what was padded; an empty report when
    the seeds' sizes already divide or nothing could be padded."""
    return _Padder(graph, multiple).run(seeds)


class _Padder:
    def __init__(self, graph: Graph, multiple: int) -> None:
        self.g = graph
        self.multiple = multiple
        self.pads: dict[Value, dict[int, int]] = {}  # padded value -> {dim: real size}
        self.zero: set[Value] = set()  # padded values whose padding holds zeros
        self.cuts: dict[tuple[Value, int], Value] = {}
        self.masked: dict[Value, Value] = {}
        self.report = PadReport()
        self.classes = _UnionFind()
        self.roots: dict[tuple[Value, int], int] = {}  # class root -> real size

    def padded_size(self, n: int) -> int:
        return -(-n // self.multiple) * self.multiple

    def run(self, seeds: Sequence[tuple[Value, int]]) -> PadReport:
        uf = index_classes(self.g)
        # A master copy <p>.master (adamw's master_weights) indexes as its param <p> does, even
        # where nothing in the graph joins them (a pipeline stage whose tied weight's gradient
        # arrives from another stage): it is padded with it.
        by_name = {str(v.name): v for v in self.g.inputs}
        for v in self.g.inputs:
            nm = str(v.name)
            p = by_name.get(nm[:-len(".master")]) if v.role == "state" and nm.endswith(".master") else None
            if p is not None and p.type.shape == v.type.shape:
                for d in range(v.type.rank):
                    uf.union((v, d), (p, d))
        roots = {}
        for v, d in seeds:
            n = v.type.shape[d]
            if n % self.multiple:
                roots[uf.find((v, d))] = n
        if not roots:
            return self.report
        found: list[tuple[Value, int, int]] = []
        for v in self.g.inputs:
            for d, n in enumerate(v.type.shape):
                r = uf.find((v, d))
                if r in roots and roots[r] == n and v.role in ("param", "state"):
                    found.append((v, d, n))
        # Only classes that hold a param are worth padding (and then the walk changes the graph).
        roots = {r: n for r, n in roots.items() if any(uf.find((v, d)) == r for v, d, _ in found)}
        if not roots:
            return self.report
        for v, d, n in found:
            self.pad_input(v, d, n)
        self.classes = uf
        self.roots = roots
        for node in list(self.g.nodes):
            self.visit(node)
        self.finish_outputs()
        names = {v: input_name(v) for v in self.g.inputs}
        self.report.inputs = {names[v]: dict(p) for v, p in self.pads.items() if v.is_input}
        self.report.values = {v: dict(p) for v, p in self.pads.items()}
        if self.report.inputs:
            n = next(iter(roots.values()))
            self.report.size, self.report.padded = n, self.padded_size(n)
        return self.report

    def pad_input(self, v: Value, d: int, n: int) -> None:
        """Pad dim ``d`` of graph input ``v`` (real size ``n``); the caller pads its arrays
        with zeros, so its padding holds zeros."""
        shape = list(v.type.shape)
        shape[d] = self.padded_size(n)
        v.type = TensorType(tuple(shape), v.type.dtype)
        self.pads.setdefault(v, {})[d] = n
        self.zero.add(v)

    def in_class(self, v: Value, d: int) -> int | None:
        """The real size when (v, d) belongs to a padded class, else None."""
        n = self.roots.get(self.classes.find((v, d)))
        return n if n is not None and v.type.shape[d] == n else None

    # --- one node -----------------------------------------------------------------------
    def visit(self, node: Node) -> None:
        if not any(o in self.pads for o in node.operands):
            self.source(node)
            return
        old = [self.real_type(o) for o in node.operands]
        spec = sharding_spec(node.op, old, node.attrs)
        if spec is None:
            self.cut_all(node, "has no sharding rule")
            return
        unsafe = self.unsafe_labels(node, spec)
        if unsafe:
            self.cut_labels(node, spec, unsafe)
            if not any(o in self.pads for o in node.operands):
                return
        self.retype(node, spec, old)

    def real_type(self, v: Value) -> TensorType:
        p = self.pads.get(v)
        if not p:
            return v.type
        shape = list(v.type.shape)
        for d, n in p.items():
            shape[d] = n
        return TensorType(tuple(shape), v.type.dtype)

    def unsafe_labels(self, node: Node, spec: DimSpec) -> dict[str, str]:
        """The padded labels of ``node`` the op cannot take padded, with the reason."""
        carriers: dict[str, list[tuple[int, int]]] = {}
        for i, labels in enumerate(spec.operands):
            for d, lab in enumerate(labels):
                if lab is not None:
                    carriers.setdefault(lab, []).append((i, d))
        out: dict[str, str] = {}
        in_results = {lab for r in spec.results for lab in r if lab is not None}
        ops = node.operands
        for i, o in enumerate(ops):
            for d in self.pads.get(o, {}):
                lab = spec.operands[i][d]
                if lab is None:
                    out[f"#{i}.{d}"] = "needs the dim whole"
                    continue
                if lab in out:
                    continue
                group = carriers[lab]
                if any(d2 not in self.pads.get(ops[j], {}) for j, d2 in group):
                    out[lab] = "reads it beside an operand that is not padded"
                elif lab in spec.averages:
                    out[lab] = "averages over it"
                elif lab in spec.ranged:
                    why = self.ranged_ok(node, lab)
                    if why:
                        out[lab] = why
                elif lab in in_results:
                    continue
                elif lab in spec.sums:
                    zeros = [ops[j] in self.zero for j, _ in group]
                    if not (all(zeros) or (OPS[node.op].pad_zeros == "any" and any(zeros))):
                        out[lab] = "sums over it, and its padding may not be zero"
                else:
                    out[lab] = "needs the dim whole"
        return out

    def ranged_ok(self, node: Node, lab: str) -> str | None:
        check = OPS[node.op].pad_ranged
        return "has no padded form" if check is None else check(node.attrs)

    def cut(self, v: Value, d: int, before: Node) -> Value:
        key = (v, d)
        if key not in self.cuts:
            b = Builder(self.g).set_insertion_before(before)
            n = self.pads[v][d]
            c = b.emit("slice", v, axis=d, start=0, end=n, loc=before.loc)
            rest = {k: m for k, m in self.pads[v].items() if k != d}
            if rest:
                self.pads[c] = rest
                if v in self.zero:
                    self.zero.add(c)
            self.cuts[key] = c
        return self.cuts[key]

    def cut_all(self, node: Node, why: str) -> None:
        for i, o in enumerate(list(node.operands)):
            v = o
            for d in list(self.pads.get(o, {})):
                v = self.cut(v, d, node)
            if v is not o:
                self.g.set_operand(node, i, v)
        self.report.cut.append(f"{node.op} ({why})")

    def cut_labels(self, node: Node, spec: DimSpec, unsafe: dict[str, str]) -> None:
        for i, o in enumerate(list(node.operands)):
            v = o
            for d in sorted(self.pads.get(o, {})):
                lab = spec.operands[i][d]
                if (lab if lab is not None else f"#{i}.{d}") in unsafe:
                    v = self.cut(v, d, node)
            if v is not o:
                self.g.set_operand(node, i, v)
        self.report.cut.append(f"{node.op} ({'; '.join(sorted(set(unsafe.values())))})")

    def source(self, node: Node) -> None:
        """A node without padded operands whose result is in a padded class and whose
        attributes give its sizes (``size_attrs``: embedding_grad's rows come from
        num_embeddings) is made padded at once, when its type rule agrees."""
        opdef = OPS[node.op]
        if opdef.size_attrs is None or len(node.results) != 1:
            return
        r = node.results[0]
        p = {d: n for d in range(r.type.rank) if (n := self.in_class(r, d)) is not None}
        if not p:
            return
        shape = list(r.type.shape)
        for d, n in p.items():
            shape[d] = self.padded_size(n)
        want = TensorType(tuple(shape), r.type.dtype)
        try:
            attrs = opdef.normalize_attrs(opdef.size_attrs(dict(node.attrs), [want]))
            got = opdef.infer_types([o.type for o in node.operands], attrs)
        except PartitaError:  # the sizes do not come from the attributes alone (a reshape)
            return
        if list(got) != [want]:
            return
        node.attrs = attrs
        r.type = want
        self.pads[r] = p
        if opdef.pad_zeros == "always":
            self.zero.add(r)

    def retype(self, node: Node, spec: DimSpec, old: list[TensorType]) -> None:
        ops = node.operands
        label_size: dict[str, int] = {}
        label_real: dict[str, int] = {}
        for i, o in enumerate(ops):
            for d, n in self.pads.get(o, {}).items():
                lab = spec.operands[i][d]
                if lab is not None:
                    label_size[lab] = o.type.shape[d]
                    label_real[lab] = n
        k = OPS[node.op].pad_logits
        if k is not None:
            self.mask_logits(node, k)
            ops = node.operands
        want: list[TensorType] = []
        pads: list[dict[int, int]] = []
        for r, labels in zip(node.results, spec.results):
            shape = list(r.type.shape)
            p: dict[int, int] = {}
            for d, lab in enumerate(labels):
                if lab in label_size:
                    shape[d] = label_size[lab]
                    p[d] = label_real[lab]
            want.append(TensorType(tuple(shape), r.type.dtype))
            pads.append(p)
        attrs = self.new_attrs(node, spec, old, want)
        opdef = OPS[node.op]
        try:
            got = opdef.infer_types([o.type for o in ops], opdef.normalize_attrs(attrs))
        except Exception:  # noqa: BLE001 - the op's type rule refuses: take the real sizes
            got = None
        if got is None or list(got) != want:
            self.cut_all(node, "its type rule does not follow the padding")
            return
        node.attrs = opdef.normalize_attrs(attrs)
        for r, t, p in zip(node.results, want, pads):
            r.type = t
            if p:
                self.pads[r] = p
                if self.result_zero(node, spec, r, p):
                    self.zero.add(r)

    def new_attrs(self, node: Node, spec: DimSpec, old: list[TensorType], want: list[TensorType]) -> dict:
        attrs = dict(node.attrs)
        size_attrs = OPS[node.op].size_attrs
        if size_attrs is not None:
            return size_attrs(attrs, want)
        if spec.localize is not None:
            attrs = spec.localize_attrs(attrs, [o.type for o in node.operands], old)
        return attrs

    def result_zero(self, node: Node, spec: DimSpec, r: Value, p: dict[int, int]) -> bool:
        """Whether ``r``'s padding holds zeros, from the record's ``pad_zeros`` fact."""
        fact = OPS[node.op].pad_zeros
        if fact == "always":
            return True
        k = node.results.index(r)
        for d in p:
            lab = spec.results[k][d]
            carriers = [(i, o) for i, (o, labels) in enumerate(zip(node.operands, spec.operands)) if lab in labels]
            zeros = [o in self.zero for _, o in carriers]
            if fact == "any" and any(zeros):
                continue
            if fact in ("all", "all_operands") and zeros and all(zeros) and \
                    (fact == "all" or len(carriers) == len(node.operands)):
                continue
            return False
        return True

    def mask_logits(self, node: Node, k: int) -> None:
        """Give the cross_entropy (or its gradient) at ``node`` logits that are -inf on the
        padded classes: their exponentials vanish from the softmax."""
        logits = node.operands[k]
        if logits not in self.masked:
            cdim = 1 if logits.type.rank >= 2 else 0
            real = self.pads[logits][cdim]
            width = logits.type.shape[cdim]
            shape = (width,) + (1,) * (logits.type.rank - cdim - 1)
            mask = np.zeros(shape, logits.type.dtype.np)
            mask[real:] = -np.inf
            b = Builder(self.g).set_insertion_before(node)
            const = b.emit("constant", value=DenseAttr(mask), loc=node.loc)
            const.name = f"{logits.name or 'logits'}.pad_mask"
            masked = b.emit("add", logits, const, loc=node.loc)
            self.pads[const] = {0: real}
            self.pads[masked] = dict(self.pads[logits])
            self.masked[logits] = masked
        self.g.set_operand(node, k, self.masked[logits])

    def finish_outputs(self) -> None:
        """Record the outputs' padding; a new param or state that may hold non-zeros in its
        padding is multiplied by a 0/1 mask, so that the next step's input is zero-padded."""
        outs = list(self.g.outputs)
        aliases = list(self.g.output_aliases or [None] * len(outs))
        changed = False
        for i, (v, a) in enumerate(zip(outs, aliases)):
            p = self.pads.get(v)
            if not p:
                continue
            if a is not None and v not in self.zero:
                b = Builder(self.g).set_insertion_end()
                for d, n in p.items():
                    shape = [1] * v.type.rank
                    shape[d] = v.type.shape[d]
                    keep = np.zeros(shape, v.type.dtype.np)
                    keep[(slice(None),) * d + (slice(0, n),)] = 1
                    new = b.emit("mul", v, b.emit("constant", value=DenseAttr(keep)))
                    self.pads[new] = dict(p)
                    v = new
                self.zero.add(v)
                outs[i] = v
                changed = True
            self.report.outputs[i] = dict(p)
        if changed:
            self.g.set_outputs(outs, aliases if self.g.output_aliases else None)


def pad_array(arr: np.ndarray, dims: dict[int, int], shape: Sequence[int]) -> np.ndarray:
    """``arr`` (real sizes) with zeros appended along the padded ``dims`` up to ``shape``."""
    arr = np.asarray(arr)
    widths = [(0, shape[d] - arr.shape[d]) if d in dims else (0, 0) for d in range(arr.ndim)]
    if any(w for _, w in widths):
        return np.pad(arr, widths)
    return arr


def cut_array(arr: np.ndarray, dims: dict[int, int]) -> np.ndarray:
    """``arr`` cut back to the real sizes along the padded ``dims``."""
    arr = np.asarray(arr)
    return arr[tuple(slice(0, dims[d]) if d in dims else slice(None) for d in range(arr.ndim))]


__all__ = ["PadReport", "pad_dims", "index_classes", "pad_array", "cut_array"]
