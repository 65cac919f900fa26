"""The reverse-mode (vjp) rules of the op records.

Each rule has the signature ``rule(ctx, node, douts, needs) -> [d_operand or None, ...]``:
``douts`` holds the gradient flowing into each result (None where a result does not reach
the loss), ``needs`` says which operands need a gradient, and the rule emits the backward
nodes through ``ctx.b`` (a builder at the end of the graph carrying the forward node's
location). It returns one gradient per operand, None for operands that need none or have
none. Broadcasting is undone here with ``ctx.sum_to``; the engine casts a gradient whose
dtype promotion changed and checks the shapes.

The rules live in this one table, like a derivatives file, rather than spread over the op
families: they are written against the Builder and the fused backward ops of
``ops/backward.py``, and reading them side by side is how one reviews them. The table is the
``RuleTable`` ``RULES`` (ops/registry.py): a rule for an unknown op or a second rule for one
op is an error; ``op.vjp`` reads it, which is where the grad pass looks.
Heavy ops (convolution, pooling, normalization, softmax, the activations, the loss) use one
fused backward op each, so the torch executor runs PyTorch's own backward kernels.
"""

from __future__ import annotations

import math

from ..ir.graph import Node, Value
from ..ops.nn import attention_scale
from ..ops.registry import OPS, OpDef, RuleTable
from ..ops.shape import transpose_perm
from .grad import NOT_DIFFERENTIABLE, AutodiffError, VjpContext

# The backward ops and the optimizer updates are what training graphs are made of; partita
# does not differentiate them again (no second-order gradients). Collectives are declared
# too: partita differentiates before partitioning, so they never meet the grad pass.
_FIRST_ORDER_ONLY = ("ops/backward.py", "ops/optim.py", "ops/collective.py")


def _first_order_only(op: OpDef) -> str | None:
    where = str(op.defined_at.file).replace("\\", "/") if op.defined_at is not None else ""
    return NOT_DIFFERENTIABLE if where.endswith(_FIRST_ORDER_ONLY) else None


RULES: RuleTable = RuleTable("vjp", fallback=_first_order_only)
rule = RULES.rule


# Ops whose results are never differentiated: integer/bool results (the engine never reaches
# them) or no operands. Listed so that every op in the registry is accounted for.
for _name in ("argmax", "argmin", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
              "logical_and", "logical_or", "logical_not", "iota", "full", "constant"):
    RULES[_name] = NOT_DIFFERENTIABLE
# A fused kernel (partita/codegen) is made after autodiff: fuse-kernels runs on the training
# step's graph, forward, backward and update together, so the grad pass never meets one.
RULES["fused"] = NOT_DIFFERENTIABLE
# The library kernels with fused epilogues (partita/codegen/library.py) are made by
# fuse-library for inference, after any training: no gradient.
RULES["conv2d_pointwise"] = NOT_DIFFERENTIABLE
RULES["linear_pointwise"] = NOT_DIFFERENTIABLE
# So is attention with the rotary embedding inside (partita/codegen/rotary.py): fuse-library
# makes it for inference only (a training step keeps attention and its grad).
RULES["rotary_attention"] = NOT_DIFFERENTIABLE
RULES["add_norm"] = NOT_DIFFERENTIABLE
RULES["group_norm"] = NOT_DIFFERENTIABLE   # codegen/group_norm.py: made for inference by fuse-library
RULES["pool_mixer"] = NOT_DIFFERENTIABLE   # codegen/token_mixer.py: made for inference by CompiledProgram
RULES["se_block"] = NOT_DIFFERENTIABLE   # codegen/se_block.py: made for inference by CompiledProgram
RULES["grn"] = NOT_DIFFERENTIABLE          # codegen/grn.py: ConvNeXt v2's response norm, made for inference by fuse-library
RULES["rel_scores"] = NOT_DIFFERENTIABLE   # codegen/disentangled.py: DeBERTa-v2's c2p / p2c terms, for inference
# Quantized forms are for inference (partita.passes.quantize runs after any training; a QDQ
# ONNX model is imported for inference): rounding has no useful gradient, and an integer
# result none at all.
for _name in ("quantize_linear", "dequantize_linear", "matmul_integer"):
    RULES[_name] = NOT_DIFFERENTIABLE
# sign is piecewise constant: its derivative is 0 wherever it exists (as in PyTorch).
RULES["sign"] = lambda ctx, node, d, needs: [None]


# --- elementwise -------------------------------------------------------------------------------

@rule("add")
def _add(ctx: VjpContext, node: Node, d, needs):
    (g,) = d
    a, b = node.operands
    return [ctx.sum_to(g, a.type.shape) if needs[0] else None,
            ctx.sum_to(g, b.type.shape) if needs[1] else None]


@rule("sub")
def _sub(ctx, node, d, needs):
    (g,) = d
    a, b = node.operands
    return [ctx.sum_to(g, a.type.shape) if needs[0] else None,
            ctx.sum_to(ctx.b.neg(g), b.type.shape) if needs[1] else None]


@rule("mul")
def _mul(ctx, node, d, needs):
    (g,) = d
    a, b = node.operands
    return [ctx.sum_to(ctx.b.mul(g, b), a.type.shape) if needs[0] else None,
            ctx.sum_to(ctx.b.mul(g, a), b.type.shape) if needs[1] else None]


@rule("div")
def _div(ctx, node, d, needs):
    (g,) = d
    a, b = node.operands
    out = node.results[0]
    da = ctx.sum_to(ctx.b.div(g, b), a.type.shape) if needs[0] else None
    # d(a/b)/db = -a/b^2 = -out/b
    db = ctx.sum_to(ctx.b.neg(ctx.b.div(ctx.b.mul(g, out), b)), b.type.shape) if needs[1] else None
    return [da, db]


@rule("pow")
def _pow(ctx, node, d, needs):
    (g,) = d
    a, b = node.operands
    out = node.results[0]
    B = ctx.b
    da = db = None
    if needs[0]:
        one = ctx.scalar(1.0, b) if b.type.dtype.is_float else B.full(shape=(), value=1, dtype=b.type.dtype)
        da = ctx.sum_to(B.mul(g, B.mul(b, B.pow(a, B.sub(b, one)))), a.type.shape)
    if needs[1]:
        # As PyTorch: where the base is 0 and the exponent >= 0 the exponent's gradient is 0.
        zero_a = ctx.scalar(0.0, a)
        mask = B.logical_and(B.equal(a, zero_a), B.greater_equal(b, ctx.scalar(0.0, b)))
        t = B.mul(g, B.mul(out, B.log(a)))
        db = ctx.sum_to(B.where(mask, ctx.scalar(0.0, t), t), b.type.shape)
    return [da, db]


def _tie_mask(ctx, x: Value, y: Value, strict: str) -> Value:
    """1 where x wins strictly, 0.5 on ties, 0 where y wins (PyTorch's maximum/minimum rule)."""
    B = ctx.b
    win = B.cast(getattr(B, strict)(x, y), dtype=x.type.dtype)
    tie = B.mul(B.cast(B.equal(x, y), dtype=x.type.dtype), ctx.scalar(0.5, x))
    return B.add(win, tie)


@rule("maximum", "minimum")
def _maxmin(ctx, node, d, needs):
    (g,) = d
    a, b = node.operands
    out = node.results[0]
    strict = "greater" if node.op == "maximum" else "less"
    res: list = [None, None]
    for i, (x, y) in enumerate(((a, b), (b, a))):
        if needs[i]:
            xc = x if x.type.dtype == out.type.dtype else ctx.b.cast(x, dtype=out.type.dtype)
            yc = y if y.type.dtype == out.type.dtype else ctx.b.cast(y, dtype=out.type.dtype)
            res[i] = ctx.sum_to(ctx.b.mul(g, _tie_mask(ctx, xc, yc, strict)), x.type.shape)
    return res


def _unary(fn):
    def r(ctx, node, d, needs):
        (g,) = d
        return [fn(ctx, ctx.b, g, node.operands[0], node.results[0], node) if needs[0] else None]
    return r


RULES["neg"] = _unary(lambda c, B, g, x, y, n: B.neg(g))
RULES["abs"] = _unary(lambda c, B, g, x, y, n: B.mul(g, B.sign(x)))
RULES["exp"] = _unary(lambda c, B, g, x, y, n: B.mul(g, y))
RULES["log"] = _unary(lambda c, B, g, x, y, n: B.div(g, x))
RULES["sqrt"] = _unary(lambda c, B, g, x, y, n: B.div(g, B.mul(y, c.scalar(2.0, y))))
RULES["rsqrt"] = _unary(lambda c, B, g, x, y, n: B.mul(g, B.mul(B.mul(y, B.mul(y, y)), c.scalar(-0.5, y))))
RULES["sin"] = _unary(lambda c, B, g, x, y, n: B.mul(g, B.cos(x)))
RULES["cos"] = _unary(lambda c, B, g, x, y, n: B.neg(B.mul(g, B.sin(x))))
RULES["erf"] = _unary(lambda c, B, g, x, y, n: B.mul(
    g, B.mul(B.exp(B.neg(B.mul(x, x))), c.scalar(2.0 / math.sqrt(math.pi), x))))
RULES["tanh"] = _unary(lambda c, B, g, x, y, n: B.tanh_grad(g, y))
RULES["sigmoid"] = _unary(lambda c, B, g, x, y, n: B.sigmoid_grad(g, y))
RULES["relu"] = _unary(lambda c, B, g, x, y, n: B.relu_grad(g, y))
RULES["silu"] = _unary(lambda c, B, g, x, y, n: B.silu_grad(g, x))
RULES["gelu"] = _unary(lambda c, B, g, x, y, n: B.gelu_grad(g, x, approximate=n.attrs["approximate"]))
RULES["softmax"] = _unary(lambda c, B, g, x, y, n: B.softmax_grad(g, y, axis=n.attrs["axis"]))
RULES["log_softmax"] = _unary(lambda c, B, g, x, y, n: B.log_softmax_grad(g, y, axis=n.attrs["axis"]))


@rule("cast")
def _cast(ctx, node, d, needs):
    (g,) = d
    (x,) = node.operands
    if not needs[0] or not x.type.dtype.is_float:
        return [None]
    return [ctx.b.cast(g, dtype=x.type.dtype)]


@rule("where")
def _where(ctx, node, d, needs):
    (g,) = d
    c, x, y = node.operands
    zero = ctx.scalar(0.0, g)
    return [None,
            ctx.sum_to(ctx.b.where(c, g, zero), x.type.shape) if needs[1] else None,
            ctx.sum_to(ctx.b.where(c, zero, g), y.type.shape) if needs[2] else None]


@rule("dropout")
def _dropout(ctx, node, d, needs):
    (g,) = d
    if not node.attrs["train"]:
        return [g]
    # The mask is a hash of the element index and the seed, so the same op on the gradient
    # applies the same mask and scale (a piece's: with the same origin).
    return [ctx.b.dropout(g, *node.operands[1:], **node.attrs)] + [None] * (len(node.operands) - 1)


# --- reductions ----------------------------------------------------------------------------------

@rule("sum")
def _sum(ctx, node, d, needs):
    (g,) = d
    (x,) = node.operands
    if g.type.dtype != x.type.dtype:
        g = ctx.b.cast(g, dtype=x.type.dtype)
    return [ctx.expand_reduced(g, x, node.attrs["axes"], node.attrs["keepdim"])]


def _count(x: Value, axes) -> int:
    rank = x.type.rank
    ax = range(rank) if axes is None else [a % rank for a in axes]
    n = 1
    for a in ax:
        n *= x.type.shape[a]
    return n


@rule("mean")
def _mean(ctx, node, d, needs):
    (g,) = d
    (x,) = node.operands
    n = _count(x, node.attrs["axes"])
    g = ctx.b.div(g, ctx.scalar(float(n), g))
    return [ctx.expand_reduced(g, x, node.attrs["axes"], node.attrs["keepdim"])]


@rule("max", "min")
def _max(ctx, node, d, needs):
    # The gradient is shared evenly among the elements equal to the extremum (as PyTorch's
    # amax/amin).
    (g,) = d
    (x,) = node.operands
    B = ctx.b
    axes, keep = node.attrs["axes"], node.attrs["keepdim"]
    out = ctx.expand_reduced(node.results[0], x, axes, keep)
    mask = B.cast(B.equal(x, out), dtype=x.type.dtype)
    count = ctx.expand_reduced(B.sum(mask, axes=axes, keepdim=keep), x, axes, keep)
    return [B.div(B.mul(ctx.expand_reduced(g, x, axes, keep), mask), count)]


@rule("prod")
def _prod(ctx, node, d, needs):
    # Exact with zeros: with no zero in a slice the gradient is out / x; with one zero only that
    # element gets the product of the others; with two or more every gradient is 0.
    (g,) = d
    (x,) = node.operands
    if not x.type.dtype.is_float:
        return [None]
    B = ctx.b
    axes, keep = node.attrs["axes"], node.attrs["keepdim"]
    zero, one = ctx.scalar(0.0, x), ctx.scalar(1.0, x)
    is_zero = B.equal(x, zero)
    safe = B.where(is_zero, one, x)
    p_nonzero = ctx.expand_reduced(B.prod(safe, axes=axes, keepdim=keep), x, axes, keep)
    nz = ctx.expand_reduced(B.sum(B.cast(is_zero, dtype=x.type.dtype), axes=axes, keepdim=keep), x, axes, keep)
    gx = ctx.expand_reduced(g, x, axes, keep)
    no_zero = B.div(p_nonzero, safe)
    one_zero = B.where(is_zero, p_nonzero, zero)
    local = B.where(B.equal(nz, zero), no_zero, B.where(B.equal(nz, one), one_zero, zero))
    return [B.mul(gx, local)]


@rule("cumsum")
def _cumsum(ctx, node, d, needs):
    # Reverse cumulative sum: sum_{j >= i} g_j = total - cumsum(g)_i + g_i.
    (g,) = d
    (x,) = node.operands
    if not x.type.dtype.is_float:
        return [None]
    B = ctx.b
    axis = node.attrs["axis"]
    total = B.sum(g, axes=[axis], keepdim=True)
    return [B.add(B.sub(total, B.cumsum(g, axis=axis)), g)]


# --- linear algebra ------------------------------------------------------------------------------

def _swap_last(ctx, v: Value) -> Value:
    r = v.type.rank
    perm = list(range(r - 2)) + [r - 1, r - 2]
    return ctx.b.transpose(v, perm=perm)


@rule("matmul")
def _matmul(ctx, node, d, needs):
    (g,) = d
    a, b = node.operands
    B = ctx.b
    # Lift 1-D operands to matrices (as matmul does), so one pair of formulas covers all cases.
    A = B.unsqueeze(a, axes=[0]) if a.type.rank == 1 else a
    Bm = B.unsqueeze(b, axes=[1]) if b.type.rank == 1 else b
    batch = _broadcast_batch(A.type.shape[:-2], Bm.type.shape[:-2])
    G = ctx.reshape(g, batch + (A.type.shape[-2], Bm.type.shape[-1]))
    da = db = None
    if needs[0]:
        da = ctx.reshape(ctx.sum_to(B.matmul(G, _swap_last(ctx, Bm)), A.type.shape), a.type.shape)
    if needs[1]:
        if Bm.type.rank == 2 and A.type.rank > 2:
            # A weight shared by every batch row: one GEMM over the flattened rows instead of
            # a batched product followed by a sum.
            k, n = Bm.type.shape
            A = B.reshape(A, shape=(_rows(A), k))
            G = B.reshape(G, shape=(_rows(G), n))
        if Bm.type.rank == 2 and A.type.rank == 2 and _is_swap(b):
            # b = transpose(w) (a linear layer's weight): compute dw = G^T A directly in w's
            # layout and hand back its transpose, which cancels with the transpose's own rule.
            db = B.transpose(B.matmul(_swap_last(ctx, G), A), perm=[1, 0])
        else:
            db = ctx.sum_to(B.matmul(_swap_last(ctx, A), G), Bm.type.shape)
        db = ctx.reshape(db, b.type.shape)
    return [da, db]


def _rows(v: Value) -> int:
    n = 1
    for s in v.type.shape[:-1]:
        n *= s
    return n


def _is_swap(v: Value) -> bool:
    p = v.producer
    return p is not None and p.op == "transpose" and v.type.rank == 2 and transpose_perm(2, p.attrs["perm"]) == (1, 0)


def _broadcast_batch(s: tuple, t: tuple) -> tuple:
    n = max(len(s), len(t))
    s = (1,) * (n - len(s)) + tuple(s)
    t = (1,) * (n - len(t)) + tuple(t)
    return tuple(max(x, y) if 1 in (x, y) else x for x, y in zip(s, t))


# --- shape ---------------------------------------------------------------------------------------

@rule("reshape", "squeeze", "unsqueeze")
def _reshape(ctx, node, d, needs):
    (g,) = d
    return [ctx.reshape(g, node.operands[0].type.shape)]


@rule("broadcast_to")
def _broadcast_to(ctx, node, d, needs):
    (g,) = d
    return [ctx.sum_to(g, node.operands[0].type.shape)]


@rule("transpose")
def _transpose(ctx, node, d, needs):
    (g,) = d
    (x,) = node.operands
    perm = node.attrs["perm"]
    r = x.type.rank
    perm = tuple(range(r - 1, -1, -1)) if perm is None else tuple(p % r for p in perm)
    inv = [0] * r
    for i, p in enumerate(perm):
        inv[p] = i
    return [ctx.b.transpose(g, perm=inv)]


@rule("concat")
def _concat(ctx, node, d, needs):
    (g,) = d
    axis = node.attrs["axis"]
    sizes = [v.type.shape[axis % v.type.rank] for v in node.operands]
    if len(sizes) == 1:
        return [g]
    pieces = ctx.b.split(g, axis=axis, sizes=sizes)
    return [p if need else None for p, need in zip(pieces, needs)]


@rule("split")
def _split(ctx, node, d, needs):
    parts = [g if g is not None else ctx.zeros_like(r) for g, r in zip(d, node.results)]
    if len(parts) == 1:
        return [parts[0]]
    return [ctx.b.concat(*parts, axis=node.attrs["axis"])]


@rule("slice")
def _slice(ctx, node, d, needs):
    (g,) = d
    (x,) = node.operands
    a = node.attrs
    return [ctx.b.slice_grad(g, shape=x.type.shape, axis=a["axis"], start=a["start"], end=a["end"],
                             step=a["step"])]


@rule("pad")
def _pad(ctx, node, d, needs):
    (g,) = d
    (x,) = node.operands
    pads = node.attrs["pads"]
    for axis, size in enumerate(x.type.shape):
        before, after = pads[2 * axis], pads[2 * axis + 1]
        if before or after:
            g = ctx.b.slice(g, axis=axis, start=before, end=before + size)
    return [g]


@rule("gather")
def _gather(ctx, node, d, needs):
    (g,) = d
    x, index = node.operands
    return [ctx.b.scatter_add(ctx.zeros_like(x), index, g, axis=node.attrs["axis"]), None]


@rule("topk", "sort")
def _topk_sort(ctx, node, d, needs):
    # Each selected value came from one element of x: its gradient goes back there.
    g = d[0]
    if g is None:
        return [None]
    x = node.operands[0]
    return [ctx.b.scatter_add(ctx.zeros_like(x), node.results[1], g, axis=node.attrs["axis"])]


@rule("index_select")
def _index_select(ctx, node, d, needs):
    (g,) = d
    x, index = node.operands
    return [ctx.b.index_add(ctx.zeros_like(x), index, g, axis=node.attrs["axis"]), None]


@rule("embedding")
def _embedding(ctx, node, d, needs):
    (g,) = d
    table, idx = node.operands
    return [ctx.b.embedding_grad(g, idx, num_embeddings=table.type.shape[0]), None]


# --- nn ------------------------------------------------------------------------------------------

@rule("layer_norm")
def _layer_norm(ctx, node, d, needs):
    (g,) = d
    x, *wb = node.operands
    dx, dw, db = ctx.b.layer_norm_grad(g, x, *wb[:1], axes=node.attrs["axes"], eps=node.attrs["eps"])
    return [dx, dw, db][:len(node.operands)]


@rule("rms_norm")
def _rms_norm(ctx, node, d, needs):
    (g,) = d
    x, *w = node.operands
    dx, dw = ctx.b.rms_norm_grad(g, x, *w, axes=node.attrs["axes"], eps=node.attrs["eps"])
    return [dx, dw][:len(node.operands)]


@rule("attention")
def _attention(ctx, node, d, needs):
    g, glse = d
    q, k, v, *mask = node.operands
    if mask and needs[3] and mask[0].type.dtype.is_bool:
        name = f"%{mask[0].name} " if mask[0].name is not None else ""
        raise AutodiffError(f"the attention mask {name}({mask[0].type}) is bool and depends on the differentiated "
                            f"inputs; a bool mask has no gradient: compute it from non-param inputs")
    out, lse = node.results
    B = ctx.b
    if g is None:
        g = ctx.zeros_like(out)
    # A learned additive bias (BEiT's and Swin's relative position bias, T5's position bias)
    # gets the scores' gradient, summed over the dims it broadcasts along.
    dmask = [_attention_mask_grad(B, node, g, glse)] if mask and needs[3] else [None] * len(mask)
    if glse is None:
        dq, dk, dv = B.attention_grad(g, q, k, v, out, lse, *mask, **node.attrs)
        return [dq, dk, dv] + dmask
    # dlse_i / ds_ij = p_ij, which adds glse_i to dp_ij = dout_i . v_j: one more value column
    # of ones with glse as its dout column gives that, and a zero out column leaves
    # rowsum(dout * out) as it was. The extra column of dv is dropped.
    dt = q.type.dtype
    col = v.type.shape[:-1] + (1,)
    v1 = B.concat(v, B.full(shape=col, value=1.0, dtype=dt), axis=-1)
    out1 = B.concat(out, B.full(shape=out.type.shape[:-1] + (1,), value=0.0, dtype=dt), axis=-1)
    g1 = B.concat(g, B.cast(B.unsqueeze(glse, axes=(lse.type.rank,)), dtype=dt), axis=-1)
    dq, dk, dv1 = B.attention_grad(g1, q, k, v1, out1, lse, *mask, **node.attrs)
    dv = B.slice(dv1, axis=-1, start=0, end=v.type.shape[-1])
    return [dq, dk, dv] + dmask


def _attention_mask_grad(B, node, g, glse):
    """d loss / d mask of ``attention`` for an additive float mask: the gradient of the scores
    ``s = q k^T * scale + mask`` (masked causally), ``ds = p * (dp - rowsum(dout * out)) +
    p * dlse`` with ``p = exp(s - lse)`` and ``dp = dout v^T`` (the flash-attention backward's
    algebra, here spelled in ops because the fused kernel does not return it), summed over the
    dims the mask broadcasts along."""
    q, k, v, mask = node.operands
    out, lse = node.results
    dt = q.type.dtype
    rank = q.type.rank
    tq, tk = q.type.shape[-2], k.type.shape[-2]
    scale = float(attention_scale(node.attrs, q.type.shape[-1]))
    perm = tuple(range(rank - 2)) + (rank - 1, rank - 2)
    s = B.mul(B.matmul(q, B.transpose(k, perm=perm)), B.full(shape=(), value=scale, dtype=dt))
    s = B.add(s, B.cast(mask, dtype=dt) if mask.type.dtype != dt else mask)
    if node.attrs.get("causal"):
        keep = B.greater_equal(B.iota(shape=(tq, tk), axis=0), B.iota(shape=(tq, tk), axis=1))
        s = B.where(keep, s, B.full(shape=(), value=float("-inf"), dtype=dt))
    lse_d = B.cast(lse, dtype=dt) if lse.type.dtype != dt else lse
    p = B.exp(B.sub(s, B.unsqueeze(lse_d, axes=(rank - 1,))))
    dp = B.matmul(g, B.transpose(v, perm=perm))
    rows = B.sum(B.mul(g, out), axes=(rank - 1,), keepdim=True)
    ds = B.mul(p, B.sub(dp, rows))
    if glse is not None:
        gl = B.cast(glse, dtype=dt) if glse.type.dtype != dt else glse
        ds = B.add(ds, B.mul(p, B.unsqueeze(gl, axes=(rank - 1,))))
    ms = mask.type.shape
    lead = rank - len(ms)
    full = ds.type.shape
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(ms) if n == 1 and full[lead + i] != 1)
    dm = B.sum(ds, axes=axes, keepdim=True) if axes else ds
    if dm.type.shape != ms:
        dm = B.reshape(dm, shape=ms)
    return B.cast(dm, dtype=mask.type.dtype) if mask.type.dtype != dt else dm


@rule("masked_softmax")
def _masked_softmax(ctx, node, d, needs):
    (g,) = d
    x, *mask = node.operands
    if mask and needs[1]:
        name = f"%{mask[0].name} " if mask[0].name is not None else ""
        raise AutodiffError(f"the masked_softmax mask {name}({mask[0].type}) depends on the differentiated inputs, "
                            f"but masked_softmax does not differentiate its mask; compute the mask from non-param "
                            f"inputs, or add it to the scores before a plain softmax")
    (y,) = node.results
    dx = ctx.b.masked_softmax_grad(g, y, scale=node.attrs["scale"], causal=node.attrs["causal"])
    return [dx] + [None] * len(mask)


@rule("conv2d", "conv3d")
def _conv2d(ctx, node, d, needs):
    (g,) = d
    x, w = node.operands[:2]
    a = node.attrs
    mask = [int(n) for n in needs] + [0] * (3 - len(needs))
    dx, dw, db = ctx.b.conv2d_grad(g, x, w, stride=a["stride"], padding=a["padding"], dilation=a["dilation"],
                                   groups=a["groups"], mask=mask)
    return [dx, dw, db][:len(node.operands)]


@rule("conv_transpose2d", "conv_transpose3d")
def _conv_transpose(ctx, node, d, needs):
    # y = conv_transpose(x, w) is the input-gradient of a convolution, so x's gradient is
    # that convolution applied to dy, and w's gradient is the convolution's weight gradient
    # with the roles of x (as its output gradient) and dy (as its input) exchanged.
    (g,) = d
    x, w = node.operands[:2]
    a = node.attrs
    conv = "conv2d" if node.op == "conv_transpose2d" else "conv3d"
    B = ctx.b
    dx = B.emit(conv, g, w, stride=a["stride"], padding=a["padding"], dilation=a["dilation"],
                groups=a["groups"]) if needs[0] else None
    dw = None
    if needs[1]:
        _, dw, _ = B.conv2d_grad(x, g, w, stride=a["stride"], padding=a["padding"], dilation=a["dilation"],
                                 groups=a["groups"])
    res = [dx, dw]
    if len(node.operands) > 2:
        axes = [0] + list(range(2, g.type.rank))
        res.append(B.sum(g, axes=axes) if needs[2] else None)
    return res


@rule("max_pool2d", "max_pool3d")
def _max_pool2d(ctx, node, d, needs):
    # The forward pool becomes its with-indices form, so the backward reads the argmax the
    # forward found instead of searching every window again (as autograd saves it).
    (g,) = d
    (x,) = node.operands
    op = OPS[f"{node.op}_with_indices"]
    fwd = Node(op.name, [x], dict(node.attrs), op.infer_types([x.type], node.attrs), node.loc or node.text_loc,
               [None, None])
    ctx.graph.insert_after(node, fwd)
    ctx.graph.replace_all_uses(node.results[0], fwd.results[0])
    return [ctx.b.max_pool2d_grad(g, x, fwd.results[1], **node.attrs)]


@rule("max_pool2d_with_indices", "max_pool3d_with_indices")
def _max_pool_with_indices(ctx, node, d, needs):
    g = d[0]
    if g is None:
        return [None]
    return [ctx.b.max_pool2d_grad(g, node.operands[0], node.results[1], **node.attrs)]


@rule("avg_pool2d", "avg_pool3d")
def _avg_pool2d(ctx, node, d, needs):
    (g,) = d
    return [ctx.b.avg_pool2d_grad(g, node.operands[0], **node.attrs)]


@rule("batch_norm")
def _batch_norm(ctx, node, d, needs):
    g = d[0]
    x, w, b, rm, rv = node.operands
    if g is None:
        return [None] * 5
    B = ctx.b
    if node.attrs["training"]:
        dx, dw, db = B.batch_norm_grad(g, x, w, eps=node.attrs["eps"])
        return [dx, dw, db, None, None]
    # Inference form: an affine map per channel with the running statistics held fixed.
    dx, dw, db = B.batch_norm_grad(g, x, w, rm, rv, eps=node.attrs["eps"], training=False)
    return [dx, dw, db, None, None]


@rule("cross_entropy")
def _cross_entropy(ctx, node, d, needs):
    (g,) = d
    logits, target = node.operands
    return [ctx.b.cross_entropy_grad(g, logits, target, **node.attrs), None]


@rule("scatter_add")
def _scatter_add(ctx, node, d, needs):
    (g,) = d
    x, index, src = node.operands
    return [g if needs[0] else None, None,
            ctx.b.gather(g, index, axis=node.attrs["axis"]) if needs[2] else None]


@rule("index_add")
def _index_add(ctx, node, d, needs):
    (g,) = d
    x, index, src = node.operands
    return [g if needs[0] else None, None,
            ctx.b.index_select(g, index, axis=node.attrs["axis"]) if needs[2] else None]


# --- rounding, inverse and hyperbolic functions, bitwise ops, remainders -----------------------

# Integer or bool results (bitwise, shifts, float classes, integer division): never differentiated.
for _name in ("isnan", "isinf", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
              "bitwise_left_shift", "bitwise_right_shift", "int_div"):
    RULES[_name] = NOT_DIFFERENTIABLE
# Rounding is piecewise constant: its derivative is 0 wherever it exists (as sign, and PyTorch).
for _name in ("floor", "ceil", "round", "trunc"):
    RULES[_name] = lambda ctx, node, d, needs: [None]


def _one_minus_sq(c, B, x):
    return B.sub(c.scalar(1.0, x), B.mul(x, x))


RULES["tan"] = _unary(lambda c, B, g, x, y, n: B.mul(g, B.add(c.scalar(1.0, y), B.mul(y, y))))
RULES["asin"] = _unary(lambda c, B, g, x, y, n: B.mul(g, B.rsqrt(_one_minus_sq(c, B, x))))
RULES["acos"] = _unary(lambda c, B, g, x, y, n: B.neg(B.mul(g, B.rsqrt(_one_minus_sq(c, B, x)))))
RULES["atan"] = _unary(lambda c, B, g, x, y, n: B.div(g, B.add(c.scalar(1.0, x), B.mul(x, x))))
RULES["sinh"] = _unary(lambda c, B, g, x, y, n: B.mul(g, B.cosh(x)))
RULES["cosh"] = _unary(lambda c, B, g, x, y, n: B.mul(g, B.sinh(x)))
RULES["asinh"] = _unary(lambda c, B, g, x, y, n: B.mul(g, B.rsqrt(B.add(B.mul(x, x), c.scalar(1.0, x)))))
RULES["acosh"] = _unary(lambda c, B, g, x, y, n: B.mul(g, B.rsqrt(B.sub(B.mul(x, x), c.scalar(1.0, x)))))
RULES["atanh"] = _unary(lambda c, B, g, x, y, n: B.div(g, _one_minus_sq(c, B, x)))


@rule("remainder", "fmod")
def _remainder(ctx, node, d, needs):
    # a - q * b with q = floor(a / b) (remainder) or trunc(a / b) (fmod), piecewise constant:
    # d/da = 1, d/db = -q (PyTorch's rule).
    (g,) = d
    a, b = node.operands
    B = ctx.b
    da = ctx.sum_to(g, a.type.shape) if needs[0] else None
    db = None
    if needs[1]:
        q = B.div(a, b)
        q = B.floor(q) if node.op == "remainder" else B.trunc(q)
        db = ctx.sum_to(B.neg(B.mul(g, q)), b.type.shape)
    return [da, db]


# --- scatter_elements and cumprod (ops/index_scan.py) ---------------------------------------------

@rule("scatter_elements")
def _scatter_elements(ctx, node, d, needs):
    # none: the written positions take src's gradient, the rest x's (exact when the index
    # has no repeats; with repeats the write that wins is unspecified). add: as scatter_add.
    # mul/max/min have no simple exact vjp (ties, zeros): refused.
    (g,) = d
    x, index, src = node.operands
    axis, red = node.attrs["axis"], node.attrs["reduction"]
    if red not in ("none", "add"):
        raise AutodiffError(f"scatter_elements with reduction '{red}' is not differentiable in partita "
                            "(only 'none' and 'add' are); stop the gradient before it")
    from ..ir.types import TensorType

    B = ctx.b
    dx = dsrc = None
    if needs[0]:
        dx = g if red == "add" else B.scatter_elements(g, index, ctx.zeros(TensorType(index.type.shape, g.type.dtype)),
                                                       axis=axis)
    if needs[2]:
        picked = B.gather(g, index, axis=axis)
        if index.type.shape != src.type.shape:
            # src is read over the index's extent only: the rest of it gets zeros.
            pads = [p for i, s in zip(index.type.shape, src.type.shape) for p in (0, s - i)]
            picked = B.pad(picked, pads=pads, value=0.0)
        dsrc = picked
    return [dx, None, dsrc]


@rule("cumprod")
def _cumprod(ctx, node, d, needs):
    # Exact with zeros (no division): dx_i = sum_{j >= i} g_j * prod_{k <= j, k != i} x_k. The
    # products leaving out x_i are a cumprod over a copy of x per i with x_i set to 1, an
    # O(n^2) tensor along the axis.
    (g,) = d
    (x,) = node.operands
    if not x.type.dtype.is_float:
        return [None]
    B = ctx.b
    r = max(x.type.rank, 1)
    axis = node.attrs["axis"] % r
    xv = x if x.type.rank else B.reshape(x, shape=[1])
    gv = g if g.type.rank else B.reshape(g, shape=[1])
    n = xv.type.shape[axis]
    tail = [1] * (r - axis - 1)
    rows = B.reshape(B.iota(shape=[n, n], axis=0), shape=[n, n] + tail)
    cols = B.reshape(B.iota(shape=[n, n], axis=1), shape=[n, n] + tail)
    copies = B.where(B.equal(rows, cols), ctx.scalar(1.0, x), B.unsqueeze(xv, axes=[axis]))
    partial = B.cumprod(copies, axis=axis + 1)
    terms = B.mul(partial, B.unsqueeze(gv, axes=[axis]))
    dx = B.sum(B.where(B.greater_equal(cols, rows), terms, ctx.scalar(0.0, x)), axes=[axis + 1])
    return [dx if x.type.rank else B.reshape(dx, shape=[])]
