"""Sharding rules: how each op's operand placements determine its result placements.

A rule is a function ``(operand types, attrs) -> DimSpec`` kept in the rule table
``RULES`` below (a ``RuleTable`` of ops/registry.py, read as ``op.sharding``). A ``DimSpec`` labels every dimension of every operand and result, in the
manner of an einsum: dims that carry the same label are the same index space and must be
split the same way; a label that reaches a result passes its split on; a label in ``sums`` is
contracted by a sum, so splitting it leaves each rank with a summand (the results without it
are ``partial`` over those axes); a label in ``averages`` is averaged over, so a rank's result
is n times its share and the partition scales it by 1/n; a dim labelled ``None`` may not be
split at all. ``result_placements`` applies a spec to concrete placements; the propagation,
reshard and partition passes build on it. Ops without a rule are replicated by those passes;
``WITHOUT_RULE`` lists them with the reason (only ops without operands remain).

The rules live in this one table (like the vjp rules in ``autodiff/rules.py``); an elementwise
op without one gets the broadcast rule (the table's fallback). See docs/parallel.md,
"Sharding rules".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ..ir.types import TensorType
from ..ops.registry import OPS, OpDef, RuleTable, broadcast_shapes, normalize_axes, normalize_axis
from ..ops.shape import squeeze_axes, transpose_perm, unsqueeze_axes
from . import local_forms
from .local_forms import LocalForm
from ..ir.mesh import Mesh
from ..ir.placement import Placement, PlacementError

Labels = tuple  # tuple[str | None, ...]


@dataclass(frozen=True)
class DimSpec:
    """The sharding rule of one op instance.

    operands: a label per dim of each operand (None: that dim may not be split).
    results: a label per dim of each result (None: that result dim is never split).
    sums: labels contracted by a sum in every result that lacks them: splitting one makes
      those results partial over its axes, while a result that carries the label is split
      (layer_norm_grad's dx is split over the batch, its dweight a pending sum over it). A
      label that is not in ``sums`` but reaches only some results says that the others do
      not depend on the dims it labels (conv2d_grad's dbias never reads x's channels): they
      come out whole on every rank.
    averages: labels the op averages over (``mean``'s reduced dims, ``cross_entropy``'s
      targets with reduction "mean"): a rank averages over its local piece, which is n times
      its share of the global average when the label is split over mesh axes of total size
      n. ``average_factor`` gives n; the partition multiplies the float results by 1/n.
    linear: operands the op is linear in, so a partial operand may pass through as a partial
      result. With ``joint`` false (mul, matmul), the op is linear in each of them separately:
      exactly one operand may be partial over a given axis, the others not using that axis.
      With ``joint`` true (add, sub, concat, where's branches), the op is linear in all of
      them together: every operand of ``linear`` must be partial over the axis (add(x1, y) +
      add(x2, y) is x + 2y, not x + y).
    localize: ``(attrs, local operand types, global operand types) -> attrs`` for ops whose
      attributes mention sizes of split dims (reshape, broadcast_to, squeeze without axes);
      None means the global attributes are right for the local pieces.
    ranged: labels the op accepts split although the op itself, run on local pieces, would
      be wrong: a rank then runs ``local_form`` instead (see ``partita.parallel.local_forms``),
      which learns the range of the label it holds at run time (``axis_index``) and may talk
      to the other ranks (the distributed log-sum-exp of a cross_entropy over split classes).
      A ranged label in ``sums`` gives partial results as any sum; one in neither ``results``
      nor ``sums`` comes out whole, completed by the form's own collectives.
    Labels present in operands but neither in results nor in ``sums`` (nor ``ranged``) must
    stay unsplit (the reduced dims of max/min/argmax, the axis of cumsum).
    made: ranged labels of the results that no operand carries: a rank may compute only its
      piece of those dims (``local_form``), which its operands do not tell; the axes come
      from the caller (``result_placements``'s ``made``; propagation tries the axes the
      result's consumers or its param are split over). ``embedding_grad``'s vocabulary:
      a rank holding the table's rows computes the gradient of those rows only.
    """

    operands: tuple[Labels, ...]
    results: tuple[Labels, ...]
    sums: frozenset[str] = frozenset()
    linear: frozenset[int] = frozenset()
    joint: bool = False
    averages: frozenset[str] = frozenset()
    localize: Callable[[dict, Sequence[TensorType], Sequence[TensorType]], dict] | None = \
        field(default=None, compare=False)
    ranged: frozenset[str] = frozenset()
    local_form: "Callable[[LocalForm], list] | None" = field(default=None, compare=False)
    made: frozenset[str] = frozenset()

    def __hash__(self) -> int:
        # Specs key result_placements' memo: the hash of the compared fields, computed once.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.operands, self.results, self.sums, self.linear, self.joint, self.averages,
                      self.ranged, self.made))
            object.__setattr__(self, "_hash", h)
        return h

    def splittable(self) -> tuple[str, ...]:
        """Labels that may be split, in order of first appearance in the operands."""
        out: list[str] = []
        keep = {lab for r in self.results for lab in r if lab is not None} | set(self.sums)
        for labels in self.operands:
            for lab in labels:
                if lab is not None and lab in keep and lab not in out:
                    out.append(lab)
        return tuple(out)

    def localize_attrs(self, attrs: dict, local: Sequence[TensorType], global_: Sequence[TensorType]) -> dict:
        """The attributes a rank runs the op with on its local operands."""
        return dict(attrs) if self.localize is None else self.localize(dict(attrs), local, global_)


@dataclass(frozen=True)
class Conflict:
    """Operand placements that the rule does not accept: ``operands`` are the operand
    indices involved, ``label`` the label in question (or None), ``message`` says why."""

    message: str
    operands: tuple[int, ...] = ()
    label: str | None = None

    def __str__(self) -> str:
        return self.message


# result_placements' answers by (spec, operand placements, shapes, mesh, result shapes, made):
# a pipeline rank's template asks the same few hundred questions tens of thousands of times
# (every layer alike). Emptied when full.
_RESULTS_MEMO: "dict[tuple, list[Placement] | Conflict]" = {}
_RESULTS_MEMO_MAX = 1 << 16


def result_placements(spec: DimSpec, operand_placements: Sequence[Placement | None],
                      types: Sequence[TensorType], mesh: Mesh,
                      result_types: Sequence[TensorType] | None = None,
                      made: "Mapping[str, tuple[str, ...]] | None" = None) -> "list[Placement] | Conflict":
    """Apply ``spec`` to the operands' placements (None: replicated).

    Returns the result placements, or a ``Conflict`` saying which operands disagree or which
    dim may not be split. With ``result_types``, the result placements are also checked to
    divide their shapes (a reshape that splits a dim into an odd leading factor). ``made``:
    the mesh axes of the rule's ``made`` labels (result dims a rank computes its piece of),
    which the operands must not use. The answers are memoized (they depend on nothing else).
    """
    key = (spec, tuple(operand_placements), tuple([t.shape for t in types]), mesh,
           None if result_types is None else tuple([t.shape for t in result_types]),
           tuple(made.items()) if made else None)
    try:
        got = _RESULTS_MEMO.get(key)
    except TypeError:  # an unhashable argument (made's axes as a list): not memoized
        return _result_placements(spec, operand_placements, types, mesh, result_types, made)
    if got is None:
        got = _result_placements(spec, operand_placements, types, mesh, result_types, made)
        if len(_RESULTS_MEMO) >= _RESULTS_MEMO_MAX:
            _RESULTS_MEMO.clear()
        _RESULTS_MEMO[key] = got
    return got if isinstance(got, Conflict) else list(got)


def _result_placements(spec: DimSpec, operand_placements: Sequence[Placement | None],
                       types: Sequence[TensorType], mesh: Mesh,
                       result_types: Sequence[TensorType] | None,
                       made: "Mapping[str, tuple[str, ...]] | None") -> "list[Placement] | Conflict":
    """``result_placements`` computed (not memoized)."""
    pls = [Placement.replicated(t.rank) if p is None else p for p, t in zip(operand_placements, types)]
    if len(pls) != len(spec.operands):
        return Conflict(f"the rule has {len(spec.operands)} operand(s) but {len(pls)} placements were given")
    label_axes: dict[str, tuple[str, ...]] = {}
    label_from: dict[str, tuple[int, int]] = {}
    for i, (p, labels) in enumerate(zip(pls, spec.operands)):
        if p.rank != len(labels):
            return Conflict(f"operand {i} has rank {len(labels)} but its placement has {p.rank} dims", (i,))
        for d, (lab, axes) in enumerate(zip(labels, p.dims)):
            if lab is None:
                if axes:
                    return Conflict(f"dim {d} of operand {i} may not be split (it is split over "
                                    f"{'@'.join(axes)}); the op needs it whole", (i,))
                continue
            if lab not in label_axes:
                label_axes[lab], label_from[lab] = axes, (i, d)
            elif label_axes[lab] != axes:
                j, e = label_from[lab]
                return Conflict(f"dim {e} of operand {j} ({_show(label_axes[lab])}) and dim {d} of operand {i} "
                                f"({_show(axes)}) are the same index '{lab}' and must be split alike", (j, i), lab)
    in_results = {lab for r in spec.results for lab in r if lab is not None}
    for lab, axes in label_axes.items():
        if axes and lab not in in_results and lab not in spec.sums and lab not in spec.ranged:
            i, d = label_from[lab]
            return Conflict(f"dim {d} of operand {i} is reduced by a non-sum (index '{lab}') and may not be "
                            f"split (it is split over {'@'.join(axes)})", (i,), lab)
    # Partial operands: allowed only where the op is linear in them (see DimSpec.linear).
    partial_axes: list[str] = []
    for a in sorted({a for p in pls for a in p.partial}):
        holders = tuple(i for i, p in enumerate(pls) if a in p.partial)
        bad = [i for i in holders if i not in spec.linear]
        if bad:
            return Conflict(f"operand {bad[0]} is a partial sum over '{a}', but the op is not linear in it; "
                            f"reduce it first", (bad[0],))
        if spec.joint and set(holders) != set(spec.linear):
            return Conflict(f"operands {sorted(holders)} are partial sums over '{a}' but the op is linear only in "
                            f"operands {sorted(spec.linear)} together; make all of them partial over '{a}' or none",
                            holders)
        if not spec.joint and len(holders) > 1:
            return Conflict(f"operands {list(holders)} are all partial sums over '{a}', but the op is linear in "
                            f"one operand at a time; reduce all but one", holders)
        users = [i for i, p in enumerate(pls) if i not in holders and a in p.axes_used()]
        if users:
            return Conflict(f"operand {users[0]} uses mesh axis '{a}' while operand {holders[0]} is a partial "
                            f"sum over it; the other operands must be replicated over '{a}'", (users[0], holders[0]))
        partial_axes.append(a)
    if made:
        used = {a for p in pls for a in p.axes_used()} | {a for p in pls for a in p.partial}
        for lab, axes in made.items():
            if lab not in spec.made:
                return Conflict(f"the rule computes no piece of index '{lab}' by itself")
            if not axes:
                continue
            if used & set(axes):
                return Conflict(f"the operands use {'@'.join(sorted(used & set(axes)))}, over which the result's "
                                f"index '{lab}' would be split; gather them first", (), lab)
            label_axes[lab] = tuple(axes)
    out = []
    for labels in spec.results:
        # A summed label splits the results that carry it and leaves a summand in the others.
        summed = [a for lab in sorted(spec.sums) if lab not in labels for a in label_axes.get(lab, ())]
        out.append(Placement(tuple(label_axes.get(lab, ()) if lab is not None else () for lab in labels),
                             tuple(dict.fromkeys(partial_axes + summed))))
    if result_types is not None:
        for k, (p, t) in enumerate(zip(out, result_types)):
            try:
                p.validate(t.shape, mesh, f"result {k}")
            except PlacementError as e:
                return Conflict(str(e))
    return out


def average_factor(spec: DimSpec, operand_placements: Sequence[Placement | None], mesh: Mesh) -> int:
    """How many times a rank's local average exceeds its share of the global one: the
    product of the sizes of the mesh axes that split the labels in ``spec.averages`` (1 when
    none is split). The placements are assumed accepted by ``result_placements``."""
    axes: dict[str, None] = {}
    for p, labels in zip(operand_placements, spec.operands):
        if p is None:
            continue
        for lab, dim_axes in zip(labels, p.dims):
            if lab is not None and lab in spec.averages:
                axes.update(dict.fromkeys(dim_axes))
    n = 1
    for a in axes:
        n *= mesh.axis_size(a)
    return n


def _show(axes: tuple[str, ...]) -> str:
    return "@".join(axes) if axes else "unsplit"


# --- the rules -------------------------------------------------------------------------------

def _default_rule(op: OpDef) -> Callable[[list[TensorType], dict], DimSpec] | None:
    # An elementwise op without a rule of its own gets the broadcast rule.
    return _elementwise(op.name) if op.elementwise else None


RULES: RuleTable = RuleTable("sharding", fallback=_default_rule)
rule = RULES.rule


def _dims(t: TensorType, prefix: str = "d") -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(t.rank))


def _broadcast_labels(ts: Sequence[TensorType], out: tuple[int, ...], prefix: str = "o") -> list[tuple]:
    """Labels of operands broadcast to ``out``: aligned dims of equal size share the result
    dim's label; a dim that broadcasts (size 1 against a larger one) may not be split."""
    res = []
    for t in ts:
        off = len(out) - t.rank
        res.append(tuple(f"{prefix}{off + i}" if n == out[off + i] else None for i, n in enumerate(t.shape)))
    return res


def _elementwise(name: str):
    op = OPS[name]

    def fn(ts, attrs):
        out = broadcast_shapes(*(t.shape for t in ts))
        return DimSpec(tuple(_broadcast_labels(ts, out)), (tuple(f"o{i}" for i in range(len(out))),),
                       linear=op.linear_in, joint=op.linear_joint)
    return fn


def _reduced(t: TensorType, attrs: dict) -> tuple[int, ...]:
    axes = attrs.get("axes")
    return tuple(range(t.rank)) if axes is None else tuple(normalize_axes(axes, t.rank, "reduce"))


def _reduction(summed: bool, linear: bool, averaged: bool = False):
    def fn(ts, attrs):
        (t,) = ts
        red = _reduced(t, attrs)
        labels = _dims(t)
        res = tuple(None if i in red else labels[i] for i in range(t.rank) if attrs["keepdim"] or i not in red)
        reduced = frozenset(labels[i] for i in red)
        return DimSpec((labels,), (res,), reduced if summed else frozenset(), frozenset({0}) if linear else frozenset(),
                       averages=reduced if averaged else frozenset())
    return fn


# sum contracts by a sum. mean is a sum divided by the global count: a rank's local mean
# divides by its local count, n times smaller, so its reduced dims are sums and averages (the
# partition scales the local mean by 1/n). The others are not sums.
RULES["sum"] = _reduction(True, True)
RULES["mean"] = _reduction(True, True, averaged=True)
for _n in ("max", "min", "prod", "argmax", "argmin"):
    RULES[_n] = _reduction(False, False)


@rule("fused")
def _fused(ts, attrs):
    # A fused kernel's body has fixed shapes, so the node cannot be split: it runs replicated.
    # Fusion belongs after parallelize (on each rank's program), where nothing is split.
    from ..codegen.fused_body import body_graph

    outs = [v.type for v in body_graph(attrs["body"]).outputs]
    return DimSpec(tuple((None,) * t.rank for t in ts), tuple((None,) * t.rank for t in outs))


def _replicated(op: str):
    def fn(ts, attrs):
        outs = OPS[op].infer_types(list(ts), attrs)
        return DimSpec(tuple((None,) * t.rank for t in ts), tuple((None,) * t.rank for t in outs))
    return fn


# The library kernels with fused epilogues (partita/codegen/library.py) and rotary_attention
# (codegen/rotary.py), add_norm (codegen/norm.py) and grn (codegen/grn.py) are made for single-device inference
# by fuse-library: they run replicated, as fused kernels do.
for _n in ("conv2d_pointwise", "linear_pointwise", "rotary_attention", "add_norm", "grn"):
    RULES[_n] = _replicated(_n)
RULES["group_norm"] = _replicated("group_norm")   # codegen/group_norm.py: single-device inference too
RULES["pool_mixer"] = _replicated("pool_mixer")   # codegen/token_mixer.py: single-device inference too
RULES["se_block"] = _replicated("se_block")   # codegen/se_block.py: single-device inference too
RULES["rel_scores"] = _replicated("rel_scores")   # codegen/disentangled.py: single-device inference too


@rule("cumsum")
def _cumsum(ts, attrs):
    (t,) = ts
    ax = normalize_axis(attrs["axis"], t.rank, "cumsum")
    labels = tuple(None if i == ax else f"d{i}" for i in range(t.rank))
    return DimSpec((labels,), (labels,), linear=frozenset({0}))


@rule("matmul")
def _matmul(ts, attrs):
    a, b = ts
    ba = a.shape[:-2] if a.rank >= 2 else ()
    bb = b.shape[:-2] if b.rank >= 2 else ()
    batch = broadcast_shapes(ba, bb)
    la, lb = _broadcast_labels([TensorType(ba, a.dtype), TensorType(bb, b.dtype)], batch, "b")
    lhs = la + (("m", "k") if a.rank >= 2 else ("k",))
    rhs = lb + (("k", "n") if b.rank >= 2 else ("k",))
    res = tuple(f"b{i}" for i in range(len(batch))) + (("m",) if a.rank >= 2 else ()) + (("n",) if b.rank >= 2 else ())
    return DimSpec((lhs, rhs), (res,), frozenset({"k"}), frozenset({0, 1}))


@rule("topk", "sort")
def _topk_sort(ts, attrs):
    # Selection along the axis needs all of it; every other dim may be split.
    (x,) = ts
    axis = normalize_axis(attrs["axis"], x.rank, "topk")
    labels = _dims(x)[:axis] + (None,) + _dims(x)[axis + 1:]
    return DimSpec((labels,), (labels, labels))


@rule("matmul_integer")
def _matmul_integer(ts, attrs):
    # matmul's labels; the zero points follow the rows of lhs and the columns of rhs. A split
    # contraction gives partial i32 sums, exact as integers.
    spec = _matmul(ts[:2], attrs)
    lhs, rhs = spec.operands
    m = ("m",) if ts[0].rank >= 2 else (None,)
    n = ("n",) if ts[1].rank >= 2 else (None,)
    zps = tuple(() if zp.rank == 0 else lab for zp, lab in ((ts[2], m), (ts[3], n)))
    return DimSpec((lhs, rhs) + zps, spec.results, spec.sums)


@rule("quantize_linear", "dequantize_linear")
def _quantize_linear(ts, attrs):
    x, scale = ts[0], ts[1]
    labels = _dims(x)
    if scale.rank == 0:
        return DimSpec((labels, (), ()), (labels,))
    axis = normalize_axis(attrs["axis"], x.rank, "quantize_linear")
    if attrs["block_size"] == 0:
        s = (labels[axis],)
        return DimSpec((labels, s, s), (labels,))
    # Per block: the scale has x's dims but fewer along the axis, which stays whole.
    blocked = labels[:axis] + (None,) + labels[axis + 1:]
    return DimSpec((blocked, blocked, blocked), (blocked,))


@rule("transpose")
def _transpose(ts, attrs):
    (t,) = ts
    labels = _dims(t)
    perm = transpose_perm(t.rank, attrs["perm"])
    return DimSpec((labels,), (tuple(labels[p] for p in perm),), linear=frozenset({0}))


def reshape_groups(ins: Sequence[int], outs: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """The blocks of a reshape: runs of input dims and output dims with equal products
    (size-1 dims left out: they are never split)."""
    ii = [i for i, n in enumerate(ins) if n != 1]
    oo = [j for j, n in enumerate(outs) if n != 1]
    groups = []
    a = b = 0
    while a < len(ii) and b < len(oo):
        ga, gb = [ii[a]], [oo[b]]
        pa, pb = ins[ii[a]], outs[oo[b]]
        a, b = a + 1, b + 1
        while pa != pb:
            if pa < pb and a < len(ii):
                pa *= ins[ii[a]]
                ga.append(ii[a])
                a += 1
            elif pb < pa and b < len(oo):
                pb *= outs[oo[b]]
                gb.append(oo[b])
                b += 1
            else:
                return []
        groups.append((ga, gb))
    return groups


@rule("reshape")
def _reshape(ts, attrs):
    (t,) = ts
    out = OPS["reshape"].infer_types([t], attrs)[0].shape
    lin: list = [None] * t.rank
    lout: list = [None] * len(out)
    if 0 not in t.shape and 0 not in out:
        for ga, gb in reshape_groups(t.shape, out):
            # An identity, a merge or a split: the leading dims of both sides cover the same
            # contiguous rows, so splitting one by the mesh splits the other the same way.
            if len(ga) == 1 or len(gb) == 1:
                lin[ga[0]] = lout[gb[0]] = f"d{ga[0]}"

    def localize(attrs, local, glob):
        shape = list(out)
        for j, lab in enumerate(lout):
            if lab is not None:
                i = int(lab[1:])
                shape[j] = out[j] // (glob[0].shape[i] // local[0].shape[i])
        return {**attrs, "shape": tuple(shape)}
    return DimSpec((tuple(lin),), (tuple(lout),), linear=frozenset({0}), localize=localize)


@rule("broadcast_to")
def _broadcast_to(ts, attrs):
    (t,) = ts
    out = tuple(attrs["shape"])
    (lin,) = _broadcast_labels([t], out)
    lout = tuple(f"o{j}" if f"o{j}" in lin else None for j in range(len(out)))

    def localize(attrs, local, glob):
        off = len(out) - t.rank
        shape = list(out)
        for i, lab in enumerate(lin):
            if lab is not None:
                shape[off + i] = local[0].shape[i]
        return {**attrs, "shape": tuple(shape)}
    return DimSpec((lin,), (lout,), linear=frozenset({0}), localize=localize)


@rule("squeeze")
def _squeeze(ts, attrs):
    (t,) = ts
    drop = squeeze_axes(t, attrs["axes"])
    labels = tuple(None if i in drop else f"d{i}" for i in range(t.rank))
    # Without axes, squeeze drops every size-1 dim, and a split dim can be 1 long locally.
    return DimSpec((labels,), (tuple(lab for lab in labels if lab is not None),), linear=frozenset({0}),
                   localize=lambda a, local, glob: {**a, "axes": tuple(drop)})


@rule("unsqueeze")
def _unsqueeze(ts, attrs):
    (t,) = ts
    new = unsqueeze_axes(t.rank, attrs["axes"])
    labels = _dims(t)
    it = iter(labels)
    res = tuple(None if j in new else next(it) for j in range(t.rank + len(new)))
    return DimSpec((labels,), (res,), linear=frozenset({0}))


def _except_axis(t: TensorType, axis: int) -> tuple:
    return tuple(None if i == axis else f"d{i}" for i in range(t.rank))


@rule("concat")
def _concat(ts, attrs):
    ax = normalize_axis(attrs["axis"], ts[0].rank, "concat")
    labels = _except_axis(ts[0], ax)
    return DimSpec(tuple(labels for _ in ts), (labels,), linear=frozenset(range(len(ts))), joint=True)


@rule("split")
def _split(ts, attrs):
    (t,) = ts
    labels = _except_axis(t, normalize_axis(attrs["axis"], t.rank, "split"))
    return DimSpec((labels,), tuple(labels for _ in attrs["sizes"]), linear=frozenset({0}))


@rule("slice")
def _slice(ts, attrs):
    (t,) = ts
    labels = _except_axis(t, normalize_axis(attrs["axis"], t.rank, "slice"))
    return DimSpec((labels,), (labels,), linear=frozenset({0}))


@rule("pad")
def _pad(ts, attrs):
    (t,) = ts
    p = attrs["pads"]
    labels = tuple(None if p[2 * i] or p[2 * i + 1] else f"d{i}" for i in range(t.rank))
    # A nonzero fill value would be counted once per summand.
    return DimSpec((labels,), (labels,), linear=frozenset({0}) if attrs["value"] == 0 else frozenset())


@rule("softmax", "log_softmax")
def _softmax(ts, attrs):
    (t,) = ts
    labels = _except_axis(t, normalize_axis(attrs["axis"], t.rank, "softmax"))
    return DimSpec((labels,), (labels,))


@rule("softmax_grad", "log_softmax_grad")
def _softmax_grad(ts, attrs):
    labels = _except_axis(ts[0], normalize_axis(attrs["axis"], ts[0].rank, "softmax_grad"))
    return DimSpec((labels, labels), (labels,), linear=frozenset({0}))


def _masked_softmax_labels(x: TensorType, causal: bool) -> tuple:
    # The batch and head dims split freely; the keys (the softmax's axis) never; the queries
    # only without causal (a rank holding queries [a, b) would need its offset a to mask).
    r = x.rank
    return tuple(None if i == r - 1 or (causal and i == r - 2) else f"o{i}" for i in range(r))


@rule("masked_softmax")
def _masked_softmax(ts, attrs):
    x = ts[0]
    xl = _masked_softmax_labels(x, attrs["causal"])
    ops = [xl]
    if len(ts) > 1:
        (ml,) = _broadcast_labels([ts[1]], x.shape)
        off = x.rank - ts[1].rank
        ops.append(tuple(lab if xl[off + i] is not None else None for i, lab in enumerate(ml)))
    return DimSpec(tuple(ops), (xl,))


@rule("masked_softmax_grad")
def _masked_softmax_grad(ts, attrs):
    xl = _masked_softmax_labels(ts[0], attrs["causal"])
    return DimSpec((xl, xl), (xl,), linear=frozenset({0}))


@rule("layer_norm", "rms_norm")
def _norm(ts, attrs):
    x = ts[0]
    axes = normalize_axes(attrs["axes"], x.rank, "norm")
    labels = tuple(None if i in axes else f"d{i}" for i in range(x.rank))
    return DimSpec((labels,) + tuple((None,) * t.rank for t in ts[1:]), (labels,))


def _norm_grad(n_results: int):
    def fn(ts, attrs):
        x = ts[1]
        axes = normalize_axes(attrs["axes"], x.rank, "norm_grad")
        labels = tuple(None if i in axes else f"d{i}" for i in range(x.rank))
        w = (None,) * len(axes)
        # dx keeps the rows; dweight (and dbias) sum over them. All are linear in dy.
        return DimSpec((labels, labels) + tuple((None,) * t.rank for t in ts[2:]), (labels,) + (w,) * (n_results - 1),
                       frozenset(lab for lab in labels if lab is not None), frozenset({0}))
    return fn


RULES["layer_norm_grad"] = _norm_grad(3)
RULES["rms_norm_grad"] = _norm_grad(2)


@rule("cast")
def _cast(ts, attrs):
    labels = _dims(ts[0])
    return DimSpec((labels,), (labels,))


@rule("dropout")
def _dropout(ts, attrs):
    t = ts[0]
    if not attrs["train"]:
        return DimSpec((_dims(t),), (_dims(t),), linear=frozenset({0}))
    # The training mask hashes the global element index: a split rank runs the local form,
    # which gives its piece's origin (local_forms.dropout); a dropout that already is a piece
    # (an origin operand: a microbatch's) adds its own.
    labels = _dims(t)
    operands = (labels,) if len(ts) == 1 else (labels, (None,))
    return DimSpec(operands, (labels,), linear=frozenset({0}), ranged=frozenset(labels),
                   local_form=local_forms.dropout)


@rule("embedding")
def _embedding(ts, attrs):
    table, idx = ts
    il = _dims(idx, "i")
    # A table split by rows (the vocabulary) is Megatron's vocab-parallel embedding: a rank
    # looks up the indices in its range and zeros the others, a summand of the lookup.
    return DimSpec((("v", "e"), il), (il + ("e",),), sums=frozenset({"v"}), linear=frozenset({0}),
                   ranged=frozenset({"v"}), local_form=local_forms.embedding)


@rule("gather")
def _gather(ts, attrs):
    x, idx = ts
    ax = normalize_axis(attrs["axis"], x.rank, "gather")
    # Outside the axis, a dim of the index smaller than the input's reads only a prefix of
    # it: the two can then be split only one at a time (the index's with the input whole).
    xl = tuple(f"d{i}" if i != ax and idx.shape[i] == x.shape[i] else None for i in range(x.rank))
    il = tuple(f"d{i}" if i != ax and idx.shape[i] == x.shape[i] else f"i{i}" for i in range(idx.rank))
    return DimSpec((xl, il), (il,), linear=frozenset({0}))


@rule("index_select")
def _index_select(ts, attrs):
    x, idx = ts
    ax = normalize_axis(attrs["axis"], x.rank, "index_select")
    xl = _except_axis(x, ax)
    return DimSpec((xl, ("j",)), (xl[:ax] + ("j",) + xl[ax + 1:],), linear=frozenset({0}))


def _ce_labels(logits: TensorType, target: TensorType) -> tuple[tuple, tuple]:
    """Labels of cross_entropy's logits and target: the class dim (1, or 0 for [C] logits)
    unsplit, the others shared with the target."""
    cdim = 1 if logits.rank >= 2 else 0
    tl = _dims(target, "t")
    return tl[:cdim] + ("c",) + tl[cdim:], tl


@rule("cross_entropy")
def _cross_entropy(ts, attrs):
    ll, tl = _ce_labels(*ts)
    red = attrs["reduction"]
    # Split classes (the logits of a vocab-parallel LM head) take the distributed form: the
    # log-sum-exp and the target's logit are all-reduced over the class axes.
    classes, form = frozenset({"c"}), local_forms.cross_entropy
    if red == "none":
        return DimSpec((ll, tl), (tl,), ranged=classes, local_form=form)
    # "mean" divides the sum by the count of targets not ignored. A rank divides its summand
    # by its own count; scaled by 1/n (averages) that is its share of the global mean exactly
    # when every rank holds the same number of ignored targets (as when no target is ignored):
    # the same per-rank averaging as DDP's. Uneven ignored targets give another weighting.
    return DimSpec((ll, tl), ((),), frozenset(tl), averages=frozenset(tl) if red == "mean" else frozenset(),
                   ranged=classes, local_form=form)


@rule("cross_entropy_grad")
def _cross_entropy_grad(ts, attrs):
    ll, tl = _ce_labels(ts[1], ts[2])
    red = attrs["reduction"]
    # dloss is per target for "none", a scalar otherwise; the batch dims pass to dlogits. For
    # "mean" the local count divides, as in the forward (same caveat on ignored targets).
    return DimSpec((tl if red == "none" else (), ll, tl), (ll,), linear=frozenset({0}),
                   averages=frozenset(tl) if red == "mean" else frozenset(), ranged=frozenset({"c"}),
                   local_form=local_forms.cross_entropy_grad)


def _conv_rule(transposed: bool):
    def fn(ts, attrs):
        x, w = ts[:2]
        bias = len(ts) == 3
        sp = (None,) * (x.rank - 2)
        if attrs["groups"] != 1:
            # A block of output channels needs the input channels of its groups; a split of
            # the channel dims lines those up only when the ranks divide the groups, which a
            # DimSpec (blind to the mesh) cannot require. Only the batch splits.
            xl = ("n", None) + sp
            return DimSpec((xl,) + tuple((None,) * t.rank for t in ts[1:]), (xl,),
                           linear=frozenset() if bias else frozenset({0, 1}))
        # Input channels are contracted by a sum; with a bias every summand would add it.
        c = None if bias else "c"
        wl = ((c, "o") if transposed else ("o", c)) + sp
        ops = (("n", c) + sp, wl) + ((("o",),) if bias else ())
        return DimSpec(ops, (("n", "o") + sp,), frozenset() if bias else frozenset({"c"}),
                       frozenset() if bias else frozenset({0, 1}))
    return fn


# conv_transpose's weight is [in, out/groups, k...]: the channel labels swap places.
RULES["conv2d"] = RULES["conv3d"] = _conv_rule(False)
RULES["conv_transpose2d"] = RULES["conv_transpose3d"] = _conv_rule(True)


@rule("conv2d_grad")
def _conv_grad(ts, attrs):
    dy, x, w = ts
    sp = (None,) * (x.rank - 2)
    if attrs["groups"] != 1:
        return DimSpec((("n", None) + sp, ("n", None) + sp, (None,) * w.rank),
                       (("n", None) + sp, (None,) * w.rank, (None,)), frozenset({"n"}), frozenset({0}))
    # dx sums over the output channels, dweight and dbias over the batch; dbias reads dy
    # alone, so it is whole (not summed) when the input channels are split.
    return DimSpec((("n", "o") + sp, ("n", "c") + sp, ("o", "c") + sp),
                   (("n", "c") + sp, ("o", "c") + sp, ("o",)), frozenset({"n", "o"}), frozenset({0}))


def _pool(n_results: int, linear: bool):
    def fn(ts, attrs):
        (x,) = ts
        xl = ("n", "c") + (None,) * (x.rank - 2)
        return DimSpec((xl,), (xl,) * n_results, linear=frozenset({0}) if linear else frozenset())
    return fn


for _n in ("max_pool2d", "max_pool3d"):
    RULES[_n] = _pool(1, False)
for _n in ("max_pool2d_with_indices", "max_pool3d_with_indices"):
    RULES[_n] = _pool(2, False)
for _n in ("avg_pool2d", "avg_pool3d"):
    RULES[_n] = _pool(1, True)


@rule("max_pool2d_grad", "avg_pool2d_grad")
def _pool_grad(ts, attrs):
    # Windows stay within one (n, c) plane (max_pool's indices are flat within the plane).
    xl = ("n", "c") + (None,) * (ts[1].rank - 2)
    return DimSpec((xl,) * len(ts), (xl,), linear=frozenset({0}))


@rule("batch_norm")
def _batch_norm(ts, attrs):
    x = ts[0]
    if attrs["training"]:
        # Batch statistics reduce over every dim but the channels.
        xl = (None, "c") + (None,) * (x.rank - 2)
        return DimSpec((xl,) + (("c",),) * 4, (xl, ("c",), ("c",)))
    xl = ("n", "c") + tuple(f"s{i}" for i in range(2, x.rank))
    return DimSpec((xl,) + (("c",),) * 4, (xl,))


@rule("batch_norm_grad")
def _batch_norm_grad(ts, attrs):
    x = ts[1]
    stats = (("c",),) * (len(ts) - 2)
    if attrs["training"]:
        # dx reads the batch statistics: every dim but the channels stays whole.
        xl = (None, "c") + (None,) * (x.rank - 2)
        return DimSpec((xl, xl) + stats, (xl, ("c",), ("c",)), linear=frozenset({0}))
    # Inference form: dx is a per-channel scale of dy; dweight and dbias sum over the rest.
    xl = ("n", "c") + tuple(f"s{i}" for i in range(2, x.rank))
    return DimSpec((xl, xl) + stats, (xl, ("c",), ("c",)), frozenset(lab for lab in xl if lab != "c"),
                   frozenset({0}))


@rule("attention")
def _attention(ts, attrs):
    q = ts[0]
    lead = q.shape[:-2]
    bl = tuple(f"b{i}" for i in range(len(lead)))
    qkv = bl + (None, None)
    ops = [qkv, qkv, qkv]
    if len(ts) > 3:
        scores = lead + (q.shape[-2], ts[1].shape[-2])
        (ml,) = _broadcast_labels([ts[3]], scores, "b")
        n = ts[3].rank
        ops.append(tuple(lab if i < n - 2 else None for i, lab in enumerate(ml)))
    return DimSpec(tuple(ops), (qkv, bl + (None,)))


@rule("attention_grad")
def _attention_grad(ts, attrs):
    fwd = _attention([ts[1], ts[2], ts[3]] + list(ts[6:]), attrs)
    qkv, lse = fwd.results
    # dout and out are laid out like q, lse like the forward's lse; dq, dk, dv like q, k, v.
    return DimSpec((qkv,) + fwd.operands[:3] + (qkv, lse) + fwd.operands[3:], (qkv, qkv, qkv),
                   linear=frozenset({0}))


@rule("embedding_grad")
def _embedding_grad(ts, attrs):
    dy, idx = ts
    il = _dims(idx, "i")
    # Each index scatters its row of dy into the table: the index dims are summed. The table's
    # rows (the vocabulary, "v") are the rank's to compute where the result is split by rows as
    # a vocab-parallel table is: its indices in range, shifted to its rows, the rest masked.
    return DimSpec((il + ("e",), il), (("v", "e"),), frozenset(il), frozenset({0}), ranged=frozenset({"v"}),
                   made=frozenset({"v"}), local_form=local_forms.embedding_grad)


@rule("slice_grad")
def _slice_grad(ts, attrs):
    (dy,) = ts
    labels = _except_axis(dy, normalize_axis(attrs["axis"], dy.rank, "slice_grad"))

    def localize(attrs, local, glob):
        return {**attrs, "shape": tuple(local[0].shape[i] if lab is not None else n
                                        for i, (lab, n) in enumerate(zip(labels, attrs["shape"])))}
    return DimSpec((labels,), (labels,), linear=frozenset({0}), localize=localize)


@rule("scatter_add")
def _scatter_add(ts, attrs):
    x, idx, src = ts
    labels = _scatter_labels(x, idx, src, normalize_axis(attrs["axis"], x.rank, "scatter_add"))
    return DimSpec((labels, labels, labels), (labels,), linear=frozenset({0, 2}), joint=True)


def _scatter_labels(x: TensorType, idx: TensorType, src: TensorType, ax: int) -> tuple[str | None, ...]:
    """The dims a torch.scatter-like op may split: outside the axis, a dim the index covers only
    in part is unsplit (as in gather). The axis is unsplit: x's positions there are global index
    values, and summands from split index rows would each carry a copy of x."""
    return tuple(f"d{i}" if i != ax and x.shape[i] == idx.shape[i] == src.shape[i] else None
                 for i in range(x.rank))


@rule("index_add")
def _index_add(ts, attrs):
    x, idx, src = ts
    labels = _except_axis(x, normalize_axis(attrs["axis"], x.rank, "index_add"))
    return DimSpec((labels, (None,), labels), (labels,), linear=frozenset({0, 2}), joint=True)


@rule("adamw_update", "sgd_update")
def _optimizer_update(ts, attrs):
    labels = _dims(ts[0])
    ops = tuple(labels if t.rank == len(labels) and t.shape == ts[0].shape else (None,) * t.rank for t in ts)
    n_res = 3 if len(ts) == 5 else (2 if len(ts) == 3 else 1)
    return DimSpec(ops, (labels,) * n_res)


@rule("send")
def _send(ts, attrs):
    # A send hands over whatever piece its rank holds (the recv it meets is placed alike, see
    # partition): every dim may be split, and nothing may be pending.
    labels = _dims(ts[0])
    return DimSpec((labels,), (), sums=frozenset(labels))


# Ops that have no sharding rule on purpose, and why (the passes replicate them). The
# collectives of ops/collective.py have none either: the passes insert them, placed as the
# reshard they implement.
WITHOUT_RULE: dict[str, str] = {
    "constant": "no operands to take a placement from; its value is global (a consumer's split is a free local slice)",
    "full": "no operands; a replicated fill costs nothing to slice where a consumer wants a split",
    "iota": "no operands; its values are global positions, so a replicated iota is sliced, never recomputed locally",
    "recv": "no operands; its result arrives in the placement annotated on it (the partition receives each rank's "
            "piece, and the sender sends its piece alike)",
}


def sharding_spec(op: str, types: Sequence[TensorType], attrs: dict) -> DimSpec | None:
    """The DimSpec of ``op`` on operands of ``types`` (attrs normalized), or None when the op
    has no rule (the passes replicate it)."""
    fn = RULES.get(op) if op in OPS else None
    if fn is None:
        return None
    # A float by its repr (-0.0 is not 0.0), every value with its type (True is not 1).
    key = (fn, op, tuple(types), tuple([(k, type(v), repr(v) if type(v) is float else v) for k, v in attrs.items()]))
    try:
        got = _SPECS.get(key, _MISSING)
    except TypeError:  # an unhashable attribute (a list): not memoized
        return fn(list(types), attrs)
    if got is _MISSING:
        got = fn(list(types), attrs)
        if len(_SPECS) >= 1 << 14:
            _SPECS.clear()
        _SPECS[key] = got
    assert got is None or isinstance(got, DimSpec)
    return got


# sharding_spec's answers by (op, operand types, attributes): a rule is a function of these
# alone, and the passes ask for the specs of every layer's alike nodes again and again.
_SPECS: "dict[tuple, DimSpec | None]" = {}
_MISSING = object()


# --- scatter_elements and cumprod (ops/index_scan.py) ---------------------------------------------

@rule("scatter_elements")
def _scatter_elements(ts, attrs):
    x, idx, src = ts
    # As scatter_add. With add the op is linear in x and src together.
    labels = _scatter_labels(x, idx, src, normalize_axis(attrs["axis"], x.rank, "scatter_elements"))
    linear = frozenset({0, 2}) if attrs["reduction"] == "add" else frozenset()
    return DimSpec((labels, labels, labels), (labels,), linear=linear, joint=True)


@rule("cumprod")
def _cumprod(ts, attrs):
    (t,) = ts
    ax = normalize_axis(attrs["axis"], max(t.rank, 1), "cumprod")
    labels = tuple(None if i == ax else f"d{i}" for i in range(t.rank))
    return DimSpec((labels,), (labels,))
