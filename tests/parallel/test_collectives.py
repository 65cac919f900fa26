"""Collective ops: type rules, group semantics, run_mesh, and the torch.distributed
implementations on two gloo ranks."""

from __future__ import annotations

import re
import traceback

import numpy as np
import pytest

import partita
from partita.ir.builder import Builder
from partita.ir.diagnostics import AttributeError_, ExecutionError, TypeRuleError
from partita.ir.dtypes import DTYPES, f32
from partita.ir.graph import Graph
from partita.ir.parser import parse
from partita.ir.printer import print_graph
from partita.ir.types import TensorType
from partita.ops import OPS
from partita.ir.mesh import Mesh
from partita.parallel.interpreter import MeshRunError, run_mesh

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def infer(name: str, shape, dtype="f32", **attrs) -> TensorType:
    d = OPS[name]
    (t,) = d.infer_types([TensorType(tuple(shape), DTYPES[dtype])], d.normalize_attrs(attrs))
    return t


def group_run(name: str, xs: list[np.ndarray], **attrs) -> list[np.ndarray]:
    d = OPS[name]
    a = d.normalize_attrs(dict(attrs, group_size=len(xs)))
    return [np.asarray(r) for r in d.collective([[x] for x in xs], a)]


# --- records and type rules ------------------------------------------------------------------

def test_records_are_effectful_collectives():
    for name in COLLECTIVES:
        d = OPS[name]
        assert d.effects == frozenset({"collective"}) and d.collective is not None, name
        assert {"axis", "group_size"} <= {a.name for a in d.attrs}, name
    assert OPS["add"].collective is None


def test_local_type_rules():
    assert infer("all_reduce", (4, 6), axis="tp", group_size=4) == TensorType((4, 6), f32)
    assert infer("all_reduce", (3,), "i64", axis="tp", group_size=2, op="max").shape == (3,)
    assert infer("all_gather", (4, 6), axis="tp", group_size=4, dim=1).shape == (4, 24)
    assert infer("all_gather", (4, 6), axis="tp", group_size=4, dim=-2).shape == (16, 6)
    assert infer("reduce_scatter", (8, 6), axis="tp", group_size=4, dim=0).shape == (2, 6)
    assert infer("all_to_all", (8, 6), axis="tp", group_size=2, split_dim=0, concat_dim=1).shape == (4, 12)
    assert infer("all_to_all", (8, 6), axis="tp", group_size=2, split_dim=1, concat_dim=1).shape == (8, 6)
    assert infer("broadcast", (5,), "bf16", axis="dp", group_size=2, root=1) == TensorType((5,), DTYPES["bf16"])


@pytest.mark.parametrize("name, shape, dtype, attrs, message", [
    ("reduce_scatter", (6, 2), "f32", dict(group_size=4, dim=0),
     "dim 0 has size 6, which does not split into group_size=4 equal pieces"),
    ("all_to_all", (6, 3), "f32", dict(group_size=2, split_dim=1, concat_dim=0),
     "split_dim 1 has size 3, which does not split into group_size=2"),
    ("all_reduce", (2,), "i32", dict(group_size=2, op="avg"), "op=avg needs a float tensor"),
    ("all_reduce", (2,), "bool", dict(group_size=2), "not defined on bool tensors"),
    ("broadcast", (2,), "f32", dict(group_size=2, root=2), "root 2 is not a member of a group of 2"),
    ("all_gather", (2,), "f32", dict(group_size=0, dim=0), "group_size must be at least 1"),
    ("all_gather", (2, 3), "f32", dict(group_size=2, dim=2), "dim 2 is out of range"),
])
def test_type_rule_errors(name, shape, dtype, attrs, message):
    with pytest.raises(TypeRuleError, match=message) as e:
        infer(name, shape, dtype, axis="tp", **attrs)
    assert "tp" in str(e.value) or "range" in str(e.value)


def test_attribute_errors():
    with pytest.raises(AttributeError_, match="'op' must be one of"):
        OPS["all_reduce"].normalize_attrs(dict(axis="tp", group_size=2, op="prod"))
    with pytest.raises(AttributeError_, match="missing required attribute 'group_size'"):
        OPS["all_reduce"].normalize_attrs(dict(axis="tp"))


def test_costs_follow_the_ring():
    t = TensorType((4, 8), f32)  # 128 bytes
    ar = OPS["all_reduce"].cost_of([t], [t], OPS["all_reduce"].normalize_attrs(dict(axis="tp", group_size=4)))
    assert (ar.bytes_written, ar.bytes_read, ar.flops) == (2 * 128 * 3 // 4, 2 * 128 * 3 // 4, 32 * 3 // 4)
    ag = OPS["all_gather"].cost_of([t], [TensorType((16, 8), f32)],
                                   OPS["all_gather"].normalize_attrs(dict(axis="tp", group_size=4, dim=0)))
    assert (ag.bytes_written, ag.flops) == (3 * 128, 0)
    rs = OPS["reduce_scatter"].cost_of([t], [TensorType((1, 8), f32)],
                                       OPS["reduce_scatter"].normalize_attrs(dict(axis="tp", group_size=4, dim=0)))
    assert (rs.bytes_written, rs.bytes_read, rs.flops) == (96, 96, 24)
    one = OPS["all_reduce"].cost_of([t], [t], OPS["all_reduce"].normalize_attrs(dict(axis="tp", group_size=1)))
    assert (one.bytes_written, one.bytes_read, one.flops) == (0, 0, 0)


# --- group semantics ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 4])
def test_group_semantics_by_hand(n):
    rng = np.random.default_rng(n)
    xs = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(n)]
    total = xs[0].astype(np.float64)
    for x in xs[1:]:
        total = total + x
    for out in group_run("all_reduce", xs, axis="tp"):
        np.testing.assert_allclose(out, total, rtol=1e-6, atol=1e-6)
    for out in group_run("all_reduce", xs, axis="tp", op="avg"):
        np.testing.assert_allclose(out, total / n, rtol=1e-6, atol=1e-6)
    for out in group_run("all_reduce", xs, axis="tp", op="max"):
        np.testing.assert_array_equal(out, np.max(np.stack(xs), axis=0))
    for out in group_run("all_reduce", xs, axis="tp", op="min"):
        np.testing.assert_array_equal(out, np.min(np.stack(xs), axis=0))
    for out in group_run("all_gather", xs, axis="tp", dim=1):
        assert out.shape == (4, 8 * n)
        for i in range(n):
            np.testing.assert_array_equal(out[:, 8 * i:8 * (i + 1)], xs[i])
    w = 8 // n
    for i, out in enumerate(group_run("reduce_scatter", xs, axis="tp", dim=1)):
        np.testing.assert_allclose(out, total[:, w * i:w * (i + 1)], rtol=1e-6, atol=1e-6)
    h = 4 // n
    for j, out in enumerate(group_run("all_to_all", xs, axis="tp", split_dim=0, concat_dim=1)):
        assert out.shape == (h, 8 * n)
        for i in range(n):  # piece j (rows) of member i, placed i-th along the columns
            np.testing.assert_array_equal(out[:, 8 * i:8 * (i + 1)], xs[i][h * j:h * (j + 1)])
    for out in group_run("broadcast", xs, axis="tp", root=n - 1):
        np.testing.assert_array_equal(out, xs[n - 1])


def test_integer_and_low_precision_reductions():
    xs = [np.array([1, -5, 7], np.int64), np.array([2, 3, -1], np.int64)]
    assert [o.tolist() for o in group_run("all_reduce", xs, axis="dp")] == [[3, -2, 6]] * 2
    assert group_run("all_reduce", xs, axis="dp", op="min")[1].tolist() == [1, -5, -1]
    bf = DTYPES["bf16"].np
    ys = [np.array([256.0], bf), np.array([1.0], bf), np.array([1.0], bf)]
    # computed in f32 and rounded once: 258 is a bf16 value; rounding after every add would give 256
    assert group_run("all_reduce", ys, axis="dp")[0].astype(np.float32).tolist() == [258.0]


def test_single_rank_reference_is_the_identity_and_larger_groups_refuse():
    g = parse('graph @one(%x: f32[2,3]) -> (f32[2,3], f32[2,3]) {\n'
              '  %0 = all_reduce(%x) {axis="dp", group_size=1} : f32[2,3]\n'
              '  %1 = all_gather(%0) {axis="tp", group_size=1, dim=0} : f32[2,3]\n'
              '  return %0, %1\n}\n', "one.pir")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for out in partita.run(g, [x]):
        np.testing.assert_array_equal(out, x)
    for out in partita.run(g, [x], backend="torch"):
        np.testing.assert_array_equal(out.numpy(), x)
    g4 = parse('graph @four(%x: f32[2,3]) -> (f32[2,3]) {\n'
               '  %0 = all_reduce(%x) {axis="tp", group_size=4} : f32[2,3]\n  return %0\n}\n', "four.pir")
    with pytest.raises(ExecutionError, match=r"all_reduce is a collective over axis tp \(4 ranks\): run the "
                                             r"per-rank program with partita.parallel.interpreter.run_mesh"):
        partita.run(g4, [x])


def test_torch_implementation_needs_the_axis_group():
    pytest.importorskip("torch")
    import torch

    from partita.parallel import comm
    from partita.parallel.comm import CommError

    attrs = OPS["all_reduce"].normalize_attrs(dict(axis="tp", group_size=2))
    with comm.use_groups({}):
        with pytest.raises(CommError, match=r"no process group for mesh axis 'tp' .*set_groups"):
            OPS["all_reduce"].torch([torch.ones(3)], attrs)


def test_passes_never_drop_or_merge_collectives():
    g = parse('graph @keep(%x: f32[4]) -> (f32[4]) {\n'
              '  %0 = all_reduce(%x) {axis="tp", group_size=2} : f32[4]\n'
              '  %1 = all_reduce(%x) {axis="tp", group_size=2} : f32[4]\n'
              '  %2 = all_gather(%x) {axis="tp", group_size=2, dim=0} : f32[8]\n'
              '  return %1\n}\n', "keep.pir")
    out = partita.optimize(g, passes="canonicalize,cse,dce")
    assert [n.op for n in out.nodes] == ["all_reduce", "all_reduce", "all_gather"]
    again = parse(print_graph(out), "again.pir")
    assert again.diff(out) is None, again.diff(out)


# --- run_mesh ----------------------------------------------------------------------------------

MESH = Mesh.of("dp=2,tp=2")


def emit(b: Builder, name: str, x, **attrs):
    """One collective node. ``Builder.emit`` and ``b.<op>(...)`` take the op name as their
    first parameter, so an attribute called ``op`` has to go through ``emit_node``."""
    return b.emit_node(name, [x], attrs).results[0]


def graph_of(build, *types, name="rank") -> Graph:
    g = Graph(name)
    b = Builder(g)
    ins = [b.input(f"x{i}", TensorType(tuple(s), f32)) for i, s in enumerate(types)]
    b.ret(*build(b, *ins))
    return g


def test_row_parallel_matmul_matches_the_single_device_matmul():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((3, 8)).astype(np.float32) for _ in range(2)]  # one batch per dp rank
    w = rng.standard_normal((8, 5)).astype(np.float32)
    g = Graph("row_parallel")
    b = Builder(g)
    x, wl = b.input("x", TensorType((3, 4), f32)), b.param("w", TensorType((4, 5), f32))
    b.ret(b.all_reduce(b.matmul(x, wl), axis="tp", group_size=2))
    inputs, weights = [], []
    for r in range(MESH.size):
        d, c = MESH.coord(r, "dp"), MESH.coord(r, "tp")
        inputs.append({"x": xs[d][:, 4 * c:4 * (c + 1)]})
        weights.append({"w": w[4 * c:4 * (c + 1)]})
    outs = run_mesh(g, MESH, inputs, weights)
    for r, (out,) in enumerate(outs):
        np.testing.assert_allclose(out, xs[MESH.coord(r, "dp")] @ w, rtol=1e-5, atol=1e-5)


def test_round_trips_on_a_two_by_two_mesh():
    rng = np.random.default_rng(1)
    full = [rng.standard_normal((4, 6)).astype(np.float32) for _ in range(2)]  # one per dp group

    def build(b, col_piece, row_piece, partial):
        gathered = b.all_gather(col_piece, axis="tp", group_size=2, dim=1)          # S(1) -> R
        swapped = b.all_to_all(row_piece, axis="tp", group_size=2, split_dim=1, concat_dim=0)  # S(0) -> S(1)
        scattered = b.reduce_scatter(partial, axis="tp", group_size=2, dim=0)       # P -> S(0)
        summed = b.all_gather(scattered, axis="tp", group_size=2, dim=0)            # S(0) -> R
        from_root = b.broadcast(partial, axis="dp", group_size=2, root=1)
        over_dp = emit(b, "all_reduce", partial, axis="dp", group_size=2, op="max")
        return [gathered, swapped, summed, from_root, over_dp]

    g = graph_of(build, (4, 3), (2, 6), (4, 6))
    partials = {r: rng.standard_normal((4, 6)).astype(np.float32) for r in range(4)}
    inputs = []
    for r in range(4):
        d, c = MESH.coord(r, "dp"), MESH.coord(r, "tp")
        inputs.append({"x0": full[d][:, 3 * c:3 * (c + 1)], "x1": full[d][2 * c:2 * (c + 1)], "x2": partials[r]})
    outs = run_mesh(g, MESH, inputs)
    for r, (gathered, swapped, summed, from_root, over_dp) in enumerate(outs):
        d, c = MESH.coord(r, "dp"), MESH.coord(r, "tp")
        tp_group, dp_group = MESH.group_of(r, "tp"), MESH.group_of(r, "dp")
        np.testing.assert_array_equal(gathered, full[d])
        np.testing.assert_array_equal(swapped, full[d][:, 3 * c:3 * (c + 1)])
        np.testing.assert_allclose(summed, partials[tp_group[0]] + partials[tp_group[1]], rtol=1e-6)
        np.testing.assert_array_equal(from_root, partials[dp_group[1]])
        np.testing.assert_array_equal(over_dp, np.maximum(partials[dp_group[0]], partials[dp_group[1]]))


def test_per_rank_graphs_may_differ_where_their_collectives_line_up():
    def scaled(k):
        return graph_of(lambda b, x: [b.all_reduce(b.mul(x, b.full(shape=[2], value=float(k))),
                                                   axis="tp", group_size=2)], (2,))
    x = np.array([1.0, 2.0], np.float32)
    outs = run_mesh([scaled(r + 1) for r in range(4)], MESH, [{"x0": x}] * 4)
    assert [o[0].tolist() for o in outs] == [[3.0, 6.0], [3.0, 6.0], [7.0, 14.0], [7.0, 14.0]]


def test_mismatched_collectives_name_the_first_mismatch_and_both_ranks():
    ar = graph_of(lambda b, x: [b.all_reduce(x, axis="tp", group_size=2)], (4,))
    ag = graph_of(lambda b, x: [b.reduce_scatter(x, axis="tp", group_size=2, dim=0)], (4,))
    x = [{"x0": np.ones(4, np.float32)}] * 4
    with pytest.raises(MeshRunError) as e:
        run_mesh([ar, ar, ar, ag], MESH, x)
    msg = str(e.value)
    assert "1st collective over axis 'tp' (group of ranks [2, 3])" in msg
    assert "rank 2 runs all_reduce" in msg and "rank 3 runs reduce_scatter" in msg and "hang" in msg
    none = graph_of(lambda b, x: [b.relu(x)], (4,))
    with pytest.raises(MeshRunError, match=r"rank 0 runs all_reduce.*rank 1 runs no collective"):
        run_mesh([ar, none, ar, ar], MESH, x)
    avg = graph_of(lambda b, x: [emit(b, "all_reduce", x, axis="tp", group_size=2, op="avg")], (4,))
    with pytest.raises(MeshRunError, match=r'rank 0 runs all_reduce.*op="sum".*rank 1 runs all_reduce.*op="avg"'):
        run_mesh([ar, avg, ar, ar], MESH, x)


def test_collectives_in_crossed_orders_deadlock_clearly():
    dp_then_tp = graph_of(lambda b, x: [b.all_reduce(b.all_reduce(x, axis="dp", group_size=2),
                                                     axis="tp", group_size=2)], (2,))
    tp_then_dp = graph_of(lambda b, x: [b.all_reduce(b.all_reduce(x, axis="tp", group_size=2),
                                                     axis="dp", group_size=2)], (2,))
    x = [{"x0": np.ones(2, np.float32)}] * 4
    # SPMD in either order is fine: sum over the whole mesh.
    assert all(o[0].tolist() == [4.0, 4.0] for o in run_mesh(dp_then_tp, MESH, x))
    with pytest.raises(MeshRunError, match=r"deadlock.*rank 0 waits in all_reduce.*axis=\"dp\""):
        run_mesh([dp_then_tp, tp_then_dp, tp_then_dp, dp_then_tp], MESH, x)


def test_group_size_must_match_the_mesh():
    g = graph_of(lambda b, x: [b.all_gather(x, axis="tp", group_size=4, dim=0)], (2,))
    x = [{"x0": np.ones(2, np.float32)}] * 4
    with pytest.raises(MeshRunError, match=r"all_gather\(f32\[2\]\).*group_size=4, but axis 'tp' of "
                                           r"mesh\(dp=2, tp=2\) has 2 ranks; set group_size=2"):
        run_mesh(g, MESH, x)
    pp = graph_of(lambda b, x: [b.all_reduce(x, axis="pp", group_size=2)], (2,))
    with pytest.raises(MeshRunError, match="axis 'pp', which the mesh mesh\\(dp=2, tp=2\\) does not have"):
        run_mesh(pp, MESH, x)
    with pytest.raises(MeshRunError, match="inputs for 3 ranks"):
        run_mesh(g, MESH, x[:3])


# --- torch.distributed on two gloo ranks ---------------------------------------------------------

TORCH_CASES = [
    ("all_reduce", (4, 6), "f32", dict(op="sum")),
    ("all_reduce", (4, 6), "f32", dict(op="avg")),
    ("all_reduce", (5,), "i64", dict(op="max")),
    ("all_reduce", (5,), "f32", dict(op="min")),
    ("all_gather", (3, 4), "f32", dict(dim=1)),
    ("all_gather", (3, 4), "i32", dict(dim=0)),
    ("reduce_scatter", (4, 6), "f32", dict(dim=1, op="sum")),
    ("reduce_scatter", (4, 6), "f32", dict(dim=0, op="max")),
    ("all_to_all", (4, 6), "f32", dict(split_dim=0, concat_dim=1)),
    ("all_to_all", (2, 6, 3), "f32", dict(split_dim=1, concat_dim=2)),
    ("broadcast", (3, 2), "f32", dict(root=1)),
    ("broadcast", (3, 2), "f32", dict(root=0)),
]


def _member_input(case: int, member: int, shape, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(100 * case + member)
    a = rng.standard_normal(shape) * 10
    return a.astype(DTYPES[dtype].np)


def _torch_worker(rank: int, port: int, results) -> None:
    """One gloo rank: every case through the torch executor, compared with the group semantics."""
    try:
        import torch
        import torch.distributed as dist

        from partita.backend.torch_exec import TorchProgram
        from partita.parallel import comm

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        mesh = Mesh.of("dp=1,tp=2")
        failures = []
        with comm.use_groups(comm.new_mesh_groups(mesh)):
            for i, (op, shape, dtype, attrs) in enumerate(TORCH_CASES):
                for axis, n in (("tp", 2), ("dp", 1)):
                    g = Graph(f"case{i}")
                    b = Builder(g)
                    x = b.input("x", TensorType(shape, DTYPES[dtype]))
                    # a group of one has only member 0 to broadcast from
                    a = dict(attrs, root=min(attrs["root"], n - 1)) if "root" in attrs else attrs
                    b.ret(emit(b, op, x, axis=axis, group_size=n, **a))
                    members = mesh.group_of(rank, axis)
                    xs = [_member_input(i, m, shape, dtype) for m in members]
                    mine = xs[members.index(rank)]
                    (got,) = partita.run(g, [torch.from_numpy(mine)], backend="torch")
                    want = OPS[op].collective([[x_] for x_ in xs], g.last.attrs)[members.index(rank)]
                    if not np.allclose(got.numpy(), want, rtol=1e-5, atol=1e-5) or got.shape != want.shape:
                        failures.append(f"rank {rank} {op} {attrs} over {axis}: got {got.numpy()}, want {want}")
                    # As run_ranks runs a program: collectives with an asynchronous form start
                    # where they stand and are waited for where they are read.
                    (late,) = TorchProgram(g, overlap=True)([torch.from_numpy(mine)])
                    if not np.allclose(late.numpy(), want, rtol=1e-5, atol=1e-5) or late.shape != want.shape:
                        failures.append(f"rank {rank} {op} {attrs} over {axis}, overlapped: got {late.numpy()}, "
                                        f"want {want}")
                    if not np.array_equal(mine, _member_input(i, rank, shape, dtype)):
                        failures.append(f"rank {rank} {op} changed its input in place")
        dist.destroy_process_group()
        results.put((rank, failures))
    except BaseException:  # the parent must hear of any failure rather than wait for it
        results.put((rank, [traceback.format_exc()]))


@pytest.mark.timeout(120)
def test_torch_collectives_on_two_gloo_ranks():
    from gloo_ranks import assert_all_ranks_passed, run_on_gloo_ranks

    assert_all_ranks_passed(run_on_gloo_ranks(_torch_worker))


@pytest.mark.parametrize("attrs, message", [
    ('{axis="pp", group_size=2}', "axis 'pp', which mesh(dp=2, tp=2) does not have; its axes are dp, tp"),
    ('{axis="tp", group_size=4}', "group_size=4 but axis 'tp' of mesh(dp=2, tp=2) has 2 ranks; set group_size=2"),
])
def test_verifier_checks_collectives_against_the_graph_mesh(attrs, message):
    text = f"""graph @r(%x: f32[4]) -> (f32[4]) mesh(dp=2, tp=2) {{
  %0 = all_reduce(%x) {attrs} : f32[4]
  return %0
}}
"""
    with pytest.raises(partita.PartitaError, match=re.escape(message)):
        partita.verify(partita.parse(text))
    ok = text.replace(attrs, '{axis="tp", group_size=2}')
    partita.verify(partita.parse(ok))
