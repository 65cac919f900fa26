"""Megatron's vocabulary: padding a vocabulary the tensor axis does not divide, and the
vocab-parallel embedding (token tables split by rows). ``partita.parallel.pad`` does the
rewrite; these functions choose what it pads and place the tables."""

from __future__ import annotations

from ...ir.graph import Value
from ...ir.placement import Placement
from .base import AnnotationContext


def pad_vocabulary(ctx: AnnotationContext, axis: str) -> None:
    """Pad each token table whose rows ``axis`` does not divide (and everything that shares
    its index: a tied or untied LM head, the logits, the optimizer state) to the next
    multiple of the axis size, as Megatron-LM pads its vocabulary; see
    ``partita.parallel.pad``."""
    from ..pad import pad_dims

    n = ctx.mesh.axis_size(axis)
    seeds = [(t, 0) for t in token_tables(ctx) if t.type.shape[0] % n]
    if not seeds:
        return
    sizes = {t.type.shape[0] for t, _ in seeds}
    for node in ctx.graph.nodes:
        if node.op == "cross_entropy":
            logits = node.operands[0]
            cdim = 1 if logits.type.rank >= 2 else 0
            if logits.type.shape[cdim] in sizes:  # an untied LM head over the same vocabulary
                seeds.append((logits, cdim))
    rep = pad_dims(ctx.graph, seeds, n)
    if not rep:
        return
    # The graph's own weights keep their real sizes: shard_weights pads what it cuts.
    ctx.padding = rep
    ctx.refresh_names()
    for name, dims in rep.inputs.items():
        for d, real in dims.items():
            ctx.notes.append(f"%{name} padded from {real} to {rep.padded} along dim {d} so that '{axis}' "
                             f"(size {n}) splits it; the extra entries hold zeros")
    for why in dict.fromkeys(rep.cut):
        ctx.notes.append(f"the padded vocabulary is cut back to {rep.size} before {why}")


def token_tables(ctx: AnnotationContext) -> list[Value]:
    """The embedding tables megatron may split by rows: params not yet placed whose lookups
    read the data (token ids; not position tables indexed by an iota), in program order,
    each once."""
    out: dict[Value, None] = {}
    for node in ctx.graph.nodes:
        if node.op != "embedding":
            continue
        table = node.operands[0]
        if table.is_input and table.role == "param" and table not in ctx.fixed and _reads_data(node.operands[1]):
            out[table] = None
    return list(out)


def vocab_parallel(ctx: AnnotationContext, axis: str) -> None:
    """Split each token embedding table param by rows over ``axis`` (Megatron's vocab-parallel
    embedding; a tied LM head follows it through propagation). A table whose indices do not
    come from the data (positions from an iota) stays whole, as in Megatron: it is small, and
    its lookup would only add a partial sum to reduce."""
    n = ctx.mesh.axis_size(axis)
    for table in token_tables(ctx):
        if table.type.shape[0] % n:
            ctx.notes.append(f"%{ctx.name(table)} kept whole over '{axis}': its {table.type.shape[0]} rows "
                             f"do not split into {n} (pad the vocabulary to a multiple of {n})")
            continue
        ctx.place(table, Placement.split(2, {0: axis}))
        ctx.notes.append(f"%{ctx.name(table)} is vocab-parallel over '{axis}' (split by rows)")


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
