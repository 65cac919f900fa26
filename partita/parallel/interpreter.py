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

Point-to-point ``send``/``recv`` (effect "p2p") are paired instead: the k-th send from rank
s to rank d meets the k-th recv on d from s, and they must agree on the type. Pairing is
checked before anything runs (``pair_point_to_point``); while running, a send completes
only when its peer reaches the matching recv (synchronous, as a blocking transport may
be), so an ordering that could hang on a real run is reported as a deadlock.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..backend.common import bind_inputs, check_array, host_array, numpy_dtype_name
from ..backend.numpy_ref import run_node_reference
from ..ir.diagnostics import ExecutionError, PartitaError
from ..ir.graph import Graph, Node, Value
from ..ir.printer import format_attr
from ..ops.collective import is_point_to_point
from ..ops.registry import OPS
from ..ir.mesh import Mesh, MeshError


class MeshRunError(ExecutionError):
    """Per-rank programs that cannot run together on the mesh (the message names the ranks
    and the nodes, and says what to change)."""


def run_mesh(graph: Graph | Sequence[Graph], mesh: Mesh | str,
             inputs_by_rank: Sequence[Mapping[str, Any] | Sequence[Any]],
             weights_by_rank: Sequence[Mapping[str, Any]] | None = None) -> list[list[np.ndarray]]:
    """Run the per-rank program(s) on every rank of ``mesh``; returns each rank's outputs.

    ``graph`` is one per-rank graph that every rank runs (SPMD) or a list with one graph per
    rank; sends and recvs between them must pair up (``pair_point_to_point``).
    ``inputs_by_rank[r]`` and ``weights_by_rank[r]`` (default: each graph's own weights) feed
    rank ``r``, as ``partita.run`` takes them.
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
            if _communicates(node):
                _check_against_mesh(node, mesh, r)
    if not all(g is graphs[0] for g in graphs):
        _check_collectives_line_up(programs, mesh)
    partner = pair_point_to_point(graphs, mesh)

    envs: list[dict[Value, np.ndarray]] = []
    for r, g in enumerate(graphs):
        env: dict[Value, np.ndarray] = {}
        weights = None if weights_by_rank is None else weights_by_rank[r]
        try:
            bound = bind_inputs(g, inputs_by_rank[r], weights)
        except PartitaError as e:
            raise MeshRunError(f"rank {r}: {e}") from None
        for v, a in bound:
            try:
                arr = host_array(v, a)
                check_array(v, arr.shape, numpy_dtype_name(arr))
            except PartitaError as e:
                raise MeshRunError(f"rank {r}: {e}") from None
            env[v] = arr
        envs.append(env)

    pcs = [0] * n
    while True:
        # Every rank runs its ordinary nodes up to its next collective, send or recv (or its end)...
        for r in range(n):
            nodes, env = programs[r], envs[r]
            while pcs[r] < len(nodes) and not _communicates(nodes[pcs[r]]):
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
            if r in done or is_point_to_point(node):
                continue
            axis = node.attrs["axis"]
            members = mesh.group_of(r, axis)
            if not all(m in waiting and not is_point_to_point(waiting[m]) and waiting[m].attrs.get("axis") == axis
                       and m not in done for m in members):
                continue
            for m in members:
                _check_same_collective(waiting[members[0]], members[0], waiting[m], m, axis)
            _run_collective([waiting[m] for m in members], [envs[m] for m in members], members)
            for m in members:
                pcs[m] += 1
                done.add(m)
            progressed = True
        # ...and every send whose peer waits in the recv it pairs with hands its tensor over.
        for r, node in sorted(waiting.items()):
            if r in done or not is_point_to_point(node) or not node.operands:
                continue
            d, recv = partner[(r, node)]
            if d in done or waiting.get(d) is not recv:
                continue
            envs[d][recv.results[0]] = np.array(envs[r][node.operands[0]], copy=True)
            pcs[r] += 1
            pcs[d] += 1
            done.update((r, d))
            progressed = True
        if not progressed:
            raise MeshRunError(_deadlock_message(waiting, partner, mesh))
    return [[envs[r][v] for v in g.outputs] for r, g in enumerate(graphs)]


def check_deadlock_free(graphs: Sequence[Graph], mesh: Mesh | str,
                        error: type[PartitaError] = MeshRunError) -> int:
    """Prove, without running anything, that the per-rank ``graphs`` cannot deadlock: play
    their communication alone in lockstep, as ``run_mesh`` does (a collective proceeds when
    every member of its group waits in it, a send when its peer waits in the matching recv,
    sends synchronous), and raise ``error`` naming where every rank waits if they ever
    stop. Assumes ``pair_point_to_point`` and ``check_collective_order`` pass. Returns how
    many communications were played."""
    mesh = Mesh.of(mesh)
    progs = [[n for n in g.nodes if _communicates(n) and n.attrs.get("group_size", 1) > 1] for g in graphs]
    partner = pair_point_to_point(graphs, mesh, error)
    pcs = [0] * len(progs)
    played = 0
    while True:
        waiting = {r: progs[r][pcs[r]] for r in range(len(progs)) if pcs[r] < len(progs[r])}
        if not waiting:
            return played
        progressed = False
        done: set[int] = set()
        for r, node in sorted(waiting.items()):
            if r in done:
                continue
            if is_point_to_point(node):
                if not node.operands:
                    continue
                d, recv = partner[(r, node)]
                if d not in done and waiting.get(d) is recv:
                    pcs[r] += 1
                    pcs[d] += 1
                    done.update((r, d))
                    played += 1
                    progressed = True
                continue
            members = mesh.group_of(r, node.attrs["axis"])
            if all(m in waiting and m not in done and not is_point_to_point(waiting[m])
                   and waiting[m].attrs.get("axis") == node.attrs["axis"] for m in members):
                for m in members:
                    pcs[m] += 1
                    done.add(m)
                played += 1
                progressed = True
        if not progressed:
            raise error(_deadlock_message(waiting, partner, mesh))


def _communicates(node: Node) -> bool:
    return OPS[node.op].collective is not None or is_point_to_point(node)


def _deadlock_message(waiting: dict[int, Node], partner: dict[tuple[int, Node], tuple[int, Node]],
                      mesh: Mesh) -> str:
    parts = []
    for r, node in sorted(waiting.items()):
        if is_point_to_point(node):
            p, other = partner[(r, node)]
            if node.operands:
                parts.append(f"rank {r} waits in {describe_collective(node)} until rank {p} reaches its matching "
                             f"{describe_collective(other)}")
            else:
                parts.append(f"rank {r} waits in {describe_collective(node)} for rank {p}'s matching {describe_collective(other)}")
        else:
            parts.append(f"rank {r} waits in {describe_collective(node)} (group {mesh.group_of(r, node.attrs['axis'])})")
    if any(is_point_to_point(node) for node in waiting.values()):
        hint = ("A send completes only when its peer reaches the matching recv (run_mesh treats sends as "
                "synchronous, as a blocking transport may be); order each rank's sends, recvs and collectives "
                "so that every pair can meet, e.g. stage 0 sends the activation before it receives the gradient "
                "and stage 1 receives the activation before it sends the gradient")
    else:
        hint = ("Each rank waits for a group whose other members are blocked in a collective over another "
                "axis; issue the collectives of every axis in the same relative order on every rank")
    return f"the per-rank programs deadlock on {mesh}: {'; '.join(parts)}. {hint}"


def pair_point_to_point(graphs: Sequence[Graph], mesh: Mesh,
                        error: type[PartitaError] = MeshRunError) -> dict[tuple[int, Node], tuple[int, Node]]:
    """Pair the sends and recvs of the per-rank ``graphs`` (one per rank of ``mesh``).

    The k-th send from rank s to rank d (its ``peer`` coordinate along its axis, within s's
    group) pairs with the k-th recv on d whose peer is s, in program order; the pair must
    agree on the type (the sent operand's, the recv's result). Returns the map both ways,
    keyed by (rank, node) since ranks may share one graph. Raises ``error`` naming both
    ranks and the node(s): a rank that names itself as peer, a send without its recv (or the
    reverse), or a pair whose types differ. Axes and group sizes must already be checked
    against the mesh.
    """
    sends: dict[tuple[int, int], list[Node]] = {}
    recvs: dict[tuple[int, int], list[Node]] = {}
    for r, g in enumerate(graphs):
        for node in g.nodes:
            if not is_point_to_point(node):
                continue
            axis, peer = node.attrs["axis"], node.attrs["peer"]
            group = mesh.group_of(r, axis)
            if not 0 <= peer < len(group):  # the type rule refuses it; an unverified graph may not have
                raise error(f"rank {r} (@{g.name}): {describe_collective(node)} names peer={peer}, which is not a coordinate "
                            f"along '{axis}' of {mesh} (0..{len(group) - 1})")
            p = group[peer]
            if p == r:
                verb = "send to" if node.operands else "receive from"
                raise error(f"rank {r} (@{g.name}): {describe_collective(node)} names peer={peer}, which is rank {r}'s own "
                            f"coordinate along '{axis}'; a rank cannot {verb} itself. peer is the absolute "
                            f"coordinate of the other rank along '{axis}' (0..{len(group) - 1})")
            if node.operands:
                sends.setdefault((r, p), []).append(node)
            else:
                recvs.setdefault((p, r), []).append(node)
    partner: dict[tuple[int, Node], tuple[int, Node]] = {}
    for s, d in sorted(set(sends) | set(recvs)):
        out, into = sends.get((s, d), []), recvs.get((s, d), [])
        axis = (out or into)[0].attrs["axis"]
        for k in range(max(len(out), len(into))):
            if k >= len(into):
                raise error(
                    f"rank {s}'s {nth(k + 1)} send to rank {d} over axis '{axis}' (@{graphs[s].name}: "
                    f"{describe_collective(out[k])}) has no matching recv: rank {d} (@{graphs[d].name}) receives only "
                    f"{len(into)} tensor(s) from rank {s}{_elsewhere(recvs, d, s, sending=False)}; a real run "
                    f"would hang there. Add recv() {{peer={mesh.coord(s, axis)}}} of {out[k].operands[0].type} to "
                    f"rank {d}'s program, or drop the send")
            if k >= len(out):
                raise error(
                    f"rank {d}'s {nth(k + 1)} recv from rank {s} over axis '{axis}' (@{graphs[d].name}: "
                    f"{describe_collective(into[k])}) has no matching send: rank {s} (@{graphs[s].name}) sends only "
                    f"{len(out)} tensor(s) to rank {d}{_elsewhere(sends, s, d, sending=True)}; a real run would hang "
                    f"there. Add send(...) {{peer={mesh.coord(d, axis)}}} to rank {s}'s program, or drop the recv")
            sent, want = out[k].operands[0].type, into[k].results[0].type
            if sent != want:
                raise error(
                    f"rank {s}'s {nth(k + 1)} send to rank {d} over axis '{axis}' sends {sent} "
                    f"(@{graphs[s].name}: {describe_collective(out[k])}), but the recv it meets on rank {d} expects {want} "
                    f"(@{graphs[d].name}: {describe_collective(into[k])}); a real run would fail or mix up data there. "
                    f"Give the recv shape={list(sent.shape)}, dtype={sent.dtype}, or send a tensor of {want}")
            partner[(s, out[k])] = (d, into[k])
            partner[(d, into[k])] = (s, out[k])
    return partner


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
        raise MeshRunError(f"{describe_collective(node0)} on ranks {members}: the group semantics failed: "
                           f"{type(e).__name__}: {e}") from e
    for node, env, r, res in zip(nodes, envs, members, results):
        res = res if isinstance(res, (list, tuple)) else (res,)
        if len(res) != len(node.results):
            raise MeshRunError(f"{describe_collective(node)} on rank {r}: got {len(res)} result(s), expected {len(node.results)}")
        for v, a in zip(node.results, res):
            t = v.type
            a = np.asarray(a)
            if a.dtype != t.dtype.np:
                a = a.astype(t.dtype.np)
            if a.shape != t.shape:
                raise MeshRunError(f"{describe_collective(node)} on rank {r}: the group semantics gave shape {list(a.shape)}, "
                                   f"the type rule says {t}; the operands of the group's members differ in shape")
            env[v] = a


def _elsewhere(pairs: dict[tuple[int, int], list[Node]], rank: int, expected: int, sending: bool) -> str:
    """The hint for an unmatched send or recv: the other ranks ``rank`` sends to (or receives
    from) instead, the sign of a wrong peer coordinate on one side. ``pairs`` is keyed by
    (sender, receiver)."""
    if sending:
        others = sorted(d for (s, d) in pairs if s == rank and d != expected)
    else:
        others = sorted(s for (s, d) in pairs if d == rank and s != expected)
    if not others:
        return ""
    verb = "sends to" if sending else "receives from"
    return (f" (it {verb} rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} instead: is a peer "
            "coordinate wrong?)")


def _check_against_mesh(node: Node, mesh: Mesh, rank: int) -> None:
    axis, size = node.attrs["axis"], node.attrs["group_size"]
    what = "point-to-point op" if is_point_to_point(node) else "collective"
    try:
        real = mesh.axis_size(axis)
    except MeshError:
        raise MeshRunError(f"{describe_collective(node)} on rank {rank} is a {what} over axis '{axis}', which the mesh "
                           f"{mesh} does not have (its axes: {', '.join(mesh.names)}); use one of those axes or "
                           "run on a mesh with that axis") from None
    if real != size:
        raise MeshRunError(f"{describe_collective(node)} on rank {rank} says group_size={size}, but axis '{axis}' of {mesh} has "
                           f"{real} ranks; set group_size={real} (and the local shapes with it) or run on a mesh "
                           f"whose '{axis}' axis has {size} ranks")


def first_disagreement(seqs: list[list[Node]], mesh: Mesh, axis: str):
    """The first place where two members of a group along ``axis`` issue different
    collectives (``seqs[r]``: rank r's collectives over ``axis``, in order): ``(group, first
    rank, other rank, position, node or None, node or None)``, or None when all agree."""
    for group in mesh.groups(axis):
        first = group[0]
        for m in group[1:]:
            a, b = seqs[first], seqs[m]
            for k in range(max(len(a), len(b))):
                na = a[k] if k < len(a) else None
                nb = b[k] if k < len(b) else None
                if na is None or nb is None or not _same_collective(na, nb):
                    return group, first, m, k, na, nb
    return None


def _check_collectives_line_up(programs: list[list[Node]], mesh: Mesh) -> None:
    """Along each axis, the members of every group must issue the same collectives in order."""
    for axis in mesh.names:
        seqs = [[n for n in nodes if OPS[n.op].collective is not None and n.attrs["axis"] == axis]
                for nodes in programs]
        found = first_disagreement(seqs, mesh, axis)
        if found is not None:
            group, first, m, k, na, nb = found
            raise MeshRunError(
                f"the per-rank programs disagree at their {nth(k + 1)} collective over axis "
                f"'{axis}' (group of ranks {group}): rank {first} runs {describe_collective(na)}, rank {m} runs "
                f"{describe_collective(nb)}; a real run would hang (or mix up data) here. Every rank of a group "
                f"must issue the same collectives over '{axis}', with the same attributes, in the "
                "same order")


def _check_same_collective(a: Node, ra: int, b: Node, rb: int, axis: str) -> None:
    if not _same_collective(a, b):
        raise MeshRunError(f"ranks {ra} and {rb} meet in different collectives over axis '{axis}': rank {ra} runs "
                           f"{describe_collective(a)}, rank {rb} runs {describe_collective(b)}; a real run would hang (or mix up data) "
                           "here")


def _same_collective(a: Node, b: Node) -> bool:
    return (a.op == b.op and a.attrs == b.attrs
            and [v.type for v in a.operands] == [v.type for v in b.operands])


def describe_collective(node: Node | None) -> str:
    """A collective as the error messages show it: op, operand types, attributes, source location."""
    if node is None:
        return "no collective"
    # Every attribute (a mismatch may be in a default), but an empty tag says nothing.
    attrs = ", ".join(f"{k}={format_attr(v)}" for k, v in node.attrs.items() if not (k == "tag" and v == ""))
    loc = node.text_loc or node.loc
    types = ", ".join(str(v.type) for v in node.operands)
    return f"{node.op}({types}) {{{attrs}}}" + (f" at {loc}" if loc else "")


def nth(k: int) -> str:
    """``k`` as an English ordinal: 1st, 2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"
