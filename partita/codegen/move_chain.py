"""Chains of reshapes and transposes as one transpose (issue 37).

MobileViT unfolds a feature map [B, C, H, W] into patches [B * P, N, C] with reshape, transpose,
reshape, transpose, reshape, and folds it back the same way: each transpose read by a reshape is
one copy of the tensor, two per unfold. Any chain of reshapes and transposes is one permutation
of ``x``'s elements: split ``x``'s dims into the factors the chain's reshapes cut them into, and
the chain is reshape (a view), one transpose over those factors, reshape. ``fold_move_chains``
makes that rewrite where a chain holds two transposes or more (a lone transpose stays as it is,
the attention matchers read the heads' moves from it): one copy instead of two or more.
"""
from __future__ import annotations

import math
from typing import Any

from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType
from ..ops import OPS
from ..passes.rewrite import erase_if_dead

__all__ = ["chain_permutation", "fold_move_chain", "fold_move_chains"]

MOVES = ("reshape", "transpose")


def _regroup(flat: list[int], sizes: dict[int, int], order: list[int], shape: tuple[int, ...],
             fresh: list[int]) -> list[list[int]] | None:
    """``flat`` (atoms in the tensor's row-major order) cut into the dims of ``shape``, atoms
    split where a dim ends inside one (``order`` and ``sizes`` updated); None if a dim does not
    end on a factor of an atom."""
    groups: list[list[int]] = []
    i = 0
    for d in shape:
        group: list[int] = []
        prod = 1
        while prod < d:
            if i >= len(flat):
                return None
            a = flat[i]
            s = sizes[a]
            if prod * s <= d:
                group.append(a)
                prod *= s
                i += 1
                continue
            if d % prod or s % (d // prod):
                return None
            outer, inner = fresh[0], fresh[0] + 1
            fresh[0] += 2
            sizes[outer], sizes[inner] = d // prod, s // (d // prod)
            k = order.index(a)
            order[k:k + 1] = [outer, inner]
            flat[i:i + 1] = [outer, inner]
            group.append(outer)
            prod = d
            i += 1
        if prod != d:
            return None
        groups.append(group)
    return groups if i == len(flat) else None


def chain_permutation(shape: tuple[int, ...], chain: list[tuple[str, tuple[int, ...]]]
                      ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """For ``x`` of ``shape`` taken through ``chain`` (("reshape", new shape) or ("transpose",
    perm) in turn): (the factors of ``x``'s dims in its row-major order, the permutation of
    them that gives the chain's result in row-major order), adjacent factors that stay together
    merged; None where a reshape cuts a dim other than on a factor."""
    sizes: dict[int, int] = {}
    order: list[int] = []
    axes: list[list[int]] = []
    for i, d in enumerate(shape):
        if d != 1:
            sizes[i] = d
            order.append(i)
        axes.append([i] if d != 1 else [])
    fresh = [len(shape)]
    for op, arg in chain:
        if op == "transpose":
            axes = [axes[p] for p in arg]
            continue
        flat = [a for ax in axes for a in ax]
        groups = _regroup(flat, sizes, order, tuple(d for d in arg), fresh)
        if groups is None:
            return None
        axes = groups
    flat = [a for ax in axes for a in ax]
    # merge factors adjacent in both orders
    runs: list[list[int]] = []
    for a in flat:
        if runs and order.index(a) == order.index(runs[-1][-1]) + 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    starts = sorted(runs, key=lambda r: order.index(r[0]))
    factors = tuple(math.prod(sizes[a] for a in r) for r in starts)
    perm = tuple(starts.index(r) for r in runs)
    return factors, perm


def _chain_to(end: Node) -> list[Node]:
    """The reshapes and transposes ending at ``end``, first first, each before ``end`` read by
    the next one alone."""
    chain = [end]
    while True:
        p = chain[0].operands[0].producer
        if p is None or p.op not in MOVES or p.results[0].num_uses != 1:
            return chain
        chain.insert(0, p)


def _move(graph: Graph, before: Node, op: str, x: Value, arg: tuple[int, ...], shape: tuple[int, ...],
          loc: Any) -> Value:
    """A reshape (``arg``: the shape) or transpose (``arg``: the perm) of ``x`` inserted before
    ``before``; its result."""
    key = "shape" if op == "reshape" else "perm"
    node = Node(op, [x], OPS[op].normalize_attrs({key: list(arg)}), [TensorType(shape, x.type.dtype)], loc)
    graph.insert_before(before, node)
    return node.results[0]


def fold_move_chain(graph: Graph, end: Node) -> bool:
    """``end`` the last of a chain of reshapes and transposes holding two transposes or more:
    the chain becomes reshape, one transpose, reshape (views where nothing moves); True if
    rewritten."""
    if end.op not in MOVES or end.graph is not graph:
        return False
    r = end.results[0]
    if r.num_uses == 1 and not r.is_output and next(iter(r.users)).op in MOVES:
        return False  # not the chain's end
    chain = _chain_to(end)
    if sum(n.op == "transpose" for n in chain) < 2:
        return False
    x = chain[0].operands[0]
    xs, ys = tuple(x.type.shape), tuple(end.results[0].type.shape)
    if not all(isinstance(d, int) for d in xs + ys):
        return False
    steps: list[tuple[str, tuple[int, ...]]] = [
        ("transpose", tuple(n.attrs["perm"])) if n.op == "transpose" else ("reshape", tuple(n.results[0].type.shape))
        for n in chain]
    found = chain_permutation(xs, steps)
    if found is None:
        return False
    factors, perm = found
    v = x
    if factors != xs:
        v = _move(graph, end, "reshape", v, factors, factors, end.loc)
    if perm != tuple(range(len(perm))):
        v = _move(graph, end, "transpose", v, perm, tuple(factors[p] for p in perm), end.loc)
    if tuple(v.type.shape) != ys:
        v = _move(graph, end, "reshape", v, ys, ys, end.loc)
    graph.replace_all_uses(end.results[0], v)
    for n in reversed(chain):
        erase_if_dead(graph, n)
    return True


def fold_move_chains(graph: Graph) -> int:
    """``fold_move_chain`` over ``graph``; the number of chains rewritten."""
    made = 0
    for node in list(graph.nodes):
        if node.graph is graph and fold_move_chain(graph, node):
            made += 1
    return made
