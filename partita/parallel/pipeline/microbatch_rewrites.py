"""Exact rewrites that let the microbatch partition see rows that never mix.

The microbatch analysis (``build.microbatch_graph``) splits the batch inputs over a virtual
``mb`` axis with the sharding rules of data parallelism. Two patterns that keep each
microbatch's rows to themselves are beyond those rules, which then move the value across the
microbatches (a collective the pipeline must refuse):

- a reshape whose leading dims both sides regroup together (``[B*C*h, w, ...] ->
  [B, C, h*w, ...]``, MobileViT's unfolding; ``[B, S, d] -> [G, B*S/G, d]``, the token
  groups of an MoE layer): the sharding rule splits only identities, merges and splits. It
  becomes three reshapes that factor the microbatches out of the group's leading dim
  (``[M, n, ...]``), regroup the rest, and merge them back;
- an ``index_select`` along a batch-split axis with a constant index (computed from shapes
  alone) that reads, for every output block of a microbatch, the same offsets of that
  microbatch's own input block (Swin's pooler's identity gather; the padding mask's
  ``b * S + j``): the rule wants the input whole. It becomes a reshape to ``[M, n]``, the
  gather of one block's offsets along ``n``, and a reshape back.

Each rewrite is an identity of the global graph (the same values, by construction and by the
checks here), so a partition of the rewritten graph is as exact as any other.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from ...ir.attrs import DenseAttr
from ...ir.builder import Builder
from ...ir.graph import Graph, Node, Value
from ...ops.registry import OPS, normalize_axis
from ..sharding import reshape_groups


def rewrite_for_microbatches(g: Graph, microbatches: int, nodes: Iterable[Node]) -> bool:
    """Rewrite each of ``nodes`` (or the producers of their operands) that one of the two
    patterns above covers, in place; True when any was rewritten."""
    done = False
    seen: set[Node] = set()
    for node in nodes:
        for n in [node] + suspects(node.operands):
            if n in seen or n.graph is not g:
                continue
            seen.add(n)
            if n.op == "reshape" and factor_reshape(g, n, microbatches):
                done = True
            elif n.op in ("index_select", "embedding") and blockwise_index_select(g, n, microbatches):
                done = True
    return done


# Ops that only move or retype elements: a gather's rows pass through them unchanged in number.
VIEW_OPS = frozenset({"reshape", "transpose", "squeeze", "unsqueeze", "cast"})


def suspects(values: Iterable[Value]) -> list[Node]:
    """The producers of ``values``, and on through views (VIEW_OPS) up to the first other op:
    the nodes whose rewrite may let a consumer of ``values`` keep its rows."""
    out: list[Node] = []
    for v in values:
        n = v.producer
        while n is not None and n not in out:
            out.append(n)
            n = n.operands[0].producer if n.op in VIEW_OPS and n.operands else None
    return out


def factored_shapes(ins: tuple[int, ...], outs: tuple[int, ...], m: int) -> tuple[list[int], list[int]] | None:
    """For a reshape ``ins -> outs`` with regrouped dims (a block of several input dims and
    several output dims), the two shapes with the leading dim of each such block factored as
    ``[m, n]``; None when there is no such block or ``m`` divides neither leading dim."""
    mid_in, mid_out = list(ins), list(outs)
    split_in: list[int] = []
    split_out: list[int] = []
    for ga, gb in reshape_groups(ins, outs):
        if len(ga) == 1 or len(gb) == 1:
            continue
        if ins[ga[0]] % m or outs[gb[0]] % m:
            continue
        split_in.append(ga[0])
        split_out.append(gb[0])
    if not split_in:
        return None
    for i in sorted(split_in, reverse=True):
        mid_in[i:i + 1] = [m, ins[i] // m]
    for j in sorted(split_out, reverse=True):
        mid_out[j:j + 1] = [m, outs[j] // m]
    return mid_in, mid_out


def factor_reshape(g: Graph, node: Node, m: int) -> bool:
    """Replace a reshape whose regrouped blocks start with dims that ``m`` divides by three
    reshapes (see the module docstring); False when it has no such block."""
    x, out = node.operands[0], node.results[0]
    shapes = factored_shapes(tuple(x.type.shape), tuple(out.type.shape), m)
    if shapes is None:
        return False
    mid_in, mid_out = shapes
    b = Builder(g, loc=node.loc)
    b.set_insertion_before(node)
    a = _reshape(b, x, mid_in)
    c = _reshape(b, a, mid_out)
    y = _reshape(b, c, list(out.type.shape))
    g.replace_all_uses(out, y)
    g.erase(node)
    return True


def constant_value(v: Value, limit: int = 1 << 16) -> np.ndarray | None:
    """The value of ``v`` when it is computed from constants alone (no graph input, no op
    with effects), evaluated with the ops' references; None otherwise or when large."""
    memo: dict[Value, np.ndarray] = {}

    def value(w: Value) -> np.ndarray | None:
        if w in memo:
            return memo[w]
        n = w.producer
        if n is None or w.type.numel > limit:
            return None
        opdef = OPS.get(n.op)
        if opdef is None or opdef.effects_of(n.attrs) or opdef.collective is not None:
            return None
        args = []
        for o in n.operands:
            a = value(o)
            if a is None:
                return None
            args.append(a)
        try:
            with np.errstate(all="ignore"):
                res = opdef.reference(args, n.attrs)
        except Exception:  # noqa: BLE001: a reference that fails leaves the value unknown
            return None
        res = res if isinstance(res, (list, tuple)) else (res,)
        for r, a in zip(n.results, res):
            a = np.asarray(a)
            if a.shape != tuple(r.type.shape):
                return None
            memo[r] = a.astype(r.type.dtype.np) if a.dtype != r.type.dtype.np else a
        return memo.get(w)

    return value(v)


def block_offsets(idx: np.ndarray, n_in: int, m: int) -> np.ndarray | None:
    """The offsets one block of ``idx`` reads in its own block of ``n_in`` rows, when every
    one of the ``m`` blocks of ``idx`` reads the same offsets of the input block of the same
    number; else None."""
    if idx.ndim != 1 or idx.size % m or n_in % m:
        return None
    n, k = n_in // m, idx.size // m
    blocks = idx.astype(np.int64).reshape(m, k) - (np.arange(m, dtype=np.int64) * n)[:, None]
    first = blocks[0]
    if np.any(first < 0) or np.any(first >= n) or np.any(blocks != first[None, :]):
        return None
    return first


def gather_axis(node: Node) -> int | None:
    """The axis of its first operand that a gather by a list of rows reads along: an
    ``index_select``'s axis, an ``embedding``'s table rows (0); None for another op."""
    if node.op == "index_select":
        return normalize_axis(node.attrs["axis"], node.operands[0].type.rank, "index_select")
    if node.op == "embedding":
        return 0
    return None


def blockwise_index_select(g: Graph, node: Node, m: int) -> bool:
    """Replace an ``index_select`` (or an ``embedding`` lookup of rows) with a constant index
    that reads per block (see the module docstring) by a gather inside ``[m, n]`` blocks;
    False when the index is not a constant or some block reads rows of another."""
    ax = gather_axis(node)
    if ax is None:
        return False
    x, idx = node.operands
    out = node.results[0]
    a = constant_value(idx)
    if a is None or (a.ndim and a.shape[0] % m):
        return False
    offsets = block_offsets(a.reshape(-1), x.type.shape[ax], m)
    if offsets is None:
        return False
    shape = list(x.type.shape)
    b = Builder(g, loc=node.loc)
    b.set_insertion_before(node)
    blocks = _reshape(b, x, shape[:ax] + [m, shape[ax] // m] + shape[ax + 1:])
    local = b.emit_node("constant", [], {"value": DenseAttr(offsets.astype(idx.type.dtype.np))}).results[0]
    picked = b.emit_node("index_select", [blocks, local], {"axis": ax + 1}).results[0]
    y = _reshape(b, picked, list(out.type.shape))
    g.replace_all_uses(out, y)
    g.erase(node)
    return True


def index_reason(node: Node, m: int, name: Callable[[Value], str]) -> str | None:
    """Why a gather (``index_select``, ``embedding``) that the microbatch partition refuses
    mixes microbatches: its index's origin, or the rows of other microbatches its constant
    index reads; None for another op. ``name``: a value's name in messages."""
    ax = gather_axis(node)
    if ax is None:
        return None
    x, idx = node.operands
    if constant_value(idx) is None:
        return (f"its index %{name(idx)} is computed at run time, so which microbatch's rows it reads "
                "is not known when the pipeline is built")
    return (f"its constant index does not read, for each of the {m} microbatches, the same rows of that "
            f"microbatch's own block of the {x.type.shape[ax]} rows along axis {ax}")


def _reshape(b: Builder, x: Value, shape: list[int]) -> Value:
    """``x`` reshaped to ``shape`` (itself when it has that shape)."""
    if list(x.type.shape) == list(shape):
        return x
    return b.emit_node("reshape", [x], {"shape": tuple(shape)}).results[0]


__all__ = ["block_offsets", "blockwise_index_select", "constant_value", "factor_reshape", "factored_shapes",
           "gather_axis", "index_reason", "rewrite_for_microbatches", "suspects"]
