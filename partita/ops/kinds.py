"""What kind of work each op is: the groups that the cost model, the memory report, the
strategies and the passes read, in one table beside the op records (each name is checked to
be a registered op, tests/ops/test_kinds.py). An op in no group is memory-bound or
compute-bound by its record's ``cost`` rule.

- ``GEMM_OPS``: matrix products and convolutions (priced at the device's GEMM rate);
- ``ATTENTION_OPS``: fused attention, forward and backward;
- ``VIEW_OPS``: the result is the operand's storage under another shape in any layout: no
  kernel runs, nothing moves;
- ``STRIDED_VIEW_OPS``: a view where strides may be permuted (generated code, the fused
  buffers of collectives), a copy for the cost model, which prices contiguous tensors;
- ``COLLECTIVE_OPS``: communication over a mesh axis; ``P2P_OPS``: point-to-point transfers;
- ``FREE_OPS``: run no kernel and move nothing (the rank's position, a constant in place);
- ``UPDATE_OPS``: optimizer updates, which read a param, its gradient and state.
"""

from __future__ import annotations

GEMM_OPS = frozenset({"matmul", "matmul_integer", "linear_pointwise", "conv2d", "conv3d", "conv_transpose2d",
                      "conv_transpose3d", "conv2d_pointwise", "conv2d_grad"})
ATTENTION_OPS = frozenset({"attention", "attention_grad", "rotary_attention"})
VIEW_OPS = frozenset({"reshape", "squeeze", "unsqueeze"})
STRIDED_VIEW_OPS = frozenset({"transpose"})
COLLECTIVE_OPS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                            "ring_shift"})
P2P_OPS = frozenset({"send", "recv"})
FREE_OPS = frozenset({"axis_index", "constant"})
UPDATE_OPS = frozenset({"adamw_update", "sgd_update"})

GROUPS = {"gemm": GEMM_OPS, "attention": ATTENTION_OPS, "view": VIEW_OPS, "strided_view": STRIDED_VIEW_OPS,
          "collective": COLLECTIVE_OPS, "p2p": P2P_OPS, "free": FREE_OPS, "update": UPDATE_OPS}


def kind_of(op: str) -> str:
    """The group ``op`` is in (a key of GROUPS), or ``""`` for the others."""
    for name, ops in GROUPS.items():
        if op in ops:
            return name
    return ""


__all__ = ["ATTENTION_OPS", "COLLECTIVE_OPS", "FREE_OPS", "GEMM_OPS", "GROUPS", "P2P_OPS", "STRIDED_VIEW_OPS",
           "UPDATE_OPS", "VIEW_OPS", "kind_of"]
