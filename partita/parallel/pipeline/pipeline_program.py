"""``PipelineProgram``: what ``parallelize`` returns for a strategy with ``pp``. One program per
pp rank (each the SPMD program of its stage over the rest of the mesh), the schedule, the
plan, and the conversions of arrays between the global view and every rank's pieces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ...autodiff.optim import initial_state
from ...ir.graph import Graph, input_name
from ...ir.printer import print_graph
from ...ir.mesh import Mesh
from ..strategies.base import ParsedStrategy, StrategyError
from .build import WHOLE_SUFFIX, Pipeline
from .schedule import PipelineError


class WholeStage:
    """A stage that no other mesh axis splits: every array is whole on its one rank."""

    def __init__(self, graph: Graph) -> None:
        self.local = graph
        self.graph = graph

    def shard_weights(self, weights: Mapping[str, Any]) -> list[dict[str, np.ndarray]]:
        out = {}
        for v in self.graph.inputs:
            if v.role in ("param", "state"):
                name = input_name(v)
                if name not in weights:
                    if v.role == "state":
                        out[name] = initial_state(name, v.type, weights)
                        continue
                    raise StrategyError(f"no value for the param %{name} {v.type}; pass weights= with every param")
                out[name] = np.array(weights[name])
        return [out]

    def shard_inputs(self, inputs: Mapping[str, Any]) -> list[dict[str, np.ndarray]]:
        out = {}
        for v in self.graph.inputs:
            if v.role == "input":
                name = input_name(v)
                if name not in inputs:
                    raise StrategyError(f"no value for the input %{name} {v.type}")
                out[name] = np.array(inputs[name])
        return [out]

    def assemble_outputs(self, outputs_by_rank: Sequence[Sequence[Any]]) -> list[np.ndarray]:
        return [np.asarray(o) for o in outputs_by_rank[0]]

    def assemble_weights(self, weights_by_rank: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in weights_by_rank[0].items()}


@dataclass
class PipelineProgram:
    """The result of ``parallelize`` with ``pp``: ``stages[p]`` is pp rank ``p``'s program
    (a ParallelProgram over ``submesh``, or a WholeStage when the mesh has no other axis);
    global rank ``r`` runs ``rank_graphs()[r]``. Arrays move between the global view and the
    ranks' pieces with ``shard_*`` and ``assemble*``, as for a ParallelProgram."""

    source: Graph
    mesh: Mesh
    axis: str
    strategy: ParsedStrategy
    pipeline: Pipeline
    stages: list[Any]
    submesh: Mesh | None
    plan: Any = None
    timings: dict[str, float] = field(default_factory=dict)
    # The data-parallel ranks that split each microbatch (the batch rows' layout, _mb_major).
    batch_ranks: int = 1
    # unroll=False: the stages keep their one-microbatch templates (``templates``, one per pp
    # rank) for the section-level simulation; nothing here can run.
    unrolled: bool = True
    templates: list[Any] | None = None
    # unroll=False: pp rank p's template copied from pp rank q's (alike but for names and the
    # transfers' peers), as {p: q}; the report analyzes q's memory once for both.
    copied_from: dict[int, int] = field(default_factory=dict)

    def _runnable(self, what: str) -> None:
        if not self.unrolled:
            raise PipelineError(f"PipelineProgram.{what}: this pipeline was built with unroll=False for simulation "
                                "(partita.cluster.simulate); its ranks have no programs. Parallelize again without "
                                "unroll=False to run it")

    @property
    def single_device(self) -> Graph:
        return self.source

    @property
    def schedule(self):
        return self.pipeline.schedule

    @property
    def graph(self) -> Graph:
        """The single-device graph (a pipeline has one placed graph per stage: ``stages``)."""
        return self.source

    def coords(self, rank: int) -> tuple[int, int]:
        """(pp rank, rank within the stage's submesh) of global rank ``rank``."""
        c = list(self.mesh.coords(rank))
        p = c.pop(self.mesh.index(self.axis))
        return p, (self.submesh.rank(c) if self.submesh is not None else 0)

    def rank_graphs(self) -> list[Graph]:
        """The program of every global rank (row-major over the mesh)."""
        self._runnable("rank_graphs")
        return [self.stages[self.coords(r)[0]].local for r in range(self.mesh.size)]

    @property
    def local(self) -> Graph:
        """Rank 0's program (the first stage's)."""
        return self.stages[0].local

    def _spread(self, per_stage: list[list[Any]]) -> list[Any]:
        out = []
        for r in range(self.mesh.size):
            p, q = self.coords(r)
            out.append(per_stage[p][q])
        return out

    def _by_stage(self, per_rank: Sequence[Any]) -> list[list[Any]]:
        n = self.submesh.size if self.submesh is not None else 1
        out: list[list[Any]] = [[None] * n for _ in self.stages]
        for r, x in enumerate(per_rank):
            p, q = self.coords(r)
            out[p][q] = x
        return out

    def shard_weights(self, weights: Mapping[str, Any] | None = None) -> list[dict[str, np.ndarray]]:
        """Each rank's pieces of its stage's params and optimizer state (default: the
        single-device graph's weights; missing state starts at zeros)."""
        self._runnable("shard_weights")
        src = dict(self.source.weights if weights is None else weights)
        return self._spread([st.shard_weights({k: v for k, v in src.items() if _has(st.graph, k)})
                             for st in self.stages])

    def shard_inputs(self, inputs: Mapping[str, Any]) -> list[dict[str, np.ndarray]]:
        """Each rank's pieces of the data inputs its stage reads."""
        self._runnable("shard_inputs")
        for v in self.source.inputs:
            if v.role == "input" and input_name(v) not in inputs:
                raise StrategyError(f"no value for the input %{input_name(v)} {v.type}")
        inputs = {k: self._mb_major(k, v) for k, v in inputs.items()}
        # A value every microbatch computes from the whole batch (build.py, microbatch_graph)
        # reads the whole-batch copy of a batch input: the same array.
        for st in self.stages:
            for v in st.graph.inputs:
                name = input_name(v)
                if name.endswith(WHOLE_SUFFIX) and name[:-len(WHOLE_SUFFIX)] in inputs:
                    inputs[name] = inputs[name[:-len(WHOLE_SUFFIX)]]
        return self._spread([st.shard_inputs({k: v for k, v in inputs.items() if _has(st.graph, k)})
                             for st in self.stages])

    def _mb_major(self, name: str, x: Any, dim: int = 0, back: bool = False) -> Any:
        """Microbatch m is rows [m*B/M, (m+1)*B/M) of the batch, and data-parallel rank d holds
        the d-th share of every microbatch (the pipeline's partitions nest so: the microbatch
        split, then dp inside it; a split dropout's mask follows that layout). A stage's dp
        split hands rank d a contiguous block, so the rows are reordered microbatch-major
        first (``back``: the inverse, for outputs that hold every microbatch)."""
        M, D = self.pipeline.schedule.microbatches, self.batch_ranks
        if M == 1 or D == 1:
            return x
        if not back and not any(v.role == "input" and input_name(v) == name for v in self.source.inputs):
            return x
        a = np.asarray(x)
        if a.ndim <= dim or a.shape[dim] % (M * D):
            return x
        n = a.shape[dim] // (M * D)
        shape = a.shape[:dim] + ((D, M) if back else (M, D)) + (n,) + a.shape[dim + 1:]
        return np.swapaxes(a.reshape(shape), dim, dim + 1).reshape(a.shape)

    def assemble_outputs(self, outputs_by_rank: Sequence[Sequence[Any]]) -> list[np.ndarray]:
        """The single-device graph's outputs, from the ranks that compute them."""
        self._runnable("assemble_outputs")
        res: list[Any] = [None] * len(self.source.outputs)
        for p, group in enumerate(self._by_stage(outputs_by_rank)):
            outs = self._stage_outputs(p, group)
            for k, i in enumerate(self.pipeline.ranks[p].source_index):
                if i is not None and res[i] is None:
                    res[i] = outs[k]
        return res

    def _stage_outputs(self, p: int, group: list[Any]) -> list[np.ndarray]:
        """Stage ``p``'s outputs from its ranks; a forward-only pipeline's outputs hold every
        microbatch (the stage's placed graph types them for one)."""
        st = self.stages[p]
        rp = self.pipeline.ranks[p]
        finals = {i: d for i, o in enumerate(rp.graph.outputs) for v, d in rp.finals if o is v and d is not None}
        if not finals or isinstance(st, WholeStage):
            return st.assemble_outputs(group)
        from ..pad import cut_array
        from ...ir.placement import Placement
        from ..program import assemble

        out = []
        M = self.pipeline.schedule.microbatches
        for i, v in enumerate(st.graph.outputs):
            pl = Placement(v.placement.dims, ()) if v.placement is not None else None
            shape = list(v.type.shape)
            if i in finals:
                shape[finals[i]] *= M
            full = assemble([np.asarray(o[i]) for o in group], pl, st.mesh, shape)
            if i in finals:
                full = self._mb_major("", full, finals[i], back=True)
            pads = st.padding.outputs.get(i) if st.padding is not None else None
            out.append(cut_array(full, pads) if pads else full)
        return out

    def assemble_weights(self, weights_by_rank: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        """The global params and optimizer state (a weight two stages share from the first)."""
        self._runnable("assemble_weights")
        out: dict[str, np.ndarray] = {}
        for p, group in enumerate(self._by_stage(weights_by_rank)):
            for k, v in self.stages[p].assemble_weights(group).items():
                out.setdefault(k, v)
        return out

    def simulate(self, inputs: Mapping[str, Any], weights: Mapping[str, Any] | None = None) -> list[np.ndarray]:
        """Run every rank's program in this process (NumPy reference, exact collectives and
        point-to-point transfers) on the global ``inputs``; returns the global outputs."""
        self._runnable("simulate")
        from ..interpreter import run_mesh

        outs = run_mesh(self.rank_graphs(), self.mesh, self.shard_inputs(inputs), self.shard_weights(weights))
        return self.assemble_outputs(outs)

    def text(self, rank: int = 0) -> str:
        """The program of global rank ``rank`` as text."""
        self._runnable("text")
        return print_graph(self.rank_graphs()[rank])


def _has(graph: Graph, name: str) -> bool:
    try:
        graph.input(name)
        return True
    except Exception:
        return False


__all__ = ["PipelineProgram", "WholeStage"]
