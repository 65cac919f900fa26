"""``ParallelProgram``, what ``parallelize`` returns: the placed global graph, the per-rank
program, the mesh and the plan, and the conversions of arrays between the global view and the
ranks' pieces (at the real sizes where a vocabulary is padded)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..autodiff.optim import initial_state
from ..ir.graph import Graph, Value, input_name
from ..ir.printer import print_graph
from ..ir.mesh import Mesh
from .pad import PadReport, cut_array, pad_array
from .partition import PartitionReport, local_piece, piece_index
from ..ir.placement import Placement
from .propagate import PropagationReport
from .report import PlanReport
from .strategies.base import ParsedStrategy, StrategyError


@dataclass(frozen=True)
class MicrobatchRepeat:
    """A pipeline stage's one-microbatch template runs ``times`` times a step, but for the
    values in ``once`` (made or reduced once per step); ``accumulated``: the param gradients
    the microbatches sum (reduced once, after the last). Propagation prices the reshards of
    the others ``times`` times."""

    times: int
    once: frozenset[Value]
    accumulated: frozenset[Value]


@dataclass(frozen=True)
class TrackedPartition:
    """What ``parallelize_spmd(..., track=True)`` made of each part of its input graph:
    ``spans`` and ``value_map`` as ``partition_tracked`` returns them (for the placed copy),
    ``node_origin``/``value_origin`` from the caller's nodes and values to the copy's, and the
    placed ``copy`` itself."""

    spans: Any
    value_map: dict[Value, Value]
    node_origin: dict[Any, Any]
    value_origin: dict[Value, Value]
    copy: Graph

    def local_values(self) -> dict[Value, Value]:
        """Each value of the caller's graph that the per-rank program holds -> its local value."""
        return {v: self.value_map[c] for v, c in self.value_origin.items() if c in self.value_map}



@dataclass
class ParallelProgram:
    """The result of ``parallelize``: the placed global graph, the per-rank program, the mesh
    and the plan. Arrays move between the two views with ``shard_*`` and ``assemble*``."""

    graph: Graph
    local: Graph
    mesh: Mesh
    strategy: ParsedStrategy
    plan: PlanReport
    propagation: PropagationReport
    partition: PartitionReport
    # The single-device graph that was parallelized (what ``--check`` runs), and what the
    # vocabulary padding padded (``graph`` holds padded params; the arrays that go in and
    # come out through the methods below have the real sizes).
    source: Graph | None = None
    padding: PadReport | None = None
    # With parallelize_spmd(..., track=True) (a pipeline stage's template): what each node and
    # value of the source became.
    tracked: TrackedPartition | None = None

    @property
    def single_device(self) -> Graph:
        """The graph the per-rank programs must agree with (``source``, else ``graph``)."""
        return self.source if self.source is not None else self.graph

    def _pads(self, name: str) -> dict[int, int]:
        return self.padding.inputs.get(name, {}) if self.padding is not None else {}

    def shard_weights(self, weights: Mapping[str, Any] | None = None) -> list[dict[str, np.ndarray]]:
        """Each rank's pieces of the params and optimizer state (default: the graph's own
        weights; missing optimizer state starts at zeros, as training_step's does)."""
        src = dict(self.graph.weights if weights is None else weights)
        out: list[dict[str, np.ndarray]] = [{} for _ in range(self.mesh.size)]
        for v in self.graph.inputs:
            if v.role not in ("param", "state"):
                continue
            name = input_name(v)
            if name not in src:
                if v.role == "state":
                    src[name] = initial_state(name, v.type, src)
                else:
                    raise StrategyError(f"no value for the param %{name} {v.type}; pass weights= with every param")
            arr = src[name]
            pads = self._pads(name)
            if pads and np.ndim(arr) == v.type.rank and all(np.shape(arr)[d] == n for d, n in pads.items()):
                arr = pad_array(arr, pads, v.type.shape)
            for r in range(self.mesh.size):
                out[r][name] = np.array(local_piece(arr, v.placement, self.mesh, r, f"weight %{name}"))
        return out

    def shard_inputs(self, inputs: Mapping[str, Any]) -> list[dict[str, np.ndarray]]:
        """Each rank's pieces of the data inputs (``input``-role, by name)."""
        out: list[dict[str, np.ndarray]] = [{} for _ in range(self.mesh.size)]
        for v in self.graph.inputs:
            if v.role != "input":
                continue
            name = input_name(v)
            if name not in inputs:
                raise StrategyError(f"no value for the input %{name} {v.type}")
            for r in range(self.mesh.size):
                out[r][name] = np.array(local_piece(inputs[name], v.placement, self.mesh, r, f"input %{name}"))
        return out

    def assemble_outputs(self, outputs_by_rank: Sequence[Sequence[Any]]) -> list[np.ndarray]:
        """The global outputs from every rank's pieces (the partition reduces pending sums)."""
        res = []
        for i, v in enumerate(self.graph.outputs):
            p = Placement(v.placement.dims, ()) if v.placement is not None else None
            full = assemble([np.asarray(o[i]) for o in outputs_by_rank], p, self.mesh, v.type.shape)
            pads = self.padding.outputs.get(i) if self.padding is not None else None
            res.append(cut_array(full, pads) if pads else full)
        return res

    def assemble_weights(self, weights_by_rank: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        """The global params and optimizer state from every rank's pieces."""
        out: dict[str, np.ndarray] = {}
        for v in self.graph.inputs:
            name = input_name(v)
            if v.role in ("param", "state") and all(name in w for w in weights_by_rank):
                full = assemble([np.asarray(w[name]) for w in weights_by_rank], v.placement, self.mesh,
                                v.type.shape)
                pads = self._pads(name)
                out[name] = cut_array(full, pads) if pads else full
        return out

    def simulate(self, inputs: Mapping[str, Any], weights: Mapping[str, Any] | None = None) -> list[np.ndarray]:
        """Run every rank's program in this process (NumPy reference, exact collectives) on
        the global ``inputs``; returns the assembled global outputs."""
        from .interpreter import run_mesh

        outs = run_mesh(self.local, self.mesh, self.shard_inputs(inputs), self.shard_weights(weights))
        return self.assemble_outputs(outs)

    def text(self) -> str:
        """The per-rank program's text form."""
        return print_graph(self.local)


def assemble(pieces: Sequence[np.ndarray], placement: Placement | None, mesh: Mesh,
             shape: Sequence[int]) -> np.ndarray:
    """The global array whose ``local_piece`` on each rank is ``pieces[rank]`` (the inverse
    of ``local_piece``; ranks that hold the same piece must agree, rank 0's copy wins)."""
    if placement is None or placement.is_replicated:
        return np.asarray(pieces[0])
    out = np.empty(tuple(shape), dtype=np.asarray(pieces[0]).dtype)
    for r in range(mesh.size):
        out[piece_index(shape, placement, mesh, r)] = pieces[r]
    return out


__all__ = ["ParallelProgram", "assemble"]
