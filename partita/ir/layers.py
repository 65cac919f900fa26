"""Which layer of a model a node belongs to, read from the IR alone.

A layer is a module path ending in a number (``transformer.h.3``, ``model.layers.7``): the
prefix of a node's source scope (``Location.scope``, which the torch frontend records) up to
its first numeric component, or for a node without a scope, of the params it reads
(``transformer.h.3.mlp.c_fc.weight``). The pipeline stage cut cuts between these layers and
activation recomputation recomputes by them, so both read them here.
"""

from __future__ import annotations

import re

from .graph import Node

_LAYER = re.compile(r"^(.*?(?:^|\.)\d+)(?:\.|$)")


def layer_of_path(path: str) -> str | None:
    """The layer a module path or parameter name belongs to: its prefix up to the first
    numeric component (``lm.transformer.h.3.attn.c_attn`` -> ``lm.transformer.h.3``)."""
    m = _LAYER.match(path)
    return m.group(1) if m else None


def node_layer(node: Node) -> str | None:
    """The layer ``node`` belongs to: from its source scope, else from the params it reads;
    ``""`` for a known scope outside every layer, None when nothing tells."""
    loc = node.loc
    if loc is not None and loc.scope:
        lay = layer_of_path(loc.scope)
        if lay is not None:
            return lay
        return ""  # a known scope outside every layer (embeddings, head)
    for v in node.operands:
        if v.producer is None and v.role == "param" and v.name:
            lay = layer_of_path(v.name)
            if lay is not None:
                return lay
    return None


__all__ = ["layer_of_path", "node_layer"]
