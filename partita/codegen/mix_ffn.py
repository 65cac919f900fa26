"""Activations moved across layout moves onto the convolution before them, so that fuse-library
takes them as the convolution's epilogue; run by fuse-library before its anchors.

PVT-v2's Mix-FFN (and SegFormer's, any model that runs a depthwise convolution on tokens) writes

    x [B, N, C] -> transpose -> reshape [B, C, H, W] -> conv2d (depthwise) -> reshape [B, C, N]
      -> transpose [B, N, C] -> gelu

The GELU is elementwise and the reshape and transpose only move elements, so
``gelu(transpose(reshape(conv(x))))`` is ``transpose(reshape(gelu(conv(x))))``. Written the second
way the GELU is the convolution's sole user, and ``_fuse_conv`` takes it into the generated
depthwise kernel's epilogue (``depthwise.ACTS``): one step and one pass over the result fewer.

- **Which activations**: the ``UNARY`` epilogues of ``codegen/epilogue.py`` (ReLU, GELU either
  form, SiLU, sigmoid, tanh), matched by op and attributes.
- **Which moves**: ``reshape``, ``transpose``, ``squeeze``, ``unsqueeze``: each result element is
  one input element, unchanged.
- **Which convolutions**: any but one whose windows tile its input (stride = kernel, no
  padding: a patch embedding), which fuse-library runs as a GEMM whose layout moves cancel
  against the model's; the activation stays after them there.
- **When**: the convolution's result and every move's result have exactly one reader (the next
  link) and are no graph output, so no other reader sees the activation's values.

The rewrite keeps the graph's meaning exactly; tests/codegen/test_mix_ffn.py checks it against
the reference interpreter and torch on odd shapes.
"""

from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ops import OPS
from ..passes.rewrite import sole_user
from .epilogue import UNARY

__all__ = ["MOVES", "ANCHOR_OPS", "is_unary_epilogue", "tiles_input", "hoist_unary_to_conv", "hoist_activations"]

# Ops that only move elements (each result element is one input element, unchanged).
MOVES = ("reshape", "transpose", "squeeze", "unsqueeze")
# The producers an activation is moved back onto (their fusion takes a unary epilogue).
ANCHOR_OPS = ("conv2d",)


def is_unary_epilogue(node: Node) -> bool:
    """Whether ``node`` is one of the ``UNARY`` activations (op and attributes)."""
    if len(node.operands) != 1 or len(node.results) != 1:
        return False
    for u in UNARY.values():
        if u is not None and u.op == node.op and all(node.attrs.get(k) == v for k, v in u.attrs.items()):
            return True
    return False


def tiles_input(node: Node) -> bool:
    """Whether conv2d ``node``'s windows tile its input (stride = kernel, no padding)."""
    w = node.operands[1].type
    return w.rank == 4 and tuple(node.attrs["stride"]) == tuple(w.shape[2:]) and \
        not any(p for p in node.attrs["padding"])


def hoist_unary_to_conv(graph: Graph, node: Node) -> bool:
    """``node`` an anchor (``ANCHOR_OPS``) whose result reaches a ``UNARY`` activation through
    sole-reader moves only: the activation moved to read the anchor's result, the moves read
    the activation's; True if rewritten."""
    if node.op not in ANCHOR_OPS or len(node.results) != 1 or tiles_input(node):
        return False
    y = node.results[0]
    moves: list[Node] = []
    cur = sole_user(y)
    while cur is not None and cur.op in MOVES and len(cur.results) == 1:
        moves.append(cur)
        cur = sole_user(cur.results[0])
    if not moves or cur is None or not is_unary_epilogue(cur) or cur.operands[0] is not moves[-1].results[0]:
        return False
    if cur.results[0].type.dtype is not y.type.dtype:
        return False
    act = Node(cur.op, [y], OPS[cur.op].normalize_attrs(dict(cur.attrs)), [y.type], cur.loc)
    graph.insert_before(moves[0], act)
    graph.set_operand(moves[0], 0, act.results[0])
    graph.replace_all_uses(cur.results[0], moves[-1].results[0])
    graph.erase(cur)
    return True


def hoist_activations(graph: Graph) -> int:
    """``hoist_unary_to_conv`` over every node of ``graph``; the number of rewrites made."""
    made = 0
    for node in list(graph.nodes):
        if node.graph is graph and hoist_unary_to_conv(graph, node):
            made += 1
    return made
