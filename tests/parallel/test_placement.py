"""Placement: the record, its facts, and the messages of ``validate``."""

from __future__ import annotations

import pytest

from partita.ir import PartitaError
from partita.parallel import Mesh, Placement, PlacementError

MESH = Mesh.of("dp=2, tp=4")


def test_replicated_and_facts():
    r = Placement.replicated(3)
    assert r.dims == ((), (), ()) and r.partial == () and r.rank == 3
    assert r.is_replicated and r.axes_used() == ()
    assert str(r) == "replicated"
    assert Placement.replicated(0) == Placement(())
    p = Placement((("dp", "tp"), ()), ("tp",))
    assert not p.is_replicated
    assert not Placement(((),), ("dp",)).is_replicated  # a pending sum is not replicated
    assert p.axes_used() == ("dp", "tp", "tp")
    assert str(p) == "[dp@tp, -] partial(tp)"
    with pytest.raises(PlacementError, match="non-negative integer"):
        Placement.replicated(-1)


def test_construction_normalizes_and_checks_form():
    # Lists become tuples (placements are hashable records); partial is a sorted set.
    p = Placement([["dp"], []], ["tp", "dp"])  # type: ignore[arg-type]
    assert p.dims == (("dp",), ()) and p.partial == ("dp", "tp")
    assert p == Placement((("dp",), ()), ("dp", "tp"))
    assert hash(p) == hash(Placement((("dp",), ()), ("dp", "tp")))
    assert Placement.split(3, {0: "dp", -1: ("tp", "dp")}, ["tp"]) == Placement((("dp",), (), ("tp", "dp")), ("tp",))
    with pytest.raises(PlacementError, match="out of range for a tensor of rank 2"):
        Placement.split(2, {2: "dp"})
    with pytest.raises(PlacementError, match="'d p' is not an identifier"):
        Placement((("d p",),))
    with pytest.raises(PlacementError, match="must be a tuple"):
        Placement(("dp",))  # a bare string where a dim's axis tuple belongs
    with pytest.raises(PlacementError, match="is not an identifier"):
        Placement(((),), (3,))  # type: ignore[arg-type]
    with pytest.raises(Exception):
        p.dims = ()  # type: ignore[misc]  # frozen


def test_local_shape():
    assert Placement((("dp",), ("tp",))).local_shape((32, 256), MESH) == (16, 64)
    assert Placement((("dp", "tp"), ())).local_shape((32, 5), MESH) == (4, 5)
    assert Placement.replicated(2).local_shape((3, 5), MESH) == (3, 5)
    # A pending sum keeps the global shape on every rank.
    assert Placement(((), ()), ("tp",)).local_shape((3, 5), MESH) == (3, 5)
    assert Placement(((),)).local_shape((0,), MESH) == (0,)
    with pytest.raises(PlacementError, match="does not divide"):
        Placement((("tp",),)).local_shape((6,), MESH)


def _error(p: Placement, shape, what="%w") -> PlacementError:
    with pytest.raises(PlacementError) as info:
        p.validate(shape, MESH, what)
    assert isinstance(info.value, PartitaError)
    return info.value


def test_validate_accepts_good_placements():
    Placement((("dp",), ("tp",))).validate((32, 256), MESH, "%x")
    Placement((("tp", "dp"),)).validate((8,), MESH, "%x")
    Placement(((), ()), ("dp", "tp")).validate((3, 5), MESH, "%x")
    Placement.replicated(0).validate((), MESH, "%x")


def test_validate_unknown_axis_names_tensor_dim_axis_and_mesh():
    e = _error(Placement(((), ("tpx",))), (4, 8))
    assert str(e) == ("dim 1 of %w uses mesh axis 'tpx', which mesh(dp=2, tp=4) does not have "
                      "(did you mean 'tp'?); its axes are dp, tp")
    assert (e.kind, e.dim, e.axis, e.in_partial) == ("unknown_axis", 1, "tpx", False)
    e = _error(Placement(((), ()), ("pp",)), (4, 8))
    assert str(e).startswith("the partial sum of %w uses mesh axis 'pp', which mesh(dp=2, tp=4) does not have")
    assert "its axes are dp, tp" in str(e)
    assert (e.kind, e.dim, e.axis, e.in_partial) == ("unknown_axis", None, "pp", True)


def test_validate_axis_twice():
    e = _error(Placement((("tp",), ("tp",))), (4, 8))
    assert str(e).startswith("dim 1 of %w uses mesh axis 'tp' a second time (already used by dim 0)")
    assert (e.kind, e.dim, e.axis) == ("axis_twice", 1, "tp")
    e = _error(Placement((("dp", "dp"), ())), (4, 8))
    assert "dim 0 of %w uses mesh axis 'dp' a second time (already used by the same dim)" in str(e)
    e = _error(Placement((("tp",), ()), ("tp",)), (4, 8))
    assert str(e).startswith("the partial sum of %w uses mesh axis 'tp' a second time (already used by dim 0)")
    assert e.in_partial and e.axis == "tp"
    e = _error(Placement(((), ()), ("dp", "dp")), (4, 8))
    assert "(already used by the same partial list)" in str(e)


def test_validate_rank_mismatch():
    e = _error(Placement((("dp",), (), ())), (4, 8))
    assert str(e) == ("the placement of %w has 3 dim(s) but the tensor has rank 2 (shape [4, 8]); "
                      "give one entry per dim")
    assert e.kind == "rank"


def test_validate_indivisible_dims():
    e = _error(Placement(((), ("tp",))), (4, 10))
    assert str(e) == ("dim 1 of %w (size 10) does not divide over tp=4; pad the dimension to a multiple "
                      "of 4 or choose another split")
    assert (e.kind, e.dim, e.axis) == ("indivisible", 1, "tp")
    # Several axes on one dim: the product of their sizes must divide it.
    e = _error(Placement((("dp", "tp"),)), (12,), "%h")
    assert str(e) == ("dim 0 of %h (size 12) does not divide over dp=2 x tp=4 (8 pieces); pad the "
                      "dimension to a multiple of 8 or choose another split")
    Placement((("dp", "tp"),)).validate((16,), MESH, "%h")
