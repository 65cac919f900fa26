"""Point-to-point send/recv: records and type rules, what passes keep, a two-stage pipeline
(an MLP's forward and backward split over mesh(pp=2)) on the simulated mesh and on two gloo
ranks against the single-device gradients, and the errors of mismatched pairs."""

from __future__ import annotations

import re
import time
import traceback

import numpy as np
import pytest

import partita
from partita.autodiff.grad import grad
from partita.autodiff.rules import NOT_DIFFERENTIABLE
from partita.ir.builder import Builder
from partita.ir.diagnostics import AttributeError_, ExecutionError, TypeRuleError
from partita.ir.dtypes import DTYPES, f32
from partita.ir.graph import Graph
from partita.ir.printer import print_graph
from partita.ir.types import TensorType
from partita.ops import OPS
from partita.ops.collective import is_point_to_point
from partita.parallel.bucket import CollectiveOrderError, check_collective_order, order_collectives
from partita.parallel.interpreter import MeshRunError, run_mesh

PP = 'axis="pp", group_size={n}'

MLP = """graph @mlp(%x: f32[4,6], %t: f32[4,3], %w1: f32[6,8] param, %w2: f32[8,3] param) -> (f32[]) {
  %a = matmul(%x, %w1) : f32[4,8]
  %h = tanh(%a) : f32[4,8]
  %y = matmul(%h, %w2) : f32[4,3]
  %d = sub(%y, %t) : f32[4,3]
  %sq = mul(%d, %d) : f32[4,3]
  %l = sum(%sq) : f32[]
  return %l
}"""


def stage0(b: int = 4, dp: bool = False, peer: int = 1, n: int = 2) -> str:
    """Layer 1 forward, send the activation, receive its gradient, layer 1 backward."""
    reduce = '\n  %dw = all_reduce(%dw1) {axis="dp", group_size=2} : f32[6,8]' if dp else ""
    return f"""graph @stage0(%x: f32[{b},6], %w1: f32[6,8] param) -> (f32[6,8]) {mesh_text(dp, n)} {{
  %a = matmul(%x, %w1) : f32[{b},8]
  %h = tanh(%a) : f32[{b},8]
  send(%h) {{{PP.format(n=n)}, peer={peer}}}
  %dh = recv() {{{PP.format(n=n)}, peer={peer}, shape=[{b}, 8], dtype=f32}} : f32[{b},8]
  %hh = mul(%h, %h) : f32[{b},8]
  %one = full() {{shape=[], value=1.0}} : f32[]
  %s = sub(%one, %hh) : f32[{b},8]
  %da = mul(%dh, %s) : f32[{b},8]
  %xt = transpose(%x) : f32[6,{b}]
  %dw1 = matmul(%xt, %da) : f32[6,8]{reduce}
  return {"%dw" if dp else "%dw1"}
}}"""


def stage1(b: int = 4, dp: bool = False, peer: int = 0, n: int = 2) -> str:
    """Receive the activation, layer 2 forward, the loss and its backward, send the gradient."""
    shape = f"{b}, 8"
    reduce = ('\n  %lr = all_reduce(%l) {axis="dp", group_size=2} : f32[]'
              '\n  %dwr = all_reduce(%dw2) {axis="dp", group_size=2} : f32[8,3]') if dp else ""
    rtype = f"f32[{shape.replace(' ', '')}]"
    return f"""graph @stage1(%t: f32[{b},3], %w2: f32[8,3] param) -> (f32[], f32[8,3]) {mesh_text(dp, n)} {{
  %h = recv() {{{PP.format(n=n)}, peer={peer}, shape=[{shape}], dtype=f32}} : {rtype}
  %y = matmul(%h, %w2) : f32[{b},3]
  %d = sub(%y, %t) : f32[{b},3]
  %sq = mul(%d, %d) : f32[{b},3]
  %l = sum(%sq) : f32[]
  %two = full() {{shape=[], value=2.0}} : f32[]
  %dy = mul(%d, %two) : f32[{b},3]
  %ht = transpose(%h) : f32[8,{b}]
  %dw2 = matmul(%ht, %dy) : f32[8,3]
  %w2t = transpose(%w2) : f32[3,8]
  %dh = matmul(%dy, %w2t) : f32[{b},8]
  send(%dh) {{{PP.format(n=n)}, peer={peer}}}{reduce}
  return {"%lr, %dwr" if dp else "%l, %dw2"}
}}"""


def mesh_text(dp: bool, n: int) -> str:
    return f"mesh(dp=2, pp={n})" if dp else f"mesh(pp={n})"


def arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((4, 6)).astype(np.float32), "t": rng.standard_normal((4, 3)).astype(np.float32),
            "w1": (rng.standard_normal((6, 8)) * 0.3).astype(np.float32),
            "w2": (rng.standard_normal((8, 3)) * 0.3).astype(np.float32)}


def single_device(a: dict[str, np.ndarray]) -> list[np.ndarray]:
    """loss, dw1, dw2 of the whole MLP on one device (partita's grad pass)."""
    g = partita.parse(MLP)
    grad(g)
    return partita.run(g, a)


def stage_feeds(a: dict[str, np.ndarray]):
    return [{"x": a["x"]}, {"t": a["t"]}], [{"w1": a["w1"]}, {"w2": a["w2"]}]


def p2p_graph(mesh: str = "mesh(pp=2)", **recv_attrs) -> Graph:
    text = f"""graph @g(%x: f32[4]) -> (f32[4]) {mesh} {{
  send(%x) {{axis="pp", group_size=2, peer=1}}
  %r = recv() {{axis="pp", group_size=2, peer=1, shape=[4], dtype=f32}} : f32[4]
  return %r
}}"""
    return partita.parse(text)


# --- records and type rules ----------------------------------------------------------------

def test_records():
    for name in ("send", "recv"):
        d = OPS[name]
        assert d.effects == frozenset({"p2p"}) and d.collective is None, name
        assert [a.name for a in d.attrs][:3] == ["axis", "group_size", "peer"], name
        assert d.vjp is NOT_DIFFERENTIABLE, name
    # A send hands over the piece its rank holds (every dim may be split); a recv has no rule:
    # partition receives the piece its annotated placement gives each rank.
    assert OPS["send"].sharding is not None and OPS["recv"].sharding is None
    assert OPS["send"].operands == ("x",) and OPS["recv"].operands == ()
    t = TensorType((4, 8), f32)
    attrs = OPS["send"].normalize_attrs({"axis": "pp", "group_size": 2, "peer": 1})
    assert OPS["send"].infer_types([t], attrs) == ()
    assert OPS["send"].cost_of([t], [], attrs).bytes_written == 128
    rattrs = OPS["recv"].normalize_attrs({"axis": "pp", "group_size": 4, "peer": 3, "shape": [4, 8], "dtype": "bf16"})
    (rt,) = OPS["recv"].infer_types([], rattrs)
    assert rt == TensorType((4, 8), DTYPES["bf16"])
    assert OPS["recv"].cost_of([], [rt], rattrs).bytes_read == 64
    assert OPS["recv"].infer_types([], dict(rattrs, shape=()))[0] == TensorType((), DTYPES["bf16"])


@pytest.mark.parametrize("op, attrs, message", [
    ("send", {"peer": 2}, "send over axis pp (2 ranks): peer=2 is not a coordinate along the axis; peer is the "
                          "other rank's position in the group, 0..1"),
    ("recv", {"peer": -1}, "recv over axis pp (2 ranks): peer=-1 is not a coordinate along the axis"),
    ("send", {"group_size": 1, "peer": 0}, "send over axis pp: group_size=1 leaves no other rank to send to; a "
                                           "point-to-point op needs a group of at least 2 ranks"),
    ("recv", {"group_size": 1, "peer": 0}, "group_size=1 leaves no other rank to receive from"),
    ("send", {"axis": ""}, "send: axis must name a mesh axis"),
    ("recv", {"shape": [4, -1]}, "recv over axis pp: shape [4, -1] has a negative dim"),
])
def test_type_rule_errors(op, attrs, message):
    base = {"axis": "pp", "group_size": 2, "peer": 1}
    if op == "recv":
        base.update(shape=[4], dtype="f32")
    d = OPS[op]
    with pytest.raises(TypeRuleError, match=re.escape(message)):
        d.infer_types([TensorType((4,), f32)] if op == "send" else [], d.normalize_attrs(dict(base, **attrs)))


def test_attribute_and_arity_errors():
    g = Graph("g")
    b = Builder(g)
    x = b.input("x", TensorType((4,), f32))
    with pytest.raises(AttributeError_, match="recv: missing required attribute 'shape'"):
        b.recv(axis="pp", group_size=2, peer=0, dtype="f32")
    with pytest.raises(AttributeError_, match="send: missing required attribute 'peer'"):
        b.send(x, axis="pp", group_size=2)
    with pytest.raises(TypeRuleError, match=r"send takes 1 operand\(s\) \(x\), got 0"):
        b.send(axis="pp", group_size=2, peer=0)
    with pytest.raises(TypeRuleError, match="f8e4m3fn"):
        b.recv(axis="pp", group_size=2, peer=0, shape=[4], dtype="f8e4m3fn")
    # A send has no result: the builder gives back an empty tuple and the node stays in the graph.
    assert b.send(x, axis="pp", group_size=2, peer=1) == ()
    assert [n.op for n in g.nodes] == ["send"] and len(g.last.results) == 0


def test_text_round_trip_and_verifier_against_the_mesh():
    g = partita.verify(p2p_graph())
    text = print_graph(g)
    assert '  send(%x) {axis="pp", group_size=2, peer=1}\n' in text
    assert '= recv() {axis="pp", group_size=2, peer=1, shape=[4], dtype=f32} : f32[4]' in text
    assert print_graph(partita.parse(text)) == text
    with pytest.raises(partita.PartitaError, match=re.escape("axis 'pp', which mesh(dp=2) does not have")):
        partita.verify(p2p_graph("mesh(dp=2)"))
    with pytest.raises(partita.PartitaError,
                       match=re.escape("group_size=2 but axis 'pp' of mesh(pp=4) has 4 ranks; set group_size=4")):
        partita.verify(p2p_graph("mesh(pp=4)"))


def test_single_process_reference_points_to_run_mesh():
    g = p2p_graph("")
    with pytest.raises(ExecutionError, match="send is point-to-point over axis pp .*run_mesh"):
        partita.run(g, [np.zeros(4, np.float32)])


# --- passes keep them --------------------------------------------------------------------------

def test_dce_and_cse_keep_sends_and_recvs():
    text = """graph @s(%x: f32[4,8]) -> (f32[4,8]) mesh(pp=2) {
  %0 = relu(%x) : f32[4,8]
  %1 = relu(%x) : f32[4,8]
  send(%0) {axis="pp", group_size=2, peer=1}
  send(%1) {axis="pp", group_size=2, peer=1}
  %g = recv() {axis="pp", group_size=2, peer=1, shape=[4, 8], dtype=f32} : f32[4,8]
  %h = recv() {axis="pp", group_size=2, peer=1, shape=[4, 8], dtype=f32} : f32[4,8]
  %u = recv() {axis="pp", group_size=2, peer=1, shape=[4, 8], dtype=f32} : f32[4,8]
  %2 = add(%g, %h) : f32[4,8]
  return %2
}"""
    g = partita.optimize(partita.parse(text), "canonicalize,fold-constants,cse,dce")
    # The two relus merge (so both sends send %0), but neither send nor any recv is dropped
    # or merged, and they keep their order.
    assert [n.op for n in g.nodes] == ["relu", "send", "send", "recv", "recv", "recv", "add"]
    sends = [n for n in g.nodes if n.op == "send"]
    assert sends[0].operands[0] is sends[1].operands[0]
    assert all(is_point_to_point(n) for n in g.nodes if n.op in ("send", "recv"))
    assert not is_point_to_point(g.first)


def test_order_collectives_keeps_the_order_of_sends_and_recvs():
    # The recv of the gradient has no operands; hoisting it above the send of the activation
    # would make both stages wait in a recv.
    s0 = partita.parse(stage0(b=2, dp=True))
    before = [n.op for n in s0.nodes if n.op in ("send", "recv")]
    order_collectives(s0)
    ops = [n.op for n in s0.nodes]
    assert [o for o in ops if o in ("send", "recv")] == before == ["send", "recv"]
    assert ops.index("send") < ops.index("recv") < ops.index("all_reduce")
    partita.verify(s0)


# --- the two-stage pipeline --------------------------------------------------------------------

def test_pipeline_forward_and_backward_on_the_simulated_mesh():
    a = arrays()
    loss, dw1, dw2 = single_device(a)
    s0, s1 = partita.verify(partita.parse(stage0())), partita.verify(partita.parse(stage1()))
    check_collective_order([s0, s1], "pp=2")
    inputs, weights = stage_feeds(a)
    outs = run_mesh([s0, s1], "pp=2", inputs, weights)
    np.testing.assert_allclose(outs[0][0], dw1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[1][0], loss, rtol=1e-5)
    np.testing.assert_allclose(outs[1][1], dw2, rtol=1e-5, atol=1e-6)


def test_pipeline_with_data_parallel_on_a_two_by_two_mesh():
    """mesh(dp=2, pp=2): the peer coordinate along pp maps to the rank of the same dp
    coordinate; each stage halves the batch and all-reduces its gradients over dp."""
    a = arrays(1)
    loss, dw1, dw2 = single_device(a)
    s0, s1 = partita.parse(stage0(b=2, dp=True)), partita.parse(stage1(b=2, dp=True))
    graphs = [s0, s1, s0, s1]  # row-major: rank = 2 * dp + pp
    check_collective_order(graphs, "dp=2,pp=2")
    inputs = [{"x": a["x"][:2]}, {"t": a["t"][:2]}, {"x": a["x"][2:]}, {"t": a["t"][2:]}]
    weights = [{"w1": a["w1"]}, {"w2": a["w2"]}] * 2
    outs = run_mesh(graphs, "dp=2,pp=2", inputs, weights)
    for r in (0, 2):
        np.testing.assert_allclose(outs[r][0], dw1, rtol=1e-5, atol=1e-6)
    for r in (1, 3):
        np.testing.assert_allclose(outs[r][0], loss, rtol=1e-5)
        np.testing.assert_allclose(outs[r][1], dw2, rtol=1e-5, atol=1e-6)


def test_pairs_match_in_program_order():
    two = """graph @a(%x: f32[4], %i: i64[2]) -> () mesh(pp=2) {
  send(%x) {axis="pp", group_size=2, peer=1}
  send(%i) {axis="pp", group_size=2, peer=1}
  return
}"""
    recv_f = '%{v} = recv() {{axis="pp", group_size=2, peer=0, shape=[4], dtype=f32}} : f32[4]'
    recv_i = '%{v} = recv() {{axis="pp", group_size=2, peer=0, shape=[2], dtype=i64}} : i64[2]'
    both = "graph @b() -> ({t0}, {t1}) mesh(pp=2) {{\n  {r0}\n  {r1}\n  return %p, %q\n}}"
    good = partita.parse(both.format(t0="f32[4]", t1="i64[2]", r0=recv_f.format(v="p"), r1=recv_i.format(v="q")))
    swapped = partita.parse(both.format(t0="i64[2]", t1="f32[4]", r0=recv_i.format(v="p"), r1=recv_f.format(v="q")))
    sender = partita.parse(two)
    x, i = np.arange(4, dtype=np.float32), np.array([7, -3])
    outs = run_mesh([sender, good], "pp=2", [{"x": x, "i": i}, {}])
    np.testing.assert_array_equal(outs[1][0], x)
    np.testing.assert_array_equal(outs[1][1], i)
    for check in (lambda: run_mesh([sender, swapped], "pp=2", [{"x": x, "i": i}, {}]),
                  lambda: check_collective_order([sender, swapped], "pp=2")):
        with pytest.raises((MeshRunError, CollectiveOrderError),
                           match=re.escape("rank 0's 1st send to rank 1 over axis 'pp' sends f32[4]")):
            check()


# --- mismatches --------------------------------------------------------------------------------

def _three_stage_feeds(a):
    return [{"x": a["x"]}, {"t": a["t"]}, {}], [{"w1": a["w1"]}, {"w2": a["w2"]}, {}]


IDLE = "graph @idle() -> () mesh(pp=3) {\n  return\n}"

MISMATCHES = {
    # stage 0 sends to coordinate 2 on mesh(pp=3); stage 1 waits for it from coordinate 0
    "wrong peer": ("pp=3", lambda: [stage0(peer=2, n=3), stage1(n=3), IDLE],
                   ["rank 1's 1st recv from rank 0 over axis 'pp' (@stage1: recv() {axis=\"pp\", group_size=3, "
                    "peer=0, shape=[4, 8], dtype=f32} at <string>:2:8) has no matching send: rank 0 (@stage0) sends "
                    "only 0 tensor(s) to rank 1 (it sends to rank 2 instead: is a peer coordinate wrong?); a real "
                    "run would hang there"]),
    "missing recv": ("pp=2", lambda: [stage0().replace("send(%h)", "%unused = relu(%h) : f32[4,8]\n  // send(%h)"),
                                      stage1()],
                     ["rank 1's 1st recv from rank 0 over axis 'pp' (@stage1: recv() {axis=\"pp\", group_size=2, "
                      "peer=0, shape=[4, 8], dtype=f32} at <string>:2:8) has no matching send: rank 0 (@stage0) "
                      "sends only 0 tensor(s) to rank 1; a real run would hang there. Add send(...) {peer=1} to "
                      "rank 0's program, or drop the recv"]),
    "self peer": ("pp=2", lambda: [stage0(), stage1(peer=1)],
                  ["rank 1 (@stage1): recv() {axis=\"pp\", group_size=2, peer=1, shape=[4, 8], dtype=f32} at "
                   "<string>:2:8 names peer=1, which is rank 1's own coordinate along 'pp'; a rank cannot receive "
                   "from itself"]),
}


def _mismatch(case):
    mesh, texts, messages = MISMATCHES[case]
    return mesh, [partita.parse(t) for t in texts()], messages


def test_wrong_shape_fails_to_type_check_before_it_can_run():
    # A recv of f32[4,6] cannot feed the matmul with w2: f32[8,3] either; once the shapes of
    # the receiving stage are consistent, the pair is what disagrees.
    recv_only = """graph @s1(%t: f32[4,3]) -> (f32[4,6]) mesh(pp=2) {
  %h = recv() {axis="pp", group_size=2, peer=0, shape=[4, 6], dtype=f32} : f32[4,6]
  %dh = full() {shape=[4, 8], value=0.0} : f32[4,8]
  send(%dh) {axis="pp", group_size=2, peer=0}
  return %h
}"""
    s0, s1 = partita.parse(stage0()), partita.verify(partita.parse(recv_only))
    a = arrays()
    message = ("rank 0's 1st send to rank 1 over axis 'pp' sends f32[4,8] (@stage0: send(f32[4,8]) {axis=\"pp\", "
               "group_size=2, peer=1} at <string>:4:3), but the recv it meets on rank 1 expects f32[4,6] (@s1: "
               "recv() {axis=\"pp\", group_size=2, peer=0, shape=[4, 6], dtype=f32} at <string>:2:8); a real run "
               "would fail or mix up data there. Give the recv shape=[4, 8], dtype=f32, or send a tensor of f32[4,6]")
    with pytest.raises(MeshRunError, match=re.escape(message)):
        run_mesh([s0, s1], "pp=2", [{"x": a["x"]}, {"t": a["t"]}], [{"w1": a["w1"]}, {}])
    with pytest.raises(CollectiveOrderError, match=re.escape(message)):
        check_collective_order([s0, s1], "pp=2")


@pytest.mark.parametrize("case", ["wrong peer", "missing recv", "self peer"])
def test_mismatched_pairs_name_both_ranks_and_nodes(case):
    mesh, graphs, messages = _mismatch(case)
    a = arrays()
    if mesh == "pp=3":
        inputs, weights = _three_stage_feeds(a)
    else:
        inputs, weights = stage_feeds(a)
    for check, error in ((lambda: run_mesh(graphs, mesh, inputs, weights), MeshRunError),
                         (lambda: check_collective_order(graphs, mesh), CollectiveOrderError)):
        with pytest.raises(error) as info:
            check()
        for m in messages:
            assert m in str(info.value)


def test_a_send_after_its_recv_deadlocks_with_both_ranks_named():
    # Stage 0 waits for the gradient before it sends the activation: every pair matches,
    # but neither stage can reach its send.
    late = stage0().replace('  send(%h) {axis="pp", group_size=2, peer=1}\n', "").replace(
        "  %hh = mul", '  send(%h) {axis="pp", group_size=2, peer=1}\n  %hh = mul')
    s0, s1 = partita.parse(late), partita.parse(stage1())
    check_collective_order([s0, s1], "pp=2")  # the pairs themselves agree
    inputs, weights = stage_feeds(arrays())
    with pytest.raises(MeshRunError) as info:
        run_mesh([s0, s1], "pp=2", inputs, weights)
    text = str(info.value)
    assert text.startswith("the per-rank programs deadlock on mesh(pp=2): rank 0 waits in recv() "
                           "{axis=\"pp\", group_size=2, peer=1, shape=[4, 8], dtype=f32} at <string>:4:9 for rank "
                           "1's matching send(f32[4,8]) {axis=\"pp\", group_size=2, peer=0} at <string>:13:3; rank 1 "
                           "waits in recv()")
    assert "stage 0 sends the activation before it receives the gradient" in text


def test_p2p_over_an_axis_the_mesh_lacks():
    g = p2p_graph("")
    with pytest.raises(MeshRunError, match=re.escape("is a point-to-point op over axis 'pp', which the mesh "
                                                     "mesh(dp=2) does not have")):
        run_mesh(g, "dp=2", [{"x": np.zeros(4, np.float32)}] * 2)
    with pytest.raises(CollectiveOrderError, match=re.escape("is a point-to-point op over axis 'pp', which "
                                                             "mesh(dp=2) does not have")):
        check_collective_order(g, "dp=2")


# --- real processes ----------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_pipeline_on_two_gloo_ranks_with_run_ranks():
    from partita.runtime import run_ranks

    a = arrays(2)
    loss, dw1, dw2 = single_device(a)
    graphs = [partita.parse(stage0()), partita.parse(stage1())]
    inputs, weights = stage_feeds(a)
    want = run_mesh(graphs, "pp=2", inputs, weights)
    res = run_ranks(graphs, "pp=2", weights, inputs, timeout_s=30)
    got = res.outputs[0]
    np.testing.assert_allclose(got[0][0], want[0][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1][0], want[1][0], rtol=1e-5)
    np.testing.assert_allclose(got[1][1], want[1][1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[0][0], dw1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1][1], dw2, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
def test_a_recv_whose_sender_never_sends_fails_on_gloo_ranks_instead_of_hanging():
    from partita.runtime import RankFailure, run_ranks

    _, graphs, _ = _mismatch("missing recv")
    inputs, weights = stage_feeds(arrays())
    t = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_ranks(graphs, "pp=2", weights, inputs, timeout_s=3)
    assert time.monotonic() - t < 60
    # Rank 1 waits for an activation that never comes, so rank 0 waits for a gradient.
    assert re.search(r"recv from rank [01] over axis 'pp' at <@stage[01] rank [01]>:\d+:\d+ failed on "
                     r"rank [01] at step 0: .*a peer rank of this group probably died", str(info.value)), str(info.value)


# Dtypes the torch executor holds natively or in a wider carrier (u16 in int32), and a 0-d tensor.
TORCH_CASES = [("f32", (3, 2)), ("bf16", (5,)), ("bool", (4,)), ("i64", (2, 2)), ("u16", (3,)), ("f32", ())]


def _case_array(dtype: str, shape) -> np.ndarray:
    a = np.arange(1, int(np.prod(shape)) + 1).reshape(shape) * 3 % 7
    return a.astype(DTYPES[dtype].np)


def _dtype_worker(rank: int, port: int, results) -> None:
    """One gloo rank on mesh(dp=1, pp=2): rank 0 sends each case and receives it back
    doubled by rank 1 (added to itself); then a send to its own coordinate must fail."""
    try:
        import torch
        import torch.distributed as dist

        from partita.backend.torch_exec import to_numpy
        from partita.parallel import comm

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        failures = []
        with comm.use_groups(comm.new_mesh_groups("dp=1,pp=2")):
            for dtype, shape in TORCH_CASES:
                t = TensorType(shape, DTYPES[dtype])
                attrs = dict(axis="pp", group_size=2, shape=list(shape), dtype=dtype)
                g = Graph(f"{dtype}{rank}")
                b = Builder(g)
                if rank == 0:
                    x = b.input("x", t)
                    b.send(x, axis="pp", group_size=2, peer=1)
                    b.ret(b.recv(peer=1, **attrs))
                    (got,) = partita.run(g, [_case_array(dtype, shape)], backend="torch")
                    want = _case_array(dtype, shape)
                    want = want | want if dtype == "bool" else want + want
                    got = to_numpy(got)
                    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
                        failures.append(f"{dtype}{list(shape)}: got {got!r}, want {want!r}")
                else:
                    r = b.recv(peer=0, **attrs)
                    twice = b.logical_or(r, r) if dtype == "bool" else b.add(r, r)
                    b.send(twice, axis="pp", group_size=2, peer=0)
                    b.ret()
                    partita.run(g, [], backend="torch")
            g = Graph("self")
            b = Builder(g)
            b.send(b.input("x", TensorType((2,), f32)), axis="pp", group_size=2, peer=rank)
            b.ret()
            try:
                partita.run(g, [np.zeros(2, np.float32)], backend="torch")
                failures.append("a send to this rank's own coordinate did not fail")
            except ExecutionError as e:
                if "a rank cannot send to itself" not in str(e):
                    failures.append(f"unexpected message: {e}")
        dist.destroy_process_group()
        results.put((rank, failures))
    except BaseException:  # the parent must hear of any failure rather than wait for it
        results.put((rank, [traceback.format_exc()]))


@pytest.mark.timeout(120)
def test_torch_send_recv_dtypes_on_two_gloo_ranks():
    from gloo_ranks import assert_all_ranks_passed, run_on_gloo_ranks

    assert_all_ranks_passed(run_on_gloo_ranks(_dtype_worker))


def test_send_hands_over_any_split_and_refuses_a_pending_sum():
    from partita.ir.mesh import Mesh
    from partita.ir.placement import Placement
    from partita.parallel.sharding import Conflict, result_placements, sharding_spec

    t = TensorType((4, 8), f32)
    spec = sharding_spec("send", [t], OPS["send"].normalize_attrs({"axis": "pp", "group_size": 2, "peer": 1}))
    mesh = Mesh.of("dp=2,tp=2")
    for p in (Placement.replicated(2), Placement.split(2, {0: "dp"}), Placement.split(2, {0: "dp", 1: "tp"})):
        assert result_placements(spec, [p], [t], mesh) == []
    assert isinstance(result_placements(spec, [Placement.split(2, {}, partial=("dp",))], [t], mesh), Conflict)


def test_check_deadlock_free_proves_an_order_and_refuses_two_sends_that_wait_for_each_other():
    from partita.ir.parser import parse
    from partita.parallel.interpreter import MeshRunError, check_deadlock_free

    def stage(name: str, peer: int, send_first: bool) -> str:
        send = f'  send(%x) {{axis="pp", group_size=2, peer={peer}}}'
        recv = f'  %y = recv() {{axis="pp", group_size=2, peer={peer}, shape=[4], dtype=f32}} : f32[4]'
        body = [send, recv] if send_first else [recv, send]
        return f"graph @{name}(%x: f32[4]) -> (f32[4]) {{\n" + "\n".join(body) + "\n  return %y\n}"

    ok = [parse(stage("s0", 1, True)), parse(stage("s1", 0, False))]
    assert check_deadlock_free(ok, "pp=2") == 2
    both = [parse(stage("s0", 1, True)), parse(stage("s1", 0, True))]
    with pytest.raises(MeshRunError, match=r"deadlock on mesh\(pp=2\): rank 0 waits in send.*rank 1 waits in send"):
        check_deadlock_free(both, "pp=2")
