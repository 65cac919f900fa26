"""transformers' grouped-GEMM experts in a dynamo graph, rewritten to the static dispatch form.

Under ``torch.compile`` dynamo traces a transformers MoE layer (Mixtral, Qwen2-MoE, OLMoE)
with the experts implementation its config names, ``grouped_mm`` by default: the T*k
(token, expert) pairs sorted by expert, each pair's hidden row gathered, two grouped GEMMs over
run-time offsets (``histc`` and ``cumsum`` of the sorted expert ids) with the gate between them,
the rows weighted, put back in token order by the inverse permutation and summed over k.
Static shapes cannot hold a grouped GEMM, so partita's converter computes every expert on every
pair and keeps each pair's own (``fx._grouped_mm``): E times the pairs' work, plus the sort,
gathers, scatters and masks. The import path instead installs GShard's dispatch form
(``frontend.moe``) before it exports: a one-hot dispatch matmul, one batched matmul per
projection over [E, T, .], a combine matmul.

``dispatch_form(gm)`` finds that block in a dynamo graph, checking every link of it (the sort of
``topk``'s indices, the histogram over E bins, the gather by ``perm // k``, a gate between the two
GEMMs that works on the last axis only, the weighting by the sorted routing weights, the inverse
permutation and the sum over k), and replaces the block's result by the dispatch form computed
from the same hidden rows, routing indices and weights, expert weights and gate. The two compute
the same function up to the order of float additions (topk's indices within a row are distinct,
so each token meets an expert at most once). A block that differs in any link is left as it is.
The torch.compile backend runs it on the graph it hands AOTAutograd for partita's program; the
measured choice's ATen candidate stays dynamo's own graph.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch

from .moe import dispatch_tensors


def grouped_mm_targets() -> tuple[Any, ...]:
    """The callables a dynamo graph names for a grouped GEMM (those this torch and transformers have)."""
    found: list[Any] = []
    ops = getattr(torch.ops, "transformers", None)
    fallback = getattr(ops, "grouped_mm_fallback", None) if ops is not None else None
    if fallback is not None:
        found += [fallback, fallback.default]
    for owner, name in ((torch.nn.functional, "grouped_mm"), (torch, "_grouped_mm")):
        fn = getattr(owner, name, None)
        if fn is not None:
            found.append(fn)
    return tuple(found)


def dispatch_rows(hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor,
                  experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(each expert's rows [E, T, H], the combine tensor [1, T, E*T]) of the dispatch form with
    one group and no dropped token, for hidden [T, H] and topk's index and weights [T, k]."""
    t, h = hidden.shape
    dispatch, combine = dispatch_tensors(index, weights, experts, 1, None, hidden.dtype)
    rows = torch.matmul(dispatch.transpose(1, 2), hidden.reshape(1, t, h))
    return rows.reshape(experts, t, h), combine


def combine_rows(combine: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Each token's experts' outputs ([E, T, H]) summed with its routing weights: [T, H]."""
    e, c, h = out.shape
    return torch.matmul(combine, out.reshape(1, e * c, h)).reshape(c, h)


@dataclass
class ExpertsBlock:
    """The links of one grouped-GEMM experts block of a dynamo graph."""

    result: Any        # the sum over k: the block's [T, H] result
    hidden: Any        # the hidden rows [T, H]
    index: Any         # topk's indices [T, k]
    weights: Any       # the routing weights [T, k]
    first: Any         # the first grouped GEMM
    second: Any        # the second grouped GEMM
    gate: list[Any]    # the nodes between the two, in graph order
    experts: int
    dead: list[Any]    # the in-place nodes of the block (the inverse permutation's setitem)


def _is(node: Any, op: str, *targets: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == op and node.target in targets


def _method(node: Any, *names: str) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_method" and node.target in names


def _item(node: Any, source: Any, i: int) -> bool:
    return _is(node, "call_function", operator.getitem) and node.args[0] is source and node.args[1] == i


def _strip_casts(node: Any) -> Any:
    """The node under ``.to(dtype)`` / ``.float()`` calls."""
    while _method(node, "to", "float") and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def _flat(node: Any) -> Any:
    """The source of a ``reshape(-1)`` / ``view(-1)``, else None."""
    if _method(node, "reshape", "view") and tuple(node.args[1:]) in ((-1,), ((-1,),)):
        return node.args[0]
    return None


def _val(node: Any) -> Any:
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


def _offsets_bins(offs: Any, sort: Any) -> int | None:
    """E where ``offs`` is ``cumsum(histc(sorted ids, bins=E, min=0, max=E-1), 0)``."""
    if not _is(offs, "call_function", torch.cumsum):
        return None
    if offs.kwargs.get("dim", offs.args[1] if len(offs.args) > 1 else None) != 0:
        return None
    hist = offs.args[0]
    if not _is(hist, "call_function", torch.histc) or len(hist.args) != 1:
        return None
    bins, lo, hi = hist.kwargs.get("bins"), hist.kwargs.get("min"), hist.kwargs.get("max")
    if not isinstance(bins, int) or lo != 0 or hi != bins - 1:
        return None
    src = hist.args[0]
    while _method(src, "to", "float", "int"):
        src = src.args[0]
    return bins if _item(src, sort, 0) else None


def _gate_nodes(first: Any, second_in: Any) -> list[Any] | None:
    """The nodes from the first GEMM's result to the second's input, when they act on the last
    axis only (a chunk or split of it, activations, products, casts) and read nothing else."""
    order = {n: i for i, n in enumerate(first.graph.nodes)}
    inside, keep = {first}, []
    for n in first.graph.nodes:
        if not order[first] < order[n] <= order[second_in]:
            continue
        if not n.all_input_nodes or not all(a in inside for a in n.all_input_nodes):
            continue
        if not _last_axis_op(n):
            return None
        inside.add(n)
        keep.append(n)
    for n in [first, *keep]:
        if n is not second_in and any(u not in inside for u in n.users):
            return None
    return keep if second_in in inside and len(second_in.users) == 1 else None


def _last_axis_op(n: Any) -> bool:
    """A node that works row by row on the last axis."""
    if n.op == "call_function" and n.target is operator.getitem:
        return isinstance(n.args[1], int) and _method(n.args[0], "chunk", "split")
    if n.op == "call_method" and n.target in ("chunk", "split"):
        dim = n.kwargs.get("dim", n.args[2] if len(n.args) > 2 else 0)
        return dim == -1
    if n.op == "call_method" and n.target in ("to", "float", "contiguous"):
        return True
    rowwise = {operator.mul, operator.add, torch.mul, torch.nn.functional.silu, torch.nn.functional.gelu,
               torch.nn.functional.relu, torch.sigmoid, torch.tanh}
    if n.op == "call_function" and n.target in rowwise:
        return all(not isinstance(a, torch.fx.Node) or (_val(a) is not None and _val(a).dim() == 2) for a in n.args)
    return False


def _inverse_order(result: Any, perm: Any, k: int) -> tuple[Any, list[Any]] | None:
    """(the weighted rows, the setitem) where ``result`` is the sum over k of those rows put back
    in token order: ``x[inv].view(T, k, H).sum(1)`` with ``inv[perm] = arange(T*k)``."""
    if not _method(result, "sum") or result.kwargs.get("dim", result.args[1] if len(result.args) > 1 else None) != 1:
        return None
    if result.kwargs.get("keepdim", False):
        return None
    view = result.args[0]
    if not _method(view, "view", "reshape") or len(view.args) != 4 or view.args[2] != k:
        return None
    take = view.args[0]
    if not _is(take, "call_function", operator.getitem):
        return None
    inv = take.args[1]
    if not _is(inv, "call_function", torch.empty_like) or inv.args[0] is not perm:
        return None
    sets = [u for u in inv.users if _is(u, "call_function", operator.setitem)]
    if len(sets) != 1 or len(inv.users) != 2 or sets[0].args[0] is not inv or sets[0].args[1] is not perm:
        return None
    arange = sets[0].args[2]
    n = _val(perm).shape[0] if _val(perm) is not None else None
    if not _is(arange, "call_function", torch.arange) or tuple(arange.args) != (n,):
        return None
    return take.args[0], [sets[0]]


@dataclass
class Routing:
    """The routing links of a block: its second GEMM, the weighted rows, the sort and its
    permutation, topk's indices and weights, and k."""

    second: Any
    weighted: Any
    sort: Any
    perm: Any
    ids: Any
    weights: Any
    k: int


def _routing(result: Any, targets: tuple[Any, ...]) -> Routing | None:
    """``result`` = sum(view(weighted[inv])), weighted = second GEMM * sorted weights, the
    sort's keys topk's indices flattened; else None."""
    if not (_method(result, "sum") and _method(result.args[0], "view", "reshape")
            and _is(result.args[0].args[0], "call_function", operator.getitem)):
        return None
    weighted = result.args[0].args[0].args[0]
    if not _is(weighted, "call_function", operator.mul, torch.mul):
        return None
    second, scale = weighted.args
    if not _is(second, "call_function", *targets):
        second, scale = scale, second
    if not _is(second, "call_function", *targets) or not _method(scale, "unsqueeze") or scale.args[1:] != (-1,):
        return None
    sorted_w = scale.args[0]
    if not _is(sorted_w, "call_function", operator.getitem):
        return None
    flat_w, perm = sorted_w.args
    if not (_is(perm, "call_function", operator.getitem) and perm.args[1] == 1):
        return None
    sort = perm.args[0]
    if not _is(sort, "call_function", torch.sort) or len(sort.args) != 1 or sort.kwargs:
        return None
    ids = _flat(sort.args[0])
    if not (_is(ids, "call_function", operator.getitem) and ids.args[1] == 1):
        return None
    topk = ids.args[0]
    if not _is(topk, "call_function", torch.topk) or topk.kwargs.get("dim", -1) not in (-1, 1):
        return None
    weights, iv = _flat(flat_w), _val(ids)
    if weights is None or iv is None or iv.dim() != 2 or _val(weights) is None \
            or tuple(_val(weights).shape) != tuple(iv.shape):
        return None
    return Routing(second, weighted, sort, perm, ids, weights, int(iv.shape[1]))


def match_block(result: Any) -> ExpertsBlock | None:
    """The experts block whose result is ``result`` (a sum over k), every link checked; else None."""
    targets = grouped_mm_targets()
    head = _val(result)
    r = _routing(result, targets) if head is not None and head.dim() == 2 else None
    if r is None:
        return None
    found = _inverse_order(result, r.perm, r.k)
    if found is None or found[0] is not r.weighted:
        return None
    second, first_in = r.second, r.second.args[0]
    first, gate = _strip_casts(first_in), []
    if not _is(first, "call_function", *targets):
        first = _first_gemm(first_in, targets)
        gate_nodes = _gate_nodes(first, first_in) if first is not None else None
        if gate_nodes is None:
            return None
        gate = gate_nodes
    offs = second.kwargs.get("offs")
    if first.kwargs.get("offs") is not offs or len(first.args) != 2 or len(second.args) != 2:
        return None
    experts = _offsets_bins(offs, r.sort)
    take = _strip_casts(first.args[0])
    if experts is None or not _is(take, "call_function", operator.getitem):
        return None
    hidden, rows = take.args
    if not _is(rows, "call_function", operator.floordiv) or tuple(rows.args) != (r.perm, r.k):
        return None
    hv, wv, dv = _val(hidden), _val(first.args[1]), _val(second.args[1])
    if hv is None or wv is None or dv is None or hv.dim() != 2 or wv.dim() != 3 or dv.dim() != 3:
        return None
    if wv.shape[0] != experts or dv.shape[0] != experts or hv.dtype != wv.dtype:
        return None
    if _val(r.ids).shape[0] != hv.shape[0] or tuple(head.shape) != tuple(hv.shape):
        return None
    return ExpertsBlock(result, hidden, r.ids, r.weights, first, second, gate, experts, found[1])


def _first_gemm(node: Any, targets: tuple[Any, ...]) -> Any:
    """The grouped GEMM that the gate nodes ending at ``node`` start from (the one ancestor)."""
    seen, todo = set(), [node]
    found = []
    while todo:
        n = todo.pop()
        if n in seen or not isinstance(n, torch.fx.Node):
            continue
        seen.add(n)
        if _is(n, "call_function", *targets):
            found.append(n)
            continue
        todo += list(n.all_input_nodes)
    return found[0] if len(found) == 1 else None


def rewrite_block(gm: Any, block: ExpertsBlock) -> None:
    """Replace ``block``'s result in ``gm`` by the dispatch form of the same layer."""
    graph = gm.graph
    meta = dict(block.result.meta)
    with graph.inserting_before(block.result):
        made = graph.call_function(dispatch_rows, (block.hidden, block.index, block.weights, block.experts))
        rows = graph.call_function(operator.getitem, (made, 0))
        combine = graph.call_function(operator.getitem, (made, 1))
        up = graph.call_function(torch.matmul, (rows, block.first.args[1]))
        env: dict[Any, Any] = {block.first: up}
        for n in block.gate:
            env[n] = graph.node_copy(n, lambda a: env.get(a, a))
        inner = env.get(block.second.args[0], up)
        down = graph.call_function(torch.matmul, (inner, block.second.args[1]))
        out = graph.call_function(combine_rows, (combine, down))
    for n in (made, rows, combine, up, down, out):
        n.meta.update({k: v for k, v in meta.items() if k in ("stack_trace", "nn_module_stack", "source_fn_stack")})
    old = block.result
    old.replace_all_uses_with(out)
    for n in block.dead:
        graph.erase_node(n)
    erase_unused(old)


def erase_unused(node: Any) -> None:
    """Erase ``node`` if nothing uses it, then each of its inputs that nothing uses any more
    (the replaced block; placeholders stay)."""
    graph, todo, erased = node.graph, [node], set()
    while todo:
        n = todo.pop()
        if n in erased or n.users or n.op in ("placeholder", "output"):
            continue
        inputs = list(n.all_input_nodes)
        graph.erase_node(n)
        erased.add(n)
        todo += inputs


def dispatch_form(gm: Any) -> tuple[Any, int]:
    """(``gm`` or a copy of it with every grouped-GEMM experts block in the dispatch form, how many
    blocks were rewritten); ``gm`` itself is left unchanged."""
    if not grouped_mm_targets():
        return gm, 0
    candidates = [n for n in gm.graph.nodes if _method(n, "sum")]
    if not any(_is(n, "call_function", *grouped_mm_targets()) for n in gm.graph.nodes):
        return gm, 0
    copy = torch.fx.GraphModule(gm, _copied_graph(gm))
    copy.meta = dict(getattr(gm, "meta", {}))
    for key, value in vars(gm).items():   # what dynamo set on its module (AOTAutograd reads the params' sources)
        if key not in vars(copy):
            setattr(copy, key, value)
    names = {n.name for n in candidates}
    blocks = [b for b in (match_block(n) for n in copy.graph.nodes if n.name in names) if b is not None]
    for block in blocks:
        rewrite_block(copy, block)
    if not blocks:
        return gm, 0
    copy.graph.lint()
    copy.recompile()
    return copy, len(blocks)


def _copied_graph(gm: Any) -> Any:
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    for a, b in zip(gm.graph.nodes, graph.nodes):   # dynamo marks each placeholder with its source
        if a.op == "placeholder" and hasattr(a, "_dynamo_source"):
            setattr(b, "_dynamo_source", getattr(a, "_dynamo_source"))
    return graph

