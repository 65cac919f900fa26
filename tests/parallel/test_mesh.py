"""Meshes: ranks, coordinates and collective groups."""

from __future__ import annotations

import pytest

from partita.parallel import Mesh, MeshError


def test_ranks_are_row_major_and_groups_follow_the_axes():
    m = Mesh.of("dp=2,tp=3")
    assert m.size == 6 and m.names == ("dp", "tp") and m.shape == (2, 3)
    assert [m.coords(r) for r in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert all(m.rank(m.coords(r)) == r for r in range(6))
    assert m.groups("tp") == [[0, 1, 2], [3, 4, 5]]
    assert m.groups("dp") == [[0, 3], [1, 4], [2, 5]]
    assert m.group_of(4, "dp") == [1, 4] and m.group_of(4, "tp") == [3, 4, 5]
    assert m.coord(5, "tp") == 2 and m.coord(5, "dp") == 1
    assert str(m) == "mesh(dp=2, tp=3)" and Mesh.of(str(m)) == m
    assert Mesh.of({"x": 4}) == Mesh.of([("x", 4)]) == Mesh.parse("x=4")


def test_three_axes():
    m = Mesh.of("pp=2, dp=2, tp=2")
    assert m.group_of(0, "pp") == [0, 4] and m.group_of(0, "dp") == [0, 2] and m.group_of(0, "tp") == [0, 1]
    assert sorted(r for g in m.groups("dp") for r in g) == list(range(8))


@pytest.mark.parametrize("spec, message", [
    ("", "at least one axis"), ("dp=0", "positive integer size"), ("dp=2,dp=2", "appears twice"),
    ("dp", "write name=size"), ("2x=2", "not an identifier"), ("dp=two", "write name=size"),
])
def test_bad_meshes(spec, message):
    with pytest.raises(MeshError, match=message):
        Mesh.of(spec)


def test_unknown_axis_and_rank():
    m = Mesh.of("dp=2")
    with pytest.raises(MeshError, match="has no axis 'tp'; its axes are dp"):
        m.groups("tp")
    with pytest.raises(MeshError, match="outside the mesh"):
        m.coords(2)
