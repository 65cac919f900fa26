"""Canonicalization: local algebraic simplifications written as declarative rewrite rules.

Two kinds of rules:

- rules generated from the algebraic facts on each op record (``right_identity``,
  ``left_identity``, ``involution``, ``idempotent``): ``x*1``, ``x+0``, ``neg(neg x)``,
  ``relu(relu x)``, ... An op added with those facts is simplified with no change here;
- the table ``RULES`` below, for facts that involve several ops (``transpose`` of
  ``transpose``, ``cast`` of ``cast``, ``add(x, neg y)``, ...).

Soundness, decided rule by rule (see docs/passes.md):

- Every rule is exact on all inputs (NaN and infinities included), up to the sign of a zero
  result: ``x + 0`` becomes ``x``, which differs from IEEE ``-0.0 + 0.0 = +0.0`` only in the
  sign of that zero, as in other tensor compilers.
- ``x - x -> 0`` and ``x * 0 -> 0`` hold for integers only (for floats NaN and infinities
  give NaN); the float versions are applied only with ``fast-math=true``, which assumes every
  value is finite.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.dtypes import DType
from ..ir.graph import Graph, Node, Value
from ..ops.cast_semantics import int_range
from ..ops.nn import avg_pool_mean_axes
from ..ops.registry import OPS
from .manager import Pass, register_pass
from .pool_windows import pool_as_window_mean
from .rewrite import Match, Op, RewriteDriver, RewriteEvent, Rule, Splat, Var, emit_splat, rule

X, Y, C, B = Var("x"), Var("y"), Var("c"), Var("b")
_FIX_ALL = ("broadcast", "cast")


# --- helpers used by the rules -------------------------------------------------------------

def _result_dtype(node: Node) -> DType:
    return node.results[0].type.dtype


def _not_float(node: Node) -> bool:
    return not _result_dtype(node).is_float


def _zeros(m: Match) -> Value | None:
    """A zero tensor of the root's type."""
    return emit_splat(m.emit, m.type, 0)


def _same_type_as_operand(node: Node) -> bool:
    return node.results[0].type == node.operands[0].type


def _lossless(src: DType, mid: DType) -> bool:
    """True when every value of ``src`` converts to ``mid`` and back exactly, so a cast
    through ``mid`` may be skipped."""
    if src is mid:
        return True
    if src.storage or mid.storage:
        # Every value of an 8-bit or narrower storage type is exact in f32 and f64; other
        # pairs are not worth a table.
        return not mid.storage and mid.name in ("f32", "f64")
    if src.is_bool:
        return True
    if mid.is_bool:
        return False
    if src.is_int:
        if mid.is_int:
            if src.kind == mid.kind:
                return mid.bits >= src.bits
            # unsigned into signed needs one more bit; signed into unsigned loses negatives
            return src.kind == "uint" and mid.bits > src.bits
        # integers of n significant bits are exact in a float with a long enough mantissa
        mantissa = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}[mid.name]
        return (src.bits - (1 if src.kind == "int" else 0)) <= mantissa
    if mid.is_int:
        return False
    if src.name == "f16":
        return mid.name in ("f32", "f64")
    if src.name == "bf16":
        return mid.name in ("f32", "f64")
    return mid.bits > src.bits


def _neg_does_not_wrap(m: Match) -> bool:
    """-y computed in y's dtype equals -y computed in the result's dtype: y is a float, or
    has the result's dtype. (An integer -y wraps in its own width: -(-128) is -128 in i8,
    and for u8 every -y wraps, so promoting afterwards changes the value.)"""
    dt = m["y"].type.dtype
    return dt.is_float or dt is m.type.dtype


def _same_cast_rule(src: DType, mid: DType, dst: DType) -> bool:
    """A value of ``src``, held exactly in ``mid``, casts to ``dst`` alike from either: a
    float -> integer cast saturates where an integer -> integer cast wraps, so an integer going
    through a float to an integer type must fit that type."""
    if not dst.is_int or src.is_bool or src.is_float == mid.is_float:
        return True
    (lo, hi), (dlo, dhi) = int_range(src), int_range(dst)
    return dlo <= lo and hi <= dhi


def _cast_cast(m: Match) -> Value | None:
    inner: Node = m["inner"]
    x: Value = m["x"]
    if not _lossless(x.type.dtype, _result_dtype(inner)):
        return None
    if not _same_cast_rule(x.type.dtype, _result_dtype(inner), m.type.dtype):
        return None
    want = m.type.dtype
    return x if x.type.dtype is want else m.emit("cast", x, dtype=want)


def _transpose_perm(node: Node) -> tuple[int, ...]:
    """The normalized permutation of a transpose node (no perm reverses the dims)."""
    rank = node.operands[0].type.rank
    perm = node.attrs.get("perm")
    if perm is None:
        return tuple(range(rank - 1, -1, -1))
    return tuple(p % rank for p in perm)


def _is_identity_perm(perm) -> bool:
    return all(i == p for i, p in enumerate(perm))


def _identity_transpose(node: Node) -> bool:
    return _is_identity_perm(_transpose_perm(node))


def _transpose_transpose(m: Match) -> Value | None:
    inner: Node = m["inner"]
    p1, p2 = _transpose_perm(inner), _transpose_perm(m.root)
    # out[i] = inner[p2[i]] = x[p1[p2[i]]]
    composed = tuple(p1[i] for i in p2)
    x: Value = m["x"]
    if _is_identity_perm(composed):
        return x
    return m.emit("transpose", x, perm=composed)


def _swaps_last_two(node: Node) -> bool:
    perm = _transpose_perm(node)
    n = len(perm)
    return n >= 2 and perm[-2] == n - 1 and perm[-1] == n - 2 and _is_identity_perm(perm[:-2])


def _matmul_of_transposes(m: Match) -> Value | None:
    a, b = m["x"], m["y"]
    if a.type.rank != b.type.rank:
        return None  # batch broadcasting of different ranks: keep it simple and exact
    n = a.type.rank
    prod = m.emit("matmul", b, a)
    perm = tuple(range(n - 2)) + (n - 1, n - 2)
    return m.emit("transpose", prod, perm=perm)


def _reshape_reshape(m: Match) -> Value | None:
    x: Value = m["x"]
    if x.type.shape == m.type.shape:
        return x
    return m.emit("reshape", x, shape=m.type.shape)


# The most elements ``_moves_nothing`` checks by computing the composite index map.
_MOVE_CHECK_MAX = 1 << 21


def _moves_nothing(m: Match) -> Value | None:
    """transpose(reshape(transpose(x))) whose elements come out in x's own flat order (the
    second transpose undoes the first across the reshape, as a patch embedding's
    conv-as-linear does when it turns [B, H, W, C] into [B, C, H, W] and then [B, H*W, C]):
    one reshape of x, a view, where the unfolded chain needs a copy at the reshape. Checked
    exactly, by carrying every element's flat index through the three ops (up to
    ``_MOVE_CHECK_MAX`` elements; larger chains are left alone)."""
    import numpy as np

    x: Value = m["x"]
    shape = x.type.shape
    if any(not isinstance(d, int) for d in (*shape, *m.type.shape)) or x.type.numel > _MOVE_CHECK_MAX:
        return None
    idx = np.arange(x.type.numel, dtype=np.int64).reshape(shape)
    idx = np.transpose(idx, _transpose_perm(m["inner"]))
    idx = idx.reshape(m["mid"].results[0].type.shape)
    idx = np.transpose(idx, _transpose_perm(m.root))
    if not np.array_equal(idx.reshape(-1), np.arange(x.type.numel, dtype=np.int64)):
        return None
    return m.emit("reshape", x, shape=m.type.shape)


def _broadcast_broadcast(m: Match) -> Value | None:
    return m.emit("broadcast_to", m["x"], shape=m.type.shape)


def _inner_value(m: Match) -> Value:
    return m.root.operands[0]


def _same_attrs_as_inner(m: Match) -> bool:
    return m["inner"].attrs == m.root.attrs


def _reduces_nothing(node: Node) -> bool:
    """Each output element is exactly one input element: same shape in and out."""
    return node.results[0].type.shape == node.operands[0].type.shape


def _rows_of_a_table(node: Node) -> bool:
    """index_select of whole rows of a 2-d float table by i32/i64 indices: an embedding
    lookup (ONNX exports spell one as Gather). Storage types (float8, 4-bit) keep their
    index_select, which the executors already move as raw data."""
    x, idx = node.operands[0].type, node.operands[1].type
    return (x.rank == 2 and node.attrs["axis"] in (0, -2) and x.dtype.is_float and not x.dtype.storage
            and idx.dtype.name in ("i32", "i64"))


def _pad_into_conv(m: Match) -> Value | None:
    """conv(pad(x)) as one convolution with a larger ``padding``, where the pad adds zeros on
    the spatial dims only, as many before as after each (what a convolution's own padding
    does). Exporters and "same" padding code (TensorFlow-style models) write such pads out;
    left alone, each is a copy of the whole activation."""
    pad, conv = m["pad"], m.root
    if pad.attrs["value"] != 0:
        return None
    pads = list(pad.attrs["pads"])
    pairs = [(pads[2 * i], pads[2 * i + 1]) for i in range(len(pads) // 2)]
    if pairs[0] != (0, 0) or pairs[1] != (0, 0) or any(b != e for b, e in pairs[2:]):
        return None
    padding = [p + b for p, (b, _) in zip(conv.attrs["padding"], pairs[2:])]
    attrs = dict(conv.attrs, padding=padding)
    return m.emit(conv.op, m["x"], *conv.operands[1:], **attrs)


def _pool_as_mean(m: Match) -> Value | None:
    """An average pool that is the identity (a 1 x 1 window; a window on a 1 x 1 map that counts
    no padding) is its input; one whose windows each cover whole axes (a global pool written
    as a pool) is a ``mean`` over them, which the layout pass and the kernels know."""
    x = m.root.operands[0]
    axes = avg_pool_mean_axes(x.type.shape, m.root.attrs)
    if axes is None:
        return None
    if not axes:
        return x
    return m.emit("mean", x, axes=list(axes), keepdim=True)


# --- the rule table ------------------------------------------------------------------------

# Rules for facts that involve more than one op, or ops without a fact on their record.
RULES: list[Rule] = [
    rule("index-select-rows", Op("index_select", X, Y, where=_rows_of_a_table), Op("embedding", X, Y),
         doc="rows of a 2-d table picked by index_select are an embedding lookup: the same values, and "
             "the op autodiff and the parallel rules know as one (a vocab-parallel table)"),
    rule("sub-self-int", Op("sub", X, X, where=_not_float), _zeros,
         doc="x - x = 0 for integers (for floats NaN/inf give NaN: see fast-math)"),
    rule("mul-by-zero-int", Op("mul", X, Splat(0), where=_not_float), _zeros,
         doc="x * 0 = 0 for integers and bool (for floats NaN/inf give NaN: see fast-math)"),
    rule("add-neg", Op("add", X, Op("neg", Y)), Op("sub", X, Y), where=_neg_does_not_wrap,
         doc="x + (-y) = x - y exactly (IEEE defines subtraction so)"),
    rule("sub-neg", Op("sub", X, Op("neg", Y)), Op("add", X, Y), where=_neg_does_not_wrap,
         doc="x - (-y) = x + y exactly"),
    rule("not-equal", Op("logical_not", Op("equal", X, Y)), Op("not_equal", X, Y),
         doc="!(x == y) is x != y, NaN included (not so for <, <=: NaN compares false both ways)"),
    rule("not-not-equal", Op("logical_not", Op("not_equal", X, Y)), Op("equal", X, Y)),
    rule("max-self", Op("maximum", X, X), X, doc="max(x, x) = x"),
    rule("min-self", Op("minimum", X, X), X, doc="min(x, x) = x"),
    rule("where-same", Op("where", C, X, X), X, fix=("broadcast",), doc="c ? x : x = x"),
    rule("where-true", Op("where", Splat(True), X, Y), X, fix=_FIX_ALL, doc="true ? x : y = x"),
    rule("where-false", Op("where", Splat(False), X, Y), Y, fix=_FIX_ALL, doc="false ? x : y = y"),
    rule("cast-same", Op("cast", X, where=_same_type_as_operand), X, doc="cast to the dtype x has"),
    rule("cast-cast", Op("cast", Op("cast", X, bind="inner")), _cast_cast, requires=("cast",),
         doc="cast(cast(x, a), b) = cast(x, b) when x -> a is lossless and b casts x and a alike "
             "(an integer through a float to an integer type must fit that type)"),
    rule("transpose-identity", Op("transpose", X, where=_identity_transpose), X),
    rule("transpose-transpose", Op("transpose", Op("transpose", X, bind="inner")), _transpose_transpose,
         requires=("transpose",), doc="compose the permutations (drop them when they cancel)"),
    rule("transpose-reshape-transpose",
         Op("transpose", Op("reshape", Op("transpose", X, bind="inner"), bind="mid")), _moves_nothing,
         requires=("reshape",),
         doc="two transposes that cancel across a reshape (elements in x's own order) are one reshape: "
             "a view instead of a copy"),
    rule("reshape-same", Op("reshape", X, where=_same_type_as_operand), X),
    rule("reshape-reshape", Op("reshape", Op("reshape", X)), _reshape_reshape, requires=("reshape",)),
    rule("broadcast-same", Op("broadcast_to", X, where=_same_type_as_operand), X),
    rule("broadcast-broadcast", Op("broadcast_to", Op("broadcast_to", X)), _broadcast_broadcast,
         requires=("broadcast_to",)),
    rule("slice-whole", Op("slice", X, where=_same_type_as_operand), X, doc="a slice that keeps every element (steps are >= 1, so the same shape means all of them)"),
    rule("concat-one", Op("concat", X), X, doc="concat of a single input"),
    rule("pad-nothing", Op("pad", X, where=_same_type_as_operand), X, doc="a pad that adds nothing"),
] + [
    rule(f"pad-into-conv[{conv}{'+bias' if bias else ''}]",
         Op(conv, Op("pad", X, bind="pad"), Y, *((B,) if bias else ())), _pad_into_conv,
         requires=(conv,),
         doc="zeros padded symmetrically around the spatial dims before a convolution are its own padding")
    for conv in ("conv1d", "conv2d", "conv3d") for bias in (False, True)
] + [
    rule("matmul-transposes", Op("matmul", Op("transpose", X, where=_swaps_last_two),
                                 Op("transpose", Y, where=_swaps_last_two)),
         _matmul_of_transposes, requires=("matmul", "transpose"),
         doc="a^T b^T = (b a)^T: one transpose instead of two"),
] + [
    rule(f"pool-as-mean[{op}]", Op(op, X), _pool_as_mean, requires=(op, "mean"),
         doc="an average pool that is the identity is its input; one whose windows cover whole axes "
             "is a mean over them")
    for op in ("avg_pool2d", "avg_pool3d")
] + [
    rule(f"pool-windows-as-mean[{op}]", Op(op, X), pool_as_window_mean, requires=(op, "mean", "reshape"),
         doc="an average pool whose windows tile its input exactly is a reshape and a mean: passes/pool_windows.py")
    for op in ("avg_pool2d", "avg_pool3d")
] + [
    rule(f"reduce-nothing[{r}]", Op(r, X, where=_reduces_nothing), X, fix=("cast",),
         doc="a reduction where every output element is one input element")
    for r in ("sum", "prod", "mean", "max", "min")
]

# Exact only for finite values; applied with fast-math=true.
FAST_MATH_RULES: list[Rule] = [
    rule("sub-self-float", Op("sub", X, X), _zeros, doc="x - x = 0 (NaN and inf give NaN)"),
    rule("mul-by-zero-float", Op("mul", X, Splat(0.0)), _zeros, doc="x * 0 = 0 (NaN and inf give NaN)"),
]


def fact_rules() -> list[Rule]:
    """Rules generated from the algebraic facts of every registered op record."""
    out = []
    for name, d in OPS.items():
        if d.right_identity is not None:
            out.append(rule(f"right-identity[{name}]", Op(name, X, Splat(d.right_identity)), X, fix=_FIX_ALL,
                            doc=f"{name}(x, {d.right_identity}) = x (op record)"))
        if d.left_identity is not None and not d.commutative:
            out.append(rule(f"left-identity[{name}]", Op(name, Splat(d.left_identity), X), X, fix=_FIX_ALL,
                            doc=f"{name}({d.left_identity}, x) = x (op record)"))
        if d.involution:
            out.append(rule(f"involution[{name}]", Op(name, Op(name, X, bind="inner")), X,
                            where=_same_attrs_as_inner, doc=f"{name}({name}(x)) = x (op record)"))
        if d.idempotent:
            out.append(rule(f"idempotent[{name}]", Op(name, Op(name, X, bind="inner")), _inner_value,
                            where=_same_attrs_as_inner, doc=f"{name}({name}(x)) = {name}(x) (op record)"))
    return out


@register_pass
class Canonicalize(Pass):
    """Simplify the graph with local rewrite rules, to a fixed point.

    Rules come from the op records' algebraic facts (identities, involutions, idempotent
    ops) and from a table of multi-op rules (transpose/reshape/broadcast/cast chains, ...);
    rules that need ops not registered are skipped. Every default rule is exact up to the
    sign of a zero; ``fast-math=true`` adds ``x - x -> 0`` and ``x * 0 -> 0`` for floats,
    which assume finite values. ``trace=true`` writes each rule firing (the rule, where it
    is written, the node's location) to the pass manager's output.
    """

    name = "canonicalize"

    @dataclass
    class Options:
        fast_math: bool = False
        trace: bool = False

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.trace: list[RewriteEvent] = []

    def rules(self) -> list[Rule]:
        """The rules this pass applies with its options."""
        rules = RULES + fact_rules()
        if self.options.fast_math:
            rules += FAST_MATH_RULES
        return rules

    def run(self, graph: Graph) -> Graph:
        trace: list[RewriteEvent] | None = [] if self.options.trace else None
        RewriteDriver(self.rules(), trace=trace).run(graph)
        if trace is not None:
            self.trace = trace
            for e in trace:
                self.out.write(f"// canonicalize: {e}\n")
        return graph
