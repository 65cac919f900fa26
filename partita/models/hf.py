"""Filling a weightless model graph from a Hugging Face state_dict."""

from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

from ..ir.diagnostics import PartitaError
from ..ir.graph import Graph

_SPLIT = re.compile(r"^(.*)\.split(\d+)$")


def is_weightless(graph: Graph) -> bool:
    """Whether no param of ``graph`` has an array in its weights (a graph of shapes only)."""
    return not any(v.role == "param" and v.name in graph.weights for v in graph.inputs)


def _numpy(t: Any) -> np.ndarray:
    if hasattr(t, "detach"):
        t = t.detach().float().cpu().numpy() if str(t.dtype) == "torch.bfloat16" else t.detach().cpu().numpy()
    return np.asarray(t)


def load_hf_state_dict(graph: Graph, state_dict: Mapping[str, Any]) -> Graph:
    """Put the arrays of ``state_dict`` (torch tensors or arrays) into ``graph.weights`` for
    every param, by name; a param ``<name>.split<j>`` of a graph with ``n`` such pieces takes
    the j-th of n equal pieces of ``<name>`` along its last axis (GPT-2's fused ``c_attn``).
    Arrays are cast to the params' dtypes. In place; returns the graph."""
    params = [v for v in graph.inputs if v.role == "param"]
    pieces: dict[str, int] = {}
    for v in params:
        m = _SPLIT.match(str(v.name))
        if m and str(v.name) not in state_dict:
            pieces[m.group(1)] = pieces.get(m.group(1), 0) + 1
    missing = []
    for v in params:
        name = str(v.name)
        m = _SPLIT.match(name)
        if name in state_dict:
            a = _numpy(state_dict[name])
        elif m and m.group(1) in state_dict:
            whole = _numpy(state_dict[m.group(1)])
            a = np.split(whole, pieces[m.group(1)], axis=-1)[int(m.group(2))]
        else:
            missing.append(name)
            continue
        if tuple(a.shape) != tuple(v.type.shape):
            raise PartitaError(f"load_hf_state_dict: %{name} is {v.type}, the state_dict's array is {a.shape}")
        graph.weights[name] = np.ascontiguousarray(a.astype(v.type.dtype.np))
    if missing:
        raise PartitaError(f"load_hf_state_dict: no array for {len(missing)} param(s): "
                           f"{', '.join('%' + n for n in missing[:5])}{' ...' if len(missing) > 5 else ''}")
    return graph
