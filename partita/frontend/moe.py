"""Mixture-of-experts layers in a form with static shapes: GShard's dispatch and combine.

A token-choice MoE layer sends each token to its top-k experts. Eager code does it with
data-dependent shapes (``nonzero`` per expert, or a sort and a grouped GEMM over run-time
offsets), which a graph of static shapes cannot hold, and which no parallel rewrite can
split by experts. GShard (Lepikhin et al. 2020) writes the same layer with static shapes:

- the T tokens are cut into G groups of s = T / G tokens;
- within each group, each expert takes at most C tokens (its capacity), in token order:
  ``dispatch[g, t, e, c] = 1`` when token t of group g is the c-th token of group g routed
  to expert e;
- ``x_e = einsum("gtec,gth->egch", dispatch, x)``: every expert's tokens, [E, G*C, H];
- each expert's FFN is one batched matmul over E;
- ``out = einsum("gtec,egch->gth", dispatch * gate, y_e)``: each token's expert outputs,
  weighted by its routing weights.

With C = s (the default, ``capacity_factor=None``) no token is ever dropped, and the layer
computes exactly what the eager layer computes (up to the order of float additions). A
``capacity_factor`` f gives C = ceil(f * s * k / E), GShard's capacity: tokens past an
expert's capacity in their group are dropped by that expert (their output from it is zero),
which changes the result as it does in GShard and DeepSpeed-MoE.

Split over the expert-parallel axis (``ep``), the groups go to the ranks that hold their
tokens and the experts to the ranks that hold their weights; between the two the dispatched
tensor changes from split by group to split by expert, and back after the FFN: the two
all_to_all of GShard (partita/parallel/strategies/ep.py).

For transformers models, ``static_experts(module, groups, capacity_factor)`` installs this
form as the experts implementation of every MoE layer (the ``_experts_implementation`` of
each config; transformers' ``ExpertsInterface``) for the duration of an export.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator

import torch

from . import FrontendError

IMPLEMENTATION = "partita_dispatch"


def capacity(tokens_per_group: int, k: int, experts: int, capacity_factor: float | None) -> int:
    """Tokens each expert takes per group: all of them without a factor (no token dropped),
    else GShard's ``ceil(factor * s * k / E)``, at most s."""
    if capacity_factor is None:
        return tokens_per_group
    if not capacity_factor > 0:
        raise FrontendError(f"moe: capacity_factor must be > 0 (or None for no dropped tokens), got {capacity_factor}")
    return max(1, min(tokens_per_group, math.ceil(capacity_factor * tokens_per_group * k / experts)))


def dispatch_tensors(top_k_index: torch.Tensor, top_k_weights: torch.Tensor, experts: int, groups: int,
                     capacity_factor: float | None, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(dispatch, combine), both [G, s, E*C]: where each token goes, and the same weighted by
    its routing weight. ``top_k_index`` and ``top_k_weights`` are [T, k]."""
    t, k = top_k_index.shape
    if t % groups:
        raise FrontendError(f"moe: {t} tokens do not split into {groups} groups; choose moe_groups dividing the "
                            f"number of tokens (batch x sequence = {t})")
    s = t // groups
    c = capacity(s, k, experts, capacity_factor)
    # One-hot written with a comparison, which every frontend path converts.
    chosen = (top_k_index.unsqueeze(-1) == torch.arange(experts, device=top_k_index.device)).to(dtype)  # [T,k,E]
    mask = chosen.sum(dim=1)                                                  # [T, E], 0 or 1
    gate = (chosen * top_k_weights.unsqueeze(-1).to(dtype)).sum(dim=1)        # [T, E]
    mask = mask.reshape(groups, s, experts)
    # The slot of each token in its expert's buffer: how many earlier tokens of its group
    # chose that expert.
    slot = torch.cumsum(mask, dim=1) - mask                                   # [G, s, E]
    slots = torch.arange(c, device=top_k_index.device).to(dtype)
    dispatch = mask.unsqueeze(-1) * (slot.unsqueeze(-1) == slots).to(dtype)   # [G, s, E, C]
    combine = dispatch * gate.reshape(groups, s, experts, 1)
    return dispatch.reshape(groups, s, experts * c), combine.reshape(groups, s, experts * c)


def dispatch_experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                             top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts forward of transformers' ``use_experts_implementation`` classes, in the
    GShard form (see the module docstring). ``self`` is the experts module."""
    groups = getattr(self, "_partita_groups", 1)
    factor = getattr(self, "_partita_capacity_factor", None)
    if getattr(self, "has_bias", False) or getattr(self, "has_post_expert_norm", False) or not getattr(self, "has_gate", True):
        raise FrontendError(f"moe: {type(self).__name__} has biases, a post-expert norm or no gate; the static "
                            "dispatch form covers gated experts without biases (Mixtral, Qwen-MoE, OLMoE)")
    t, h = hidden_states.shape
    e = self.num_experts
    dispatch, combine = dispatch_tensors(top_k_index, top_k_weights, e, groups, factor, hidden_states.dtype)
    c = dispatch.shape[-1] // e
    xg = hidden_states.reshape(groups, t // groups, h)
    # [G, E*C, H] -> [E, G*C, H]: the tokens of every group, gathered per expert.
    xe = torch.matmul(dispatch.transpose(1, 2), xg).reshape(groups, e, c, h).transpose(0, 1).reshape(e, groups * c, h)
    up = self.gate_up_proj if self.is_transposed else self.gate_up_proj.transpose(1, 2)    # [E, H, 2F]
    y = self._apply_gate(torch.bmm(xe, up))                                                 # [E, G*C, F]
    down = self.down_proj if self.is_transposed else self.down_proj.transpose(1, 2)          # [E, F, H]
    y = torch.bmm(y, down)                                                                   # [E, G*C, H]
    y = y.reshape(e, groups, c, h).transpose(0, 1).reshape(groups, e * c, h)
    return torch.matmul(combine, y).reshape(t, h).to(hidden_states.dtype)


def _experts_modules(module: Any) -> list[Any]:
    return [m for m in module.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "down_proj")
            and hasattr(m, "num_experts") and hasattr(m, "_apply_gate") and hasattr(m, "config")]


@contextlib.contextmanager
def static_experts(module: Any, groups: int = 1, capacity_factor: float | None = None) -> Iterator[int]:
    """Run every transformers MoE experts layer of ``module`` in the dispatch form while the
    block runs (an export); yields how many layers it switched. A model without such layers
    is left as it is."""
    experts = _experts_modules(module)
    if not experts:
        yield 0
        return
    if not isinstance(groups, int) or groups < 1:
        raise FrontendError(f"moe_groups must be a positive integer, got {groups!r}")
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION, dispatch_experts_forward)
    saved = []
    for m in experts:
        cfg = m.config
        saved.append((m, cfg, getattr(cfg, "_experts_implementation", None)))
        cfg._experts_implementation = IMPLEMENTATION
        m._partita_groups, m._partita_capacity_factor = groups, capacity_factor
    try:
        yield len(experts)
    finally:
        for m, cfg, impl in reversed(saved):  # a config shared by several layers ends as it began
            cfg._experts_implementation = impl
            del m._partita_groups, m._partita_capacity_factor
