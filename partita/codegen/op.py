"""The ``fused`` op: a group of elementwise ops run as one generated kernel.

Registered by this layer (partita/codegen), above the executors it needs: the reference runs
the body with the reference interpreter, the fallback with the torch executor.

    %3, %5 = fused(%x, %b) {body="graph @kernel(%x0: f32[4,256], %x1: f32[256]) -> ..."} : ...

The ``fuse-kernels`` pass (partita/codegen/fusion.py) makes these. ``body`` is the group as a
graph of its own, in the text form, with the node's operands as its inputs and the node's
results as its outputs; it is the meaning of the node:

- the reference interpreter runs the body with its own references, so every check that a pass
  keeps a graph's meaning covers fusion unchanged;
- the torch executor runs the kernel that ``partita.codegen`` generates for the body, compiled
  once when the program is prepared (``torch_prepare``) and cached on disk by content hash; a
  body the generator cannot take (a dtype without a kernel, a missing compiler) runs op by op
  on ATen instead, and ``partita.codegen.fallbacks()`` names it and why.

The body's text is canonical (inputs ``%x0...``, values numbered in order), so the same group
in every layer of a model is one kernel.
"""

from __future__ import annotations

from ..ir.diagnostics import TypeRuleError
from ..ir.types import TensorType
from ..ops.registry import AttrSpec, Cost, OPS, OpDef, register
from .aten_fallback import run_body_on_aten
from .fused_body import body_graph


def _infer(ts: list[TensorType], attrs: dict):
    try:
        body = body_graph(attrs["body"])
    except Exception as e:
        raise TypeRuleError(f"fused: the body does not parse: {e}") from None
    if len(ts) != len(body.inputs):
        raise TypeRuleError(f"fused: the body takes {len(body.inputs)} input(s), the node gives {len(ts)}")
    for i, (t, v) in enumerate(zip(ts, body.inputs)):
        if t != v.type:
            raise TypeRuleError(f"fused: operand {i} is {t}, the body's input %{v.name} is {v.type}")
    return [v.type for v in body.outputs]


def _reference(args, attrs):
    from ..backend.numpy_ref import run

    return run(body_graph(attrs["body"]), list(args))


def _prepare(node):
    from .kernels import prepare_fused

    return prepare_fused(node)


def _cost(ins, outs, attrs):
    body = body_graph(attrs["body"])
    flops = 0
    for n in body.nodes:
        c = OPS[n.op].cost_of([v.type for v in n.operands], [r.type for r in n.results], n.attrs)
        flops += c.flops
    return Cost(flops, sum(t.nbytes for t in ins), sum(t.nbytes for t in outs))


register(OpDef(
    name="fused", operands=("*inputs",), infer=_infer, reference=_reference, torch=run_body_on_aten,
    attrs=(AttrSpec("body", "str"),), cost=_cost, torch_prepare=_prepare,
    doc="a group of elementwise ops as one generated kernel; body is the group's graph in text form "
        "(made by the fuse-kernels pass; docs/codegen.md)",
))
