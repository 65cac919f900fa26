"""The reshard planner: plans checked by running them on the simulated mesh.

Every case builds the per-rank program of a plan, feeds each rank its piece of a global
array as ``have`` places it (for partial axes: random summands that add up to the global
value), runs it with ``run_mesh`` and compares every rank's output with its ``want`` piece.
The pieces are cut here, independently of the planner, from the placement's definition.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partita.ir.builder import Builder
from partita.ir.diagnostics import PartitaError, TypeRuleError
from partita.ir.dtypes import DTYPES, f32
from partita.ir.graph import Graph
from partita.ir.printer import print_graph
from partita.ir.types import TensorType
from partita.ops import OPS
from partita.ir.mesh import Mesh
from partita.ir.placement import Placement, PlacementError
from partita.parallel.reshard import ReshardError, Step, apply_reshard, plan_bytes, plan_cost, plan_reshard
from partita.parallel.interpreter import run_mesh

X2 = Mesh.of("x=2")
DPTP = Mesh.of("dp=2,tp=2")
ABC = Mesh.of("a=2,b=2,c=2")


# --- the oracle: what each rank holds, from the definition of a placement ----------------------

def piece(a: np.ndarray, p: Placement, mesh: Mesh, rank: int) -> np.ndarray:
    """Rank ``rank``'s piece of ``a``: along each dim, the axes' coordinates read as a
    mixed-radix number (major axis first) pick the piece."""
    idx = []
    for n, axes in zip(a.shape, p.dims):
        k, count = 0, 1
        for ax in axes:
            k = k * mesh.axis_size(ax) + mesh.coord(rank, ax)
            count *= mesh.axis_size(ax)
        size = n // count
        idx.append(slice(k * size, (k + 1) * size))
    return a[tuple(idx)]


def rank_inputs(a: np.ndarray, p: Placement, mesh: Mesh, rng: np.random.Generator) -> list[np.ndarray]:
    """Each rank's local value: its piece of its summand, where the summands (one per
    combination of coordinates along the partial axes) add up to ``a``."""
    combos = list(itertools.product(*(range(mesh.axis_size(ax)) for ax in p.partial)))
    parts = [rng.integers(-8, 9, a.shape).astype(a.dtype) for _ in combos[1:]]
    parts.insert(0, a - sum(parts, np.zeros_like(a)))
    summand = dict(zip(combos, parts))
    return [piece(summand[tuple(mesh.coord(r, ax) for ax in p.partial)], p, mesh, r) for r in range(mesh.size)]


def run_plan(shape, have: Placement, want: Placement, mesh: Mesh, seed: int = 0, integer: bool = True):
    """Plan, build, run on the simulated mesh, and check every rank against its ``want`` piece."""
    rng = np.random.default_rng(seed)
    a = (rng.integers(-50, 51, shape) if integer else rng.standard_normal(shape)).astype(np.float32)
    steps = plan_reshard(shape, f32, have, want, mesh, "%x")
    g = Graph("reshard")
    b = Builder(g)
    x = b.input("x", TensorType(have.local_shape(shape, mesh), f32))
    b.ret(apply_reshard(b, x, steps))
    assert g.outputs[0].type.shape == want.local_shape(shape, mesh), print_graph(g)
    ins = rank_inputs(a, have, mesh, rng)
    outs = run_mesh(g, mesh, [{"x": i} for i in ins])
    for r in range(mesh.size):
        expect = piece(a, want, mesh, r)
        # where the target is itself partial, the summands of rank r's group add up to its piece
        summed = [q for q in range(mesh.size)
                  if all(mesh.coord(q, ax) == mesh.coord(r, ax) for ax in mesh.names if ax not in want.partial)]
        got = sum((outs[q][0] for q in summed[1:]), outs[summed[0]][0])
        assert got.shape == expect.shape, f"rank {r}: {have} -> {want}\n{print_graph(g)}"
        if integer:  # integer-valued f32 sums are exact
            assert np.array_equal(got, expect), f"rank {r}: {have} -> {want}\n{print_graph(g)}"
        else:
            # f32 sums of random partial summands round at a few ulps of the summands, not the sum
            np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5, err_msg=f"rank {r}: {have} -> {want}")
    return steps


def all_placements(rank: int, mesh: Mesh) -> list[Placement]:
    """Every placement of a rank-``rank`` tensor: each axis unused, partial, or splitting one
    dim, in every major-to-minor order within a dim."""
    out = []
    for assign in itertools.product(["-", "p", *range(rank)], repeat=len(mesh.names)):
        partial = tuple(ax for ax, s in zip(mesh.names, assign) if s == "p")
        per_dim = [[ax for ax, s in zip(mesh.names, assign) if s == d] for d in range(rank)]
        for orders in itertools.product(*(itertools.permutations(axes) for axes in per_dim)):
            out.append(Placement(tuple(orders), partial))
    return out


def reachable_pairs(mesh: Mesh, rank: int = 2):
    ps = all_placements(rank, mesh)
    return [(h, w) for h in ps for w in ps if set(w.partial) <= set(h.partial)]


# --- systematic runs ----------------------------------------------------------------------------

def test_every_pair_on_a_one_axis_mesh():
    pairs = reachable_pairs(X2)
    assert len(pairs) == 13  # 4 placements; the 3 without partial(x) cannot become partial(x)
    for h, w in pairs:
        run_plan((4, 6), h, w, X2)


@pytest.mark.parametrize("half", [0, 1])
def test_every_pair_on_a_two_axis_mesh(half):
    pairs = reachable_pairs(DPTP)[half::2]
    assert len(pairs) > 100
    for i, (h, w) in enumerate(pairs):
        run_plan((4, 8), h, w, DPTP, seed=i)


def test_every_placement_to_and_from_replicated_on_a_three_axis_mesh():
    rep = Placement.replicated(2)
    ps = all_placements(2, ABC)
    for i, p in enumerate(ps):
        run_plan((8, 16), p, rep, ABC, seed=i)
        run_plan((8, 16), rep, Placement(p.dims), ABC, seed=i)  # no partial target from a whole value


@pytest.mark.parametrize("chunk", range(4))
def test_sampled_pairs_on_a_three_axis_mesh(chunk):
    pairs = reachable_pairs(ABC)
    sample = random.Random(1234).sample(pairs, 240)[chunk::4]
    for i, (h, w) in enumerate(sample):
        run_plan((8, 16), h, w, ABC, seed=i)


def test_non_integer_partial_sums_within_tolerance():
    h = Placement.split(2, {0: ("a", "c")}, partial=("b",))
    w = Placement.split(2, {1: ("b", "a")})
    run_plan((8, 16), h, w, ABC, seed=3, integer=False)


@st.composite
def placement_pairs(draw):
    mesh = draw(st.sampled_from([X2, DPTP, ABC, Mesh.of("p=3,q=2")]))
    rank = draw(st.integers(1, 3))

    def one(partial_ok: tuple[str, ...] | None):
        dims: list[list[str]] = [[] for _ in range(rank)]
        partial = []
        for ax in draw(st.permutations(list(mesh.names))):
            choices = ["-", *range(rank)] + (["p"] if partial_ok is None or ax in partial_ok else [])
            c = draw(st.sampled_from(choices))
            if c == "p":
                partial.append(ax)
            elif c != "-":
                dims[c].append(ax)
        return Placement(tuple(tuple(d) for d in dims), tuple(partial))

    have = one(None)
    want = one(have.partial)
    return mesh, rank, have, want


@settings(max_examples=40, deadline=None)
@given(placement_pairs(), st.integers(0, 2**16))
def test_random_placements(case, seed):
    mesh, rank, have, want = case
    # each dim divisible by every product of axis sizes, and not all dims the same size
    shape = tuple(mesh.size * (d + 1) for d in range(rank))
    steps = run_plan(shape, have, want, mesh, seed=seed, integer=seed % 2 == 0)
    # no plan costs more than the naive one (reduce and gather everything, then slice), in
    # what the planner minimizes: bytes plus a fixed cost per call
    whole = Placement(((),) * rank, want.partial)
    naive = plan_reshard(shape, f32, have, whole, mesh) + plan_reshard(shape, f32, whole, want, mesh)
    assert plan_cost(steps) <= plan_cost(naive)


# --- the plans chosen ---------------------------------------------------------------------------

def ops_of(steps: list[Step]) -> list[tuple]:
    return [(s.op, s.axis) + tuple(v for k, v in s.attrs.items() if k not in ("axis", "group_size", "op"))
            for s in steps]


S0 = Placement.split(2, {0: "x"})
S1 = Placement.split(2, {1: "x"})
R = Placement.replicated(2)
PX = Placement(((), ()), ("x",))


@pytest.mark.parametrize("have, want, ops, sent", [
    # 4 x 8 f32 is 128 bytes; each rank of a pair sends half of S (S: the larger side).
    (S0, R, [("all_gather", "x", 0)], 64),
    (PX, R, [("all_reduce", "x")], 128),
    (PX, S0, [("reduce_scatter", "x", 0)], 64),
    (PX, S1, [("reduce_scatter", "x", 1)], 64),
    (S0, S1, [("all_to_all", "x", 1, 0)], 32),
    (R, S1, [("shard_slice", "x", 1)], 0),
    (S0, S0, [], 0),
    (PX, PX, [], 0),
])
def test_canonical_plans(have, want, ops, sent):
    steps = plan_reshard((4, 8), f32, have, want, X2)
    assert ops_of(steps) == ops
    assert plan_bytes(steps) == sent
    for s in steps:
        assert s.bytes_sent == OPS[s.op].cost([TensorType(s.before, f32)], [TensorType(s.after, f32)],
                                              s.attrs).bytes_written


def test_byte_counts_follow_the_ring_formulas_on_larger_groups():
    mesh = Mesh.of("x=4")
    p = Placement(((), ()), ("x",))
    s0 = Placement.split(2, {0: "x"})
    (ar,) = plan_reshard((8, 8), f32, p, Placement.replicated(2), mesh)
    assert (ar.op, ar.bytes_sent) == ("all_reduce", 2 * 3 * 256 // 4)
    (rs,) = plan_reshard((8, 8), f32, p, s0, mesh)
    assert (rs.op, rs.before, rs.after, rs.bytes_sent) == ("reduce_scatter", (8, 8), (2, 8), 3 * 256 // 4)
    (ag,) = plan_reshard((8, 8), f32, s0, Placement.replicated(2), mesh)
    assert (ag.op, ag.bytes_sent) == ("all_gather", 3 * 256 // 4)
    (a2a,) = plan_reshard((8, 8), f32, s0, Placement.split(2, {1: "x"}), mesh)
    assert (a2a.op, a2a.before, a2a.after, a2a.bytes_sent) == ("all_to_all", (2, 8), (8, 2), 3 * 64 // 4)


def test_reduce_scatter_before_all_gather():
    # partial over tp, split over dp; want split over tp only: scatter the sum first, then
    # gather dp on a quarter of the data
    have = Placement(((("dp",)), ()), ("tp",))
    want = Placement.split(2, {1: "tp"})
    steps = plan_reshard((8, 8), f32, have, want, DPTP)
    assert [s.op for s in steps] == ["reduce_scatter", "all_gather"]
    assert plan_bytes(steps) == 64 + 64  # rs: half of 4x8 f32; ag: half of the gathered 8x4 f32
    run_plan((8, 8), have, want, DPTP)


@pytest.mark.parametrize("n, ops", [
    # A layer norm's weight gradient under dp x tp: a pending sum over both axes. Tiny, two
    # all_reduces (2 calls, 2x its size sent) beat reduce_scatter, all_reduce on the half and
    # all_gather (3 calls, 1.5x): each call costs CALL_BYTES before any data moves.
    (64, ["all_reduce", "all_reduce"]),
    # Large, the bytes decide: 1.5x in three calls.
    (1 << 20, ["reduce_scatter", "all_reduce", "all_gather"]),
])
def test_calls_cost_as_well_as_bytes(n, ops):
    from partita.parallel.reshard import CALL_BYTES

    have = Placement(((),), ("dp", "tp"))
    want = Placement.replicated(1)
    steps = plan_reshard((n,), f32, have, want, DPTP)
    assert [s.op for s in steps] == ops
    two_all_reduces = 2 * 4 * n  # each all_reduce of n f32 over 2 ranks sends 4n bytes
    if len(ops) == 2:
        assert plan_bytes(steps) == two_all_reduces
    else:
        assert plan_bytes(steps) == two_all_reduces * 3 // 4
        assert plan_cost(steps) < two_all_reduces + 2 * CALL_BYTES
    run_plan((n,), have, want, DPTP)


def test_slice_before_gather_over_another_axis():
    have = Placement.split(2, {0: "dp"})
    want = Placement.split(2, {1: "tp"})
    steps = plan_reshard((8, 8), f32, have, want, DPTP)
    assert ops_of(steps) == [("shard_slice", "tp", 1), ("all_gather", "dp", 0)]
    assert plan_bytes(steps) == 64


def test_two_axes_on_one_dim_gather_minor_first_and_slice_major_first():
    both = Placement.split(2, {0: ("dp", "tp")})
    assert ops_of(plan_reshard((8, 8), f32, both, Placement.replicated(2), DPTP)) == [
        ("all_gather", "tp", 0), ("all_gather", "dp", 0)]
    assert ops_of(plan_reshard((8, 8), f32, Placement.replicated(2), both, DPTP)) == [
        ("shard_slice", "dp", 0), ("shard_slice", "tp", 0)]


def test_all_to_all_preferred_to_gather_and_slice():
    have = Placement.split(2, {0: ("a", "b")})
    want = Placement.split(2, {0: "a", 1: "b"})
    steps = plan_reshard((8, 8), f32, have, want, ABC)
    assert ops_of(steps) == [("all_to_all", "b", 1, 0)]
    run_plan((8, 8), have, want, ABC)


def test_every_intermediate_is_a_valid_placement():
    for h, w in random.Random(7).sample(reachable_pairs(ABC), 60):
        for s in plan_reshard((8, 16), f32, h, w, ABC):
            s.placement.validate((8, 16), ABC)
            assert s.after == s.placement.local_shape((8, 16), ABC)


def test_untouched_axes_stay_out_of_the_plan():
    have = Placement.split(2, {0: "a"})
    want = Placement.split(2, {1: "a"})
    assert {s.axis for s in plan_reshard((8, 8), f32, have, want, ABC)} == {"a"}


# --- errors -------------------------------------------------------------------------------------

def test_partial_target_is_impossible():
    with pytest.raises(ReshardError, match=r"cannot reshard %w from replicated to \[-, -\] partial\(x\): the "
                                           r"target is a pending sum over mesh axis 'x', but along 'x' the "
                                           r"value is replicated"):
        plan_reshard((4, 8), f32, R, PX, X2, "%w")
    with pytest.raises(ReshardError, match="but along 'x' the value is split along dim 0"):
        plan_reshard((4, 8), f32, S0, PX, X2, "%w")


def test_unknown_axis_and_indivisible_dims_name_the_tensor():
    with pytest.raises(PlacementError, match=r"dim 1 of %w \(placed as the reshard's target \[-, zz\]\) uses "
                                             r"mesh axis 'zz', which mesh\(x=2\) does not have"):
        plan_reshard((4, 8), f32, R, Placement.split(2, {1: "zz"}), X2, "%w")
    with pytest.raises(PlacementError, match=r"dim 0 of %w \(placed as the reshard's source \[x, -\]\) "
                                             r"\(size 3\) does not divide over x=2"):
        plan_reshard((3, 8), f32, S0, R, X2, "%w")
    with pytest.raises(PlacementError, match="has 1 dim"):
        plan_reshard((4, 8), f32, Placement.split(1, {0: "x"}), R, X2, "%w")


def test_bool_partial_sum_is_refused():
    with pytest.raises(ReshardError, match="pending sum over 'x' of a bool tensor"):
        plan_reshard((4, 8), DTYPES["bool"], PX, R, X2)
    assert plan_reshard((4, 8), DTYPES["bool"], S0, R, X2)[0].op == "all_gather"


def test_errors_are_partita_errors():
    assert issubclass(ReshardError, PartitaError) and issubclass(PlacementError, PartitaError)


def test_apply_reshard_checks_the_local_shape():
    steps = plan_reshard((4, 8), f32, S0, R, X2)
    g = Graph("g")
    b = Builder(g)
    x = b.input("x", TensorType((4, 8), f32))
    with pytest.raises(ReshardError, match=r"expects a local value of shape \[2, 8\], but %x has type f32\[4,8\]"):
        apply_reshard(b, x, steps)
    assert apply_reshard(b, x, []) is x


# --- shard_slice ----------------------------------------------------------------------------------

def test_shard_slice_record():
    d = OPS["shard_slice"]
    assert d.effects == frozenset({"collective"}) and d.collective is not None
    attrs = d.normalize_attrs(dict(axis="tp", group_size=3, dim=1))
    (t,) = d.infer_types([TensorType((2, 6), f32)], attrs)
    assert t.shape == (2, 2)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    got = d.collective([[x], [x], [x]], attrs)
    assert [g.tolist() for g in got] == [x[:, 0:2].tolist(), x[:, 2:4].tolist(), x[:, 4:6].tolist()]
    assert d.cost([TensorType((2, 6), f32)], [t], attrs).bytes_written == 0
    with pytest.raises(TypeRuleError, match="shard_slice: dim 1 has size 5, which does not split into group_size=3"):
        d.infer_types([TensorType((2, 5), f32)], attrs)
    one = d.normalize_attrs(dict(axis="tp", group_size=1, dim=0))
    assert np.array_equal(d.reference([x], one), x)


def test_shard_slice_is_kept_by_passes():
    import partita

    g = Graph("g")
    b = Builder(g)
    x = b.input("x", TensorType((4, 4), f32))
    b.shard_slice(x, axis="x", group_size=2, dim=0)  # unused, but rank-dependent: kept
    b.ret(x)
    out = partita.optimize(g, passes="dce,cse")
    assert [n.op for n in out.nodes] == ["shard_slice"]


# --- torch.distributed: plans through the torch executor on two gloo ranks -------------------------

TORCH_PLANS = [(R, S1), (R, S0), (S0, S1), (PX, S0), (PX, R), (S1, R)]


def _torch_worker(rank: int, port: int, results) -> None:
    try:
        import torch
        import torch.distributed as dist

        import partita
        from partita.parallel import comm

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        failures = []
        with comm.use_groups(comm.new_mesh_groups(X2)):
            for i, (have, want) in enumerate(TORCH_PLANS):
                rng = np.random.default_rng(i)
                a = rng.integers(-50, 51, (4, 6)).astype(np.float32)
                mine = rank_inputs(a, have, X2, rng)[rank]
                g = Graph(f"plan{i}")
                b = Builder(g)
                x = b.input("x", TensorType(mine.shape, f32))
                b.ret(apply_reshard(b, x, plan_reshard((4, 6), f32, have, want, X2)))
                (got,) = partita.run(g, [torch.from_numpy(mine.copy())], backend="torch")
                expect = piece(a, want, X2, rank)
                if got.shape != expect.shape or not np.array_equal(got.numpy(), expect):
                    failures.append(f"rank {rank} {have} -> {want}: got {got.numpy()}, want {expect}")
        dist.destroy_process_group()
        results.put((rank, failures))
    except BaseException:  # the parent must hear of any failure rather than wait for it
        import traceback
        results.put((rank, [traceback.format_exc()]))


@pytest.mark.timeout(120)
def test_plans_run_on_two_gloo_ranks():
    from gloo_ranks import assert_all_ranks_passed, run_on_gloo_ranks

    assert_all_ranks_passed(run_on_gloo_ranks(_torch_worker))
