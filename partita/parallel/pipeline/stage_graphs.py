"""The per-chunk programs a pipeline unrolls: one chunk's forward, and its backward as the
``grad`` machinery derives it (``partita.autodiff.grad.backward``), split into the part that
computes the gradients of the chunk's inputs (``B``, on the critical path: the chunk before
waits for it) and the part that computes only parameter gradients (``W``, which a
zero-bubble schedule runs later).

A ``ChunkProgram`` is one graph with microbatch shapes::

    chunk(received values, batch inputs, params, cotangents of sent values)
        -> (sent values, loss share?, gradients of received values, gradients of params)

and three lists of its nodes: F (computes the sent values and the loss share), B (the
received values' gradients) and W (the rest of the param gradients). Running F, then B,
then W on one microbatch is that microbatch's forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...autodiff.grad import AutodiffError, backward
from ...autodiff.recompute import apply_recompute, recomputed_nodes
from ...ir.builder import Builder
from ...ir.graph import Graph, Node, Value
from ...ir.verifier import verify
from .schedule import PipelineError
from .stages import Chunk, value_cone


@dataclass
class ChunkProgram:
    """One chunk's forward and backward, with microbatch shapes (see the module docstring).

    ``recv``/``send``: the template's values for what arrives and what leaves (in travel
    order); ``batch``/``params``: its inputs standing for the batch inputs and params (same
    names as the forward graph's); ``cotangents``: per sent value, the input its gradient
    arrives in (None for a non-float value); ``loss``: the loss share (last chunk only);
    ``recv_grads``: per received value, its gradient (None for a non-float one);
    ``param_grads``: param name -> gradient. ``F``, ``B``, ``W``: the nodes of each part, in
    order."""

    index: int
    graph: Graph
    recv: list[Value]
    send: list[Value]
    batch: dict[str, Value]
    params: dict[str, Value]
    cotangents: list[Value | None]
    loss: Value | None
    recv_grads: list[Value | None]
    param_grads: dict[str, Value]
    F: list[Node] = field(default_factory=list)
    B: list[Node] = field(default_factory=list)
    W: list[Node] = field(default_factory=list)
    forward_only: bool = False
    final: list[Value] = field(default_factory=list)  # a forward-only pipeline's outputs (last chunk)

    @property
    def splittable(self) -> bool:
        """Whether some param gradient work can run apart from the input gradients."""
        return bool(self.W)


def build_chunk_program(chunk: Chunk, last: bool, loss: Value | None, *, forward_only: bool = False,
                        outputs: list[Value] | None = None, recompute: str = "none") -> ChunkProgram:
    """The ChunkProgram of ``chunk``; ``loss`` (the forward graph's loss share, last chunk
    only) seeds its backward with 1. ``outputs``: for a forward-only pipeline, the forward
    graph's outputs the last chunk returns. ``recompute``: the activation recomputation
    policy applied to the chunk's backward (``partita.autodiff.recompute.apply_recompute``)."""
    g = Graph(f"chunk{chunk.index}")
    b = Builder(g)
    vmap: dict[Value, Value] = {}
    recv = []
    for i, v in enumerate(chunk.recv):
        vmap[v] = g.add_input(f"pp.recv{i}", v.type, "input")
        recv.append(vmap[v])
    batch: dict[str, Value] = {}
    params: dict[str, Value] = {}
    for v in chunk.batch:
        vmap[v] = batch[str(v.name)] = g.add_input(str(v.name), v.type, "input")
    for v in chunk.params:
        vmap[v] = params[str(v.name)] = g.add_input(str(v.name), v.type, v.role or "param")
    for n in chunk.nodes:
        node = b.emit_node(n.op, [vmap[o] for o in n.operands], dict(n.attrs), loc=n.loc)
        for a, r in zip(n.results, node.results):
            vmap[a] = r
    send = [vmap[v] for v in chunk.send]
    loss_v = vmap[loss] if (last and loss is not None) else None
    final = [vmap[v] for v in outputs] if (last and outputs) else []
    cotangents: list[Value | None] = []
    recv_grads: list[Value | None] = [None] * len(recv)
    param_grads: dict[str, Value] = {}
    if not forward_only:
        seeds: dict[Value, Value] = {}
        for i, v in enumerate(send):
            if v.type.dtype.is_float:
                ct = g.add_input(f"pp.ct{i}", v.type, "input")
                cotangents.append(ct)
                # A value sent on and also used here gets its cotangent plus what flows back.
                seeds[v] = ct if v not in seeds else b.add(seeds[v], ct)
            else:
                cotangents.append(None)
        if loss_v is not None:
            one = b.full(shape=(), value=1.0, dtype=loss_v.type.dtype, name="grad.seed")
            seeds[loss_v] = one if loss_v not in seeds else b.add(seeds[loss_v], one)
        wrt = [v for v in recv if v.type.dtype.is_float] + [p for p in params.values() if p.type.dtype.is_float]
        try:
            grads = backward(g, seeds, wrt) if seeds else {}
        except AutodiffError as e:
            raise PipelineError(f"pipeline chunk {chunk.index}: {e}") from None
        for i, v in enumerate(recv):
            gv = grads.get(v)
            if v.type.dtype.is_float:
                recv_grads[i] = gv if gv is not None else b.full(shape=v.type.shape, value=0.0, dtype=v.type.dtype)
        for name, p in params.items():
            if not p.type.dtype.is_float:
                continue
            gv = grads.get(p)
            param_grads[name] = gv if gv is not None else b.full(shape=p.type.shape, value=0.0, dtype=p.type.dtype)
    outs = send + ([loss_v] if loss_v is not None else []) + final
    outs += [x for x in recv_grads if x is not None] + list(param_grads.values())
    # A value may be listed twice (a sent value that is also an output); set_outputs takes that.
    g.set_outputs(outs)
    from ...passes.manager import PassManager

    PassManager.parse("canonicalize,cse,dce", verify_each=False).run(g)
    verify(g)
    # The cleanup may have replaced output values: read them back in the same order.
    o = list(g.outputs)
    k = 0
    send = o[k:k + len(send)]
    k += len(send)
    if loss_v is not None:
        loss_v = o[k]
        k += 1
    final = o[k:k + len(final)]
    k += len(final)
    new_rg: list[Value | None] = []
    for x in recv_grads:
        if x is None:
            new_rg.append(None)
        else:
            new_rg.append(o[k])
            k += 1
    names = list(param_grads)
    param_grads = {nm: o[k + i] for i, nm in enumerate(names)}
    f_set = value_cone(send + ([loss_v] if loss_v is not None else []) + final)
    recomputed: set[Node] = set()
    if not forward_only and recompute != "none":
        # After the cleanup, on the backward as the chunk runs it: everything outside F.
        apply_recompute(g, recompute, {n for n in g.nodes if n not in f_set})
        verify(g)
        recomputed = recomputed_nodes(g)
    # A recomputed node is part of B (before the first B node that reads it) even where only
    # weight gradients read it: W runs after B in every schedule, so it finds the values there.
    # Whatever a recomputed node reads (outside F) is B's too.
    b_set = value_cone([x for x in new_rg if x is not None] + [r for n in recomputed for r in n.results]) - f_set
    w_set = value_cone(list(param_grads.values())) - f_set - b_set
    order = list(g.nodes)
    cp = ChunkProgram(chunk.index, g, [g.input(f"pp.recv{i}") for i in range(len(recv))], send,
                      {nm: g.input(nm) for nm in batch}, {nm: g.input(nm) for nm in params},
                      [None if c is None else g.input(str(c.name)) for c in cotangents] if not forward_only else [],
                      loss_v, new_rg, param_grads,
                      [n for n in order if n in f_set], [n for n in order if n in b_set],
                      [n for n in order if n in w_set], forward_only, final)
    return cp


__all__ = ["ChunkProgram", "build_chunk_program"]
