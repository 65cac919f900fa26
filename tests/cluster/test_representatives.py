"""The alike ranks the simulator plays once (simulator._representatives): each axis's groups
are walked once (group_node_signatures), and give the signatures the per-rank walk gave."""

from __future__ import annotations

import pytest

from partita.cluster import load_cluster
from partita.cluster.simulator import group_node_signatures
from partita.ir.mesh import Mesh


def per_rank(mesh: Mesh, node_of: list[int], axis: str) -> list[tuple[int, bool]]:
    """The signature rank by rank, as it was computed before: its group's members on its node,
    and whether the group is one node."""
    out = []
    for r in range(mesh.size):
        g = mesh.group_of(r, axis)
        out.append((sum(node_of[m] == node_of[r] for m in g), all(node_of[m] == node_of[g[0]] for m in g)))
    return out


@pytest.mark.parametrize("mesh,nodes", [("dp=4,tp=8", 4), ("pp=4,dp=2,tp=4", 4), ("dp=2,pp=4,cp=4,tp=2", 8),
                                        ("dp=3,tp=3", 3), ("pp=2,dp=8", 2), ("tp=16", 2)])
def test_each_group_walked_once_gives_the_per_rank_signatures(mesh, nodes):
    m = Mesh.of(mesh)
    cluster = load_cluster("selene").with_nodes(nodes)
    node_of = [cluster.node_of(r) for r in range(m.size)]
    for axis in m.names:
        assert group_node_signatures(m, node_of, axis) == per_rank(m, node_of, axis)
