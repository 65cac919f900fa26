"""run_ranks: per-rank programs on real gloo processes, checked against run_mesh.

Each case partitions a global graph (as tests/parallel/test_partition.py does), runs the
per-rank program for a few steps with ``run_ranks`` and with ``run_mesh`` (the NumPy
reference on a simulated mesh, new params fed back by the output aliases), and compares
every rank's outputs and final weights. The failure cases inject a fault in rank 1 and
check that ``run_ranks`` raises ``RankFailure`` naming it, well within the timeout.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import partita
from partita.ir.graph import Graph
from partita.ir.printer import print_graph
from partita.parallel import Placement
from partita.ir.mesh import MeshError
from partita.parallel.partition import local_piece, partition_with_report, shard_weights
from partita.parallel.propagate import propagate
from partita.parallel.interpreter import run_mesh
from partita.runtime.launch import free_port
from partita.runtime import CollectiveFailure, LaunchError, RankFailure, RunResult, run_ranks

MLP = """graph @mlp(%x: f32[8{x},16], %w1: f32[16,32{tp}] param, %b1: f32[32{tp}] param,
               %w2: f32[32{tp},16] param) -> (f32[8,16]) {mesh} {
  %a = matmul(%x, %w1) : f32[8,32]
  %b = add(%a, %b1) : f32[8,32]
  %h = relu(%b) : f32[8,32]
  %y = matmul(%h, %w2) : f32[8,16]
  return %y
}"""

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def mlp(mesh: str, x: str = "", tp: str = "") -> Graph:
    return partita.parse(MLP.replace("{mesh}", mesh).replace("{x}", x).replace("{tp}", tp))


def training(mesh: str, tp: str = "") -> Graph:
    step = partita.training_step(mlp(mesh, x="@dp", tp=tp), loss="mse", optimizer="sgd")
    target = next(v for v in step.inputs if v.name == "target")
    target.placement = Placement.split(2, {0: "dp"})
    return step


def setup(g: Graph, steps: int, seed: int = 0):
    """Partition ``g``; returns (per-rank graph, weights per rank, per-step inputs per rank)."""
    propagate(g)
    local, _ = partition_with_report(g)
    mesh = g.mesh
    rng = np.random.default_rng(seed)
    weights = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) * 0.3
               for v in g.inputs if v.role == "param"}
    inputs = []
    for _ in range(steps):
        glob = {v.name: rng.standard_normal(v.type.shape).astype(np.float32)
                for v in g.inputs if v.role == "input"}
        inputs.append([{v.name: local_piece(glob[v.name], v.placement, mesh, r)
                        for v in g.inputs if v.role == "input"} for r in range(mesh.size)])
    return local, shard_weights(g, weights, mesh), inputs


def simulate(local: Graph, mesh, weights_by_rank, inputs_per_step):
    """The run_mesh oracle over steps: outputs[step][rank] and final weights per rank."""
    weights = [dict(w) for w in weights_by_rank]
    aliases = [(i, a.name) for i, a in enumerate(local.output_aliases) if a is not None]
    outputs = []
    for feed in inputs_per_step:
        outs = run_mesh(local, mesh, feed, weights)
        outputs.append(outs)
        for r, o in enumerate(outs):
            for i, name in aliases:
                weights[r][name] = o[i]
    return outputs, weights


def assert_same(res: RunResult, want_outputs, want_weights, n: int, steps: int) -> None:
    assert res.ranks == tuple(range(n)) and res.steps == steps
    for s in range(steps):
        for r in range(n):
            assert len(res.outputs[s][r]) == len(want_outputs[s][r])
            for i, (got, want) in enumerate(zip(res.outputs[s][r], want_outputs[s][r])):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5,
                                           err_msg=f"step {s}, rank {r}, output {i}")
    for r in range(n):
        assert sorted(res.weights[r]) == sorted(want_weights[r])
        for k in want_weights[r]:
            np.testing.assert_allclose(res.weights[r][k], want_weights[r][k], rtol=1e-5, atol=1e-5,
                                       err_msg=f"rank {r}, final {k}")
    assert all(len(res.timings[r]) == steps and all(t > 0 for t in res.timings[r]) for r in range(n))




# --- runs that agree with the simulated mesh ---------------------------------------------------

def test_megatron_mlp_on_two_ranks():
    local, weights, inputs = setup(mlp("mesh(tp=2)", tp="@tp"), steps=2)
    assert any(n.op == "all_reduce" for n in local.nodes)
    seen = []
    # One graph per rank (each printed and parsed on its own) and one input list per step.
    res = run_ranks([local, local.clone()], "tp=2", weights, inputs, timeout_s=30,
                    progress=lambda rank, step, secs: seen.append((rank, step)))
    want, want_w = simulate(local, "tp=2", weights, inputs)
    assert_same(res, want, want_w, 2, 2)
    # Both tp ranks hold the whole reduced output.
    np.testing.assert_allclose(res.outputs[1][0][0], res.outputs[1][1][0], rtol=1e-6)
    assert sorted(seen) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_data_parallel_sgd_steps_update_the_weights():
    local, weights, inputs = setup(training("mesh(dp=2)"), steps=3, seed=1)
    assert sum(a is not None for a in local.output_aliases) == 3
    # The same data every step, given once per rank.
    res = run_ranks(local, "dp=2", weights, inputs[0], steps=3, timeout_s=30)
    want, want_w = simulate(local, "dp=2", weights, [inputs[0]] * 3)
    assert_same(res, want, want_w, 2, 3)
    losses = [float(res.outputs[s][0][0]) for s in range(3)]
    assert losses[0] > losses[1] > losses[2], losses
    for k in weights[0]:  # dp keeps params replicated, and they moved
        np.testing.assert_array_equal(res.weights[0][k], res.weights[1][k])
        assert not np.allclose(res.weights[0][k], weights[0][k])
    assert len(res.step_seconds()) == 3


def test_data_and_tensor_parallel_training_on_four_ranks():
    local, weights, inputs = setup(training("mesh(dp=2, tp=2)", tp="@tp"), steps=2, seed=2)
    res = run_ranks(local, "dp=2,tp=2", weights, inputs, timeout_s=30)
    want, want_w = simulate(local, "dp=2,tp=2", weights, inputs)
    assert_same(res, want, want_w, 4, 2)
    # tp shards differ between tp ranks, agree between dp ranks.
    assert not np.allclose(res.weights[0]["w1"], res.weights[1]["w1"])
    np.testing.assert_array_equal(res.weights[0]["w1"], res.weights[2]["w1"])


def test_torchrun_joins_the_existing_group(tmp_path):
    local, weights, inputs = setup(training("mesh(dp=2)"), steps=1, seed=3)
    (tmp_path / "program.pir").write_text(print_graph(local))
    (tmp_path / "mesh.txt").write_text("dp=2")
    for r in range(2):
        np.savez(tmp_path / f"weights_{r}.npz", **weights[r])
        np.savez(tmp_path / f"inputs_{r}.npz", **inputs[0][r])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), os.path.join(ROOT, "tests", "runtime", "torchrun_job.py"), str(tmp_path), "2", "20"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    want, want_w = simulate(local, "dp=2", weights, [inputs[0]] * 2)
    for r in range(2):
        got = np.load(tmp_path / f"result_{r}.npz")
        assert list(got["filled"]) == [r]  # each process ran only its own rank
        for s in range(2):
            for i, w in enumerate(want[s][r]):
                np.testing.assert_allclose(got[f"out_{s}_{i}"], w, rtol=1e-5, atol=1e-5)
        for k, w in want_w[r].items():
            np.testing.assert_allclose(got[f"w_{k}"], w, rtol=1e-5, atol=1e-5)


def test_torchrun_rank_failure_names_the_rank_step_and_node(tmp_path):
    # One process with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT) set by
    # hand: run_ranks joins through env:// and reports its own failure.
    g = mlp("")
    rng = np.random.default_rng(5)
    arrays = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs}
    (tmp_path / "program.pir").write_text(print_graph(g))
    (tmp_path / "mesh.txt").write_text("tp=1")
    np.savez(tmp_path / "weights_0.npz", **{k: a for k, a in arrays.items() if k != "x"})
    np.savez(tmp_path / "inputs_0.npz", x=arrays["x"])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    cmd = [sys.executable, os.path.join(ROOT, "tests", "runtime", "torchrun_job.py"), str(tmp_path), "2", "20",
           "0,1,raise"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode != 0
    msg = (tmp_path / "error_0.txt").read_text()
    assert msg.startswith("rank 0 (mesh(tp=1)) raised at step 1: ExecutionError: %a = matmul at <@mlp rank 0>:"), msg
    assert not (tmp_path / "result_0.npz").exists()


def test_torchrun_world_size_must_match_the_mesh(monkeypatch):
    local, weights, inputs = setup(mlp("mesh(tp=2)", tp="@tp"), steps=1)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(LaunchError, match=r"WORLD_SIZE=4 but the mesh mesh\(tp=2\) has 2 ranks.*--nproc_per_node 2"):
        run_ranks(local, "tp=2", weights, inputs[0])


# --- failures: never hang, name the rank ---------------------------------------------------------

@pytest.fixture(scope="module")
def dp_step():
    return setup(training("mesh(dp=2)"), steps=1, seed=4)


def _failing_run(dp_step, steps, timeout_s, fault):
    """Run ``dp_step`` on dp=2 with ``fault`` injected: the RankFailure and the seconds it took."""
    local, weights, inputs = dp_step
    t = time.monotonic()
    with pytest.raises(RankFailure) as e:
        run_ranks(local, "dp=2", weights, inputs[0], steps=steps, timeout_s=timeout_s, _fault=fault)
    return e, time.monotonic() - t


def test_a_rank_that_raises(dp_step):
    local = dp_step[0]
    e, secs = _failing_run(dp_step, 3, 20, (1, 1, "raise"))
    assert secs < 30
    msg = str(e.value)
    assert (e.value.rank, e.value.step, e.value.kind) == (1, 1, "error")
    assert msg.startswith("rank 1 (dp=1 on mesh(dp=2)) raised at step 1: ExecutionError: %a = matmul at "), msg
    assert "injected fault" in msg
    # The node's line in the rank's program text.
    line = int(msg.split("rank 1>:")[1].split(":")[0])
    assert print_graph(local).splitlines()[line - 1].lstrip().startswith("%a = matmul(%x, %w1)")
    assert 0 in e.value.others
    assert "injected fault" in e.value.remote_traceback and "Traceback" in e.value.remote_traceback


@pytest.mark.parametrize("kind, how", [("exit", "exited with code 3"), ("kill", "was killed by signal SIGKILL")])
def test_a_rank_that_dies(dp_step, kind, how):
    local, weights, inputs = dp_step
    t = time.monotonic()
    with pytest.raises(RankFailure, match=f"rank 1 .* died at step 1: the process {how}") as e:
        run_ranks(local, "dp=2", weights, inputs[0], steps=3, timeout_s=20, _fault=(1, 1, kind))
    assert time.monotonic() - t < 30
    assert (e.value.rank, e.value.step, e.value.kind) == (1, 1, "died")


def test_a_stalled_peer_is_named_as_the_rank_that_did_not_reach_the_collective(dp_step):
    # Rank 1 sleeps (alive, heartbeat running) while rank 0 waits in the gradient all_reduce:
    # the report blames rank 1, which entered fewer collectives, not rank 0 that lost it.
    e, secs = _failing_run(dp_step, 2, 4, (1, 0, "stall"))
    assert secs < 4 + 15
    msg = str(e.value)
    assert (e.value.rank, e.value.step, e.value.kind) == (1, 0, "stuck"), msg
    assert msg.startswith("rank 1 (dp=1 on mesh(dp=2)) is stuck at step 0: it is running but did not reach "
                          "all_reduce over axis 'dp' (group of ranks [0, 1])"), msg
    lost = e.value.others[0]
    assert lost.startswith("lost a peer at step 0: CollectiveFailure: all_reduce over axis 'dp'"), lost
    assert "a peer rank of this group probably died or stopped" in lost and "timeout_s=4" in lost
    assert issubclass(CollectiveFailure, partita.ir.diagnostics.PartitaError)


def test_a_stopped_rank_is_named_within_the_timeout_bound(dp_step):
    # SIGSTOP freezes the whole rank (its heartbeat too); it is reported, not the peer that
    # lost it, within timeout_s plus a few seconds, and killed although it is stopped.
    e, secs = _failing_run(dp_step, 3, 4, (1, 1, "stop"))
    assert secs < 4 + 15
    msg = str(e.value)
    assert (e.value.rank, e.value.step, e.value.kind) == (1, 1, "stuck"), msg
    assert msg.startswith("rank 1 (dp=1 on mesh(dp=2)) is stuck at step 1: the process is alive but has not run "
                          "for "), msg
    assert "no heartbeat" in msg and "SIGSTOP" in msg
    assert "rank 0: " in msg and 0 in e.value.others


# --- bad arguments ---------------------------------------------------------------------------------

def test_bad_arguments(dp_step):
    local, weights, inputs = dp_step
    feed = inputs[0]
    with pytest.raises(LaunchError, match=r"weights_by_rank has 1 entries, but mesh\(dp=2\) has 2 ranks"):
        run_ranks(local, "dp=2", weights[:1], feed)
    with pytest.raises(LaunchError, match=r"inputs for 3 ranks, but mesh\(dp=2\) has 2 ranks"):
        run_ranks(local, "dp=2", weights, feed + feed[:1])
    with pytest.raises(LaunchError, match=r"was partitioned for mesh\(dp=2\), but the run is on mesh\(dp=4\)"):
        run_ranks(local, "dp=4", weights * 2, feed * 2)
    with pytest.raises(LaunchError, match=r"3 per-rank graphs for the 2 ranks"):
        run_ranks([local] * 3, "dp=2", weights, feed)
    with pytest.raises(LaunchError, match=r"weights_by_rank\[1\] is None; .*only under torchrun"):
        run_ranks(local, "dp=2", [weights[0], None], feed)
    with pytest.raises(LaunchError, match=r"weights_by_rank\[1\] lacks %b1"):
        run_ranks(local, "dp=2", [weights[0], {k: v for k, v in weights[1].items() if k != "b1"}], feed)
    with pytest.raises(LaunchError, match=r"inputs lacks the data input\(s\) %target .* for rank 0"):
        run_ranks(local, "dp=2", weights, [{"x": feed[0]["x"]}, feed[1]])
    with pytest.raises(LaunchError, match=r"inputs\[1\] has 'y' for rank 1"):
        run_ranks(local, "dp=2", weights, [feed, [feed[0], dict(feed[1], y=feed[1]["x"])]])
    big = dict(weights[0], w1=np.zeros((16, 64), np.float32))
    with pytest.raises(LaunchError, match=r"weights_by_rank\[0\]\['w1'\] is f32\[16,64\] but .* f32\[16,32\].*local shard"):
        run_ranks(local, "dp=2", [big, weights[1]], feed)
    with pytest.raises(LaunchError, match="inputs hold 2 steps but steps=3"):
        run_ranks(local, "dp=2", weights, [feed, feed], steps=3)
    with pytest.raises(LaunchError, match="executor='numpy' cannot run collectives"):
        run_ranks(local, "dp=2", weights, feed, executor="numpy")
    with pytest.raises(LaunchError, match="_fault must be"):
        run_ranks(local, "dp=2", weights, feed, _fault=(2, 0, "raise"))
    with pytest.raises(LaunchError, match="timeout_s must be a positive"):
        run_ranks(local, "dp=2", weights, feed, timeout_s=0)
    with pytest.raises(MeshError):
        run_ranks(local, "dp=0", weights, feed)


def test_a_port_taken_before_rank_0_binds_it_is_chosen_again(dp_step, monkeypatch):
    """The port is free when the parent picks it, and another process takes it before rank 0
    listens on it (gloo's own connections use the same ephemeral range): the run starts again on
    another port instead of failing with EADDRINUSE."""
    import partita.runtime.launch as launch

    local, weights, inputs = dp_step
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    taken = held.getsockname()[1]
    handed: list[int] = []
    real = launch.free_port

    def first_one_taken() -> int:
        handed.append(taken if not handed else real())
        return handed[-1]

    monkeypatch.setattr(launch, "free_port", first_one_taken)
    try:
        res = run_ranks(local, "dp=2", weights, inputs[0], steps=1, timeout_s=30)
    finally:
        held.close()
    assert len(handed) == 2 and handed[0] == taken
    assert res.steps == 1 and res.ranks == (0, 1)


def test_a_port_taken_every_time_is_reported(dp_step, monkeypatch):
    """If every port tried is taken, the run fails with the rank's own error naming the address."""
    import partita.runtime.launch as launch

    local, weights, inputs = dp_step
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    taken = held.getsockname()[1]
    calls: list[int] = []
    monkeypatch.setattr(launch, "free_port", lambda: calls.append(taken) or taken)
    try:
        with pytest.raises(RankFailure) as e:
            run_ranks(local, "dp=2", weights, inputs[0], steps=1, timeout_s=30)
    finally:
        held.close()
    assert len(calls) == launch.PORT_ATTEMPTS
    assert e.value.rank == 0 and e.value.step is None
    assert "address already in use" in str(e.value).lower() or "eaddrinuse" in str(e.value).lower()
