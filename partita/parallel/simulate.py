"""Run the per-rank programs of a whole mesh in one process, with the NumPy reference.

``run_mesh`` is the oracle for everything the parallel layer produces: it runs every rank's
program in lockstep, ordinary nodes with the reference interpreter's per-node runner and
collectives with their records' group semantics (``OpDef.collective``) over each group of
``Mesh.groups(axis)``. No processes, no sockets: a per-rank program can be checked against
the single-device program on any machine.

Ranks may run different graphs (pipeline stages, hand-written programs) as long as, along
each mesh axis, every member of a group issues the same collectives (op and attributes) in
the same order. A real run would hang, or mix up data, where they do not; here the first
such mismatch is an error naming both ranks and both nodes.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..backend.common import bind_inputs, check_array, numpy_dtype_name
from ..backend.numpy_ref import run_node_reference
from ..ir.diagnostics import ExecutionError, PartitaError
from ..ir.graph import Graph, Node, Value
from ..ir.printer import format_attr
from ..ops.registry import OPS
from .mesh import Mesh, MeshError


class MeshRunError(ExecutionError):
    """Per-rank programs that cannot run together on the mesh (the message names the ranks
    and the nodes, and says what to change)."""


def run_mesh(graph: Graph | Sequence[Graph], mesh: Mesh | str,
             inputs_by_rank: Sequence[Mapping[str, Any] | Sequence[Any]],
             weights_by_rank: Sequence[Mapping[str, Any]] | None = None) -> list[list[np.ndarray]]:
    """Run the per-rank program(s) on every rank of ``mesh``; returns each rank's outputs.

    ``graph`` is one per-rank graph that every rank runs (SPMD) or a list with one graph per
    rank. ``inputs_by_rank[r]`` and ``weights_by_rank[r]`` (default: each graph's own
    weights) feed rank ``r``, as ``partita.run`` takes them.
    """
    mesh = Mesh.of(mesh)
    n = mesh.size
    graphs = [graph] * n if isinstance(graph, Graph) else list(graph)
    if len(graphs) != n:
        raise MeshRunError(f"run_mesh: {len(graphs)} per-rank graphs for the {n} ranks of {mesh}; "
                           "give one graph per rank, or a single graph that every rank runs")
    if len(inputs_by_rank) != n:
        raise MeshRunError(f"run_mesh: inputs for {len(inputs_by_rank)} ranks, but {mesh} has {n} ranks; "
                           "give one input mapping per rank (rank order is row-major over the mesh axes)")
    if weights_by_rank is not None and len(weights_by_rank) != n:
        raise MeshRunError(f"run_mesh: weights for {len(weights_by_rank)} ranks, but {mesh} has {n} ranks")

    programs = [list(g.nodes) for g in graphs]
    for r, nodes in enumerate(programs):
        for node in nodes:
            if OPS[node.op].collective is not None:
                _check_against_mesh(node, mesh, r)
    if not all(g is graphs[0] for g in graphs):
        _check_collectives_line_up(programs, mesh)

    envs: list[dict[Value, np.ndarray]] = []
    for r, g in enumerate(graphs):
        env: dict[Value, np.ndarray] = {}
        weights = None if weights_by_rank is None else weights_by_rank[r]
        try:
            bound = bind_inputs(g, inputs_by_rank[r], weights)
        except PartitaError as e:
            raise MeshRunError(f"rank {r}: {e}") from None
        for v, a in bound:
            arr = np.asarray(a.detach().cpu().numpy() if hasattr(a, "detach") else a)
            try:
                check_array(v, arr.shape, numpy_dtype_name(arr))
            except PartitaError as e:
                raise MeshRunError(f"rank {r}: {e}") from None
            env[v] = arr
        envs.append(env)

    pcs = [0] * n
    while True:
        # Every rank runs its ordinary nodes up to its next collective (or its end)...
        for r in range(n):
            nodes, env = programs[r], envs[r]
            while pcs[r] < len(nodes) and OPS[nodes[pcs[r]].op].collective is None:
                node = nodes[pcs[r]]
                for res, a in zip(node.results, run_node_reference(node, [env[v] for v in node.operands])):
                    env[res] = a
                pcs[r] += 1
        waiting = {r: programs[r][pcs[r]] for r in range(n) if pcs[r] < len(programs[r])}
        if not waiting:
            break
        # ...then every group whose members all wait on a collective over that group's axis
        # runs it. Members of one group wait on their k-th collective over that axis together.
        progressed = False
        done: set[int] = set()
        for r, node in sorted(waiting.items()):
            if r in done:
                continue
            axis = node.attrs["axis"]
            members = mesh.group_of(r, axis)
            if not all(m in waiting and waiting[m].attrs.get("axis") == axis and m not in done for m in members):
                continue
            for m in members:
                _check_same_collective(waiting[members[0]], members[0], waiting[m], m, axis)
            _run_collective([waiting[m] for m in members], [envs[m] for m in members], members)
            for m in members:
                pcs[m] += 1
                done.add(m)
            progressed = True
        if not progressed:
            stuck = "; ".join(f"rank {r} waits in {_describe(node)} (group {mesh.group_of(r, node.attrs['axis'])})"
                              for r, node in sorted(waiting.items()))
            raise MeshRunError(f"the per-rank programs deadlock on {mesh}: {stuck}. Each rank waits for a "
                               "group whose other members are blocked in a collective over another axis; issue "
                               "the collectives of every axis in the same relative order on every rank")
    return [[envs[r][v] for v in g.outputs] for r, g in enumerate(graphs)]


def _run_collective(nodes: list[Node], envs: list[dict[Value, np.ndarray]], members: list[int]) -> None:
    """One collective over one group: member i's operands from ``envs[i]``, results back there."""
    node0 = nodes[0]
    semantics = OPS[node0.op].collective
    assert semantics is not None, "run_mesh only sends nodes of collective ops here"
    args = [[env[v] for v in node.operands] for node, env in zip(nodes, envs)]
    try:
        with np.errstate(all="ignore"):
            results = semantics(args, node0.attrs)
    except PartitaError:
        raise
    except Exception as e:
        raise MeshRunError(f"{_describe(node0)} on ranks {members}: the group semantics failed: "
                           f"{type(e).__name__}: {e}") from e
    for node, env, r, res in zip(nodes, envs, members, results):
        res = res if isinstance(res, (list, tuple)) else (res,)
        if len(res) != len(node.results):
            raise MeshRunError(f"{_describe(node)} on rank {r}: got {len(res)} result(s), expected {len(node.results)}")
        for v, a in zip(node.results, res):
            t = v.type
            a = np.asarray(a)
            if a.dtype != t.dtype.np:
                a = a.astype(t.dtype.np)
            if a.shape != t.shape:
                raise MeshRunError(f"{_describe(node)} on rank {r}: the group semantics gave shape {list(a.shape)}, "
                                   f"the type rule says {t}; the operands of the group's members differ in shape")
            env[v] = a


def _check_against_mesh(node: Node, mesh: Mesh, rank: int) -> None:
    axis, size = node.attrs["axis"], node.attrs["group_size"]
    try:
        real = mesh.axis_size(axis)
    except MeshError:
        raise MeshRunError(f"{_describe(node)} on rank {rank} is a collective over axis '{axis}', which the mesh "
                           f"{mesh} does not have (its axes: {', '.join(mesh.names)}); use one of those axes or "
                           "run on a mesh with that axis") from None
    if real != size:
        raise MeshRunError(f"{_describe(node)} on rank {rank} says group_size={size}, but axis '{axis}' of {mesh} has "
                           f"{real} ranks; set group_size={real} (and the local shapes with it) or run on a mesh "
                           f"whose '{axis}' axis has {size} ranks")


def _check_collectives_line_up(programs: list[list[Node]], mesh: Mesh) -> None:
    """Along each axis, the members of every group must issue the same collectives in order."""
    for axis in mesh.names:
        seqs = [[n for n in nodes if OPS[n.op].collective is not None and n.attrs["axis"] == axis]
                for nodes in programs]
        for group in mesh.groups(axis):
            first = group[0]
            for m in group[1:]:
                a, b = seqs[first], seqs[m]
                for k in range(max(len(a), len(b))):
                    na = a[k] if k < len(a) else None
                    nb = b[k] if k < len(b) else None
                    if na is None or nb is None or not _same_collective(na, nb):
                        raise MeshRunError(
                            f"the per-rank programs disagree at their {_ordinal(k + 1)} collective over axis "
                            f"'{axis}' (group of ranks {group}): rank {first} runs {_describe(na)}, rank {m} runs "
                            f"{_describe(nb)}; a real run would hang (or mix up data) here. Every rank of a group "
                            f"must issue the same collectives over '{axis}', with the same attributes, in the "
                            "same order")


def _check_same_collective(a: Node, ra: int, b: Node, rb: int, axis: str) -> None:
    if not _same_collective(a, b):
        raise MeshRunError(f"ranks {ra} and {rb} meet in different collectives over axis '{axis}': rank {ra} runs "
                           f"{_describe(a)}, rank {rb} runs {_describe(b)}; a real run would hang (or mix up data) "
                           "here")


def _same_collective(a: Node, b: Node) -> bool:
    return (a.op == b.op and a.attrs == b.attrs
            and [v.type for v in a.operands] == [v.type for v in b.operands])


def _describe(node: Node | None) -> str:
    if node is None:
        return "no collective"
    attrs = ", ".join(f"{k}={format_attr(v)}" for k, v in node.attrs.items())
    loc = node.text_loc or node.loc
    types = ", ".join(str(v.type) for v in node.operands)
    return f"{node.op}({types}) {{{attrs}}}" + (f" at {loc}" if loc else "")


def _ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"
