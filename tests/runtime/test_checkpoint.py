"""Sharded checkpoints: save per rank, reassemble bit-exactly, reshard on load, survive crashes.

The model mixes placements on ``mesh(dp=2, tp=2)``: a weight split on dim 0 over tp, one
split on dim 1 over dp and tp, replicated ones (f32, bf16), an i64 state split over dp, and
a scalar. Every load is compared with ``local_piece`` of the original global arrays.
"""

from __future__ import annotations

import json
import os
import threading

import ml_dtypes
import numpy as np
import pytest

import partita
from partita.ir.diagnostics import PartitaError, WeightsError
from partita.parallel import Mesh, Placement
from partita.parallel.partition import local_piece, partition, shard_weights
from partita.parallel.propagate import propagate
from partita.parallel.interpreter import run_mesh
from partita.runtime import checkpoint as ck
from partita.runtime.checkpoint import CheckpointError, ShardLayout

MODEL = """graph @m(%x: f32[2,8], %a: f32[8@tp,6] param, %b: f32[4,8@dp@tp] param, %c: bf16[6] param,
                 %d: f32[4,4] param, %s: i64[4@dp,2] state, %t: f32[] state) -> (f32[2,8]) mesh(dp=2, tp=2) {
  %y = add(%x, %x) : f32[2,8]
  return %y
}"""


def model():
    g = partita.parse(MODEL)
    rng = np.random.default_rng(0)
    w = {"a": rng.standard_normal((8, 6)).astype(np.float32),
         "b": rng.standard_normal((4, 8)).astype(np.float32),
         # bf16 values with NaN and -0.0: compared by bits, not by value
         "c": np.array([1.5, -0.0, np.nan, 3e38, -2.0, 1e-40], dtype=ml_dtypes.bfloat16),
         "d": rng.standard_normal((4, 4)).astype(np.float32),
         "s": rng.integers(-2**62, 2**62, size=(4, 2), dtype=np.int64),
         "t": np.array(7.25, dtype=np.float32)}
    return g, w


def same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


@pytest.fixture
def saved(tmp_path):
    g, w = model()
    layout = ShardLayout.of(g)
    ck.save(tmp_path, 1, layout, shard_weights(g, w))
    return tmp_path, layout, w


# --- layout -------------------------------------------------------------------------------

def test_layout_of_graph_takes_params_and_state():
    g, _ = model()
    layout = ShardLayout.of(g)
    assert layout.names == ("a", "b", "c", "d", "s", "t")
    assert layout.mesh == Mesh.of("dp=2,tp=2")
    assert str(layout.weights[1].placement) == "[-, dp@tp]"
    assert layout.weights[2].placement.is_replicated  # unplaced input: replicated


def test_fingerprint_ignores_mesh_and_placements_but_not_shapes_dtypes_names():
    _, w = model()
    base = ShardLayout.from_arrays(w, "dp=2,tp=2", {"a": Placement.split(2, {0: "tp"})})
    assert base.fingerprint == ShardLayout.from_arrays(w).fingerprint
    assert base.fingerprint == base.with_placements("tp=4", {"b": Placement.split(2, {1: "tp"})}).fingerprint
    for change in ({**w, "d": w["d"][:2]}, {**w, "d": w["d"].astype(np.float64)},
                   {**{k: v for k, v in w.items() if k != "d"}, "e": w["d"]}):
        assert ShardLayout.from_arrays(change).fingerprint != base.fingerprint


def test_layout_of_a_per_rank_program_is_refused():
    g, _ = model()
    for v in g.values():
        v.placement = None
    with pytest.raises(CheckpointError, match=r"@m has a mesh but no placed value: it is a per-rank program"):
        ShardLayout.of(g)
    g.mesh = None  # a single-device graph: one rank holds everything
    layout = ShardLayout.of(g)
    assert layout.size == 1 and all(w.placement.is_replicated for w in layout.weights)


def test_partial_weight_is_refused():
    g, _ = model()
    g.inputs[1].placement = Placement(((), ()), partial=("tp",))
    with pytest.raises(CheckpointError, match=r"weight %a is placed as .*partial\(tp\).*all-reduce"):
        ShardLayout.of(g)


# --- save and reassemble ------------------------------------------------------------------

def test_load_full_is_bit_identical(saved):
    path, _, w = saved
    got = ck.load_full(path)
    assert list(got) == list(w)
    for name in w:
        assert same_bits(got[name], w[name]), name


def test_layout_of_files(saved):
    path, _, _ = saved
    assert ck.steps(path) == [1] and ck.latest_step(path) == 1
    assert (path / "latest").read_text().strip() == "1"
    assert sorted(os.listdir(path / "step-1")) == ["manifest.json", "rank-0.safetensors", "rank-1.safetensors",
                                                  "rank-2.safetensors", "rank-3.safetensors"]
    m = json.loads((path / "step-1" / "manifest.json").read_text())
    assert m["mesh"] == [["dp", 2], ["tp", 2]]
    a = m["weights"]["a"]
    assert a["placement"] == "[tp, -]" and a["shape"] == [8, 6] and a["dtype"] == "f32"
    # split over tp only: the dp=0 ranks (0 and 1) store it
    assert [(p["file"], p["start"], p["stop"]) for p in a["pieces"]] == [
        ("rank-0.safetensors", [0, 0], [4, 6]), ("rank-1.safetensors", [4, 0], [8, 6])]
    assert [p["file"] for p in m["weights"]["b"]["pieces"]] == [f"rank-{r}.safetensors" for r in range(4)]
    assert [p["file"] for p in m["weights"]["c"]["pieces"]] == ["rank-0.safetensors"]
    assert [p["file"] for p in m["weights"]["s"]["pieces"]] == ["rank-0.safetensors", "rank-2.safetensors"]


def test_replicated_pieces_are_stored_once(saved):
    path, _, w = saved
    data = 0
    for f in (path / "step-1").glob("rank-*.safetensors"):
        raw = f.read_bytes()
        data += len(raw) - 8 - int.from_bytes(raw[:8], "little")
    assert data == sum(a.nbytes for a in w.values())


# --- reshard on load ----------------------------------------------------------------------

TARGETS = [
    ("tp=4", {"a": Placement.split(2, {0: "tp"}), "b": Placement.split(2, {1: "tp"}), "s": Placement.split(2, {0: "tp"})}),
    ("dp=2", {"a": Placement.split(2, {1: "dp"}), "d": Placement.split(2, {0: "dp"})}),
    ("dp=4,tp=1", {"a": Placement.split(2, {0: "dp"}), "b": Placement.split(2, {1: ("tp", "dp")}),
                   "d": Placement.split(2, {0: "tp", 1: "dp"})}),
    ("tp=2,dp=2", {"b": Placement.split(2, {0: "tp", 1: "dp"}), "c": Placement.split(1, {0: "tp"})}),
    (None, {}),
]


@pytest.mark.parametrize("mesh, placements", TARGETS, ids=[str(m) for m, _ in TARGETS])
def test_load_reshards_onto_another_mesh(saved, mesh, placements):
    path, layout, w = saved
    target = layout.with_placements(mesh, placements)
    pieces = ck.load(path, target)
    assert len(pieces) == target.size
    m = target.mesh or Mesh.of("one=1")
    for r, got in enumerate(pieces):
        assert list(got) == list(w)
        for spec in target.weights:
            assert same_bits(got[spec.name], local_piece(w[spec.name], spec.placement, m, r)), (r, spec.name)
        one = ck.load(path, target, rank=r)
        assert all(same_bits(one[n], got[n]) for n in w)


def test_load_of_one_rank_reads_only_the_overlapping_pieces(saved, monkeypatch):
    path, layout, w = saved
    opened = []
    real = ck._ShardFile.__init__

    def spy(self, p):
        opened.append(p.name)
        real(self, p)

    monkeypatch.setattr(ck._ShardFile, "__init__", spy)
    # On the saved mesh, rank 1 (dp=0, tp=1) needs a's and b's pieces (its own file) and the
    # replicated and dp=0 pieces rank 0 stored; never the files of ranks 2 and 3.
    got = ck.load(path, layout, rank=1)
    assert sorted(opened) == ["rank-0.safetensors", "rank-1.safetensors"]
    for spec in layout.weights:
        assert same_bits(got[spec.name], local_piece(w[spec.name], spec.placement, layout.mesh, 1))


def test_a_rank_reads_only_the_rows_it_needs(tmp_path, monkeypatch):
    monkeypatch.setattr(ck, "CHUNK_BYTES", 16)  # one row of a f32[., 4] per chunk
    w = {"d": np.arange(32, dtype=np.float32).reshape(8, 4), "e": np.arange(8, dtype=np.float32).reshape(2, 4)}
    ck.save(tmp_path, 0, ShardLayout.from_arrays(w), [w])
    read = []
    real = ck._ShardFile.read_rows

    def spy(self, name, lo, hi):
        read.append((name, lo, hi))
        return real(self, name, lo, hi)

    monkeypatch.setattr(ck._ShardFile, "read_rows", spy)
    target = ShardLayout.from_arrays(w, "tp=4", {"d": Placement.split(2, {0: "tp"}), "e": Placement.split(2, {1: "tp"})})
    got = ck.load(tmp_path, target, rank=2)
    assert same_bits(got["d"], w["d"][4:6]) and same_bits(got["e"], w["e"][:, 2:3])
    assert read == [("d", 4, 5), ("d", 5, 6), ("e", 0, 1), ("e", 1, 2)]
    # a damaged chunk fails its checksum when, and only when, it is read
    f = tmp_path / "step-0" / "rank-0.safetensors"
    raw = bytearray(f.read_bytes())
    raw[8 + int.from_bytes(raw[:8], "little") + 7 * 16] ^= 0x40  # the first byte of row 7 of d
    f.write_bytes(bytes(raw))
    assert same_bits(ck.load(tmp_path, target, rank=0)["d"], w["d"][:2])
    with pytest.raises(CheckpointError, match=r"rank-0.safetensors: chunk 7 \(rows 7..8\) of weight 'd' fails its "
                                              r"checksum: the file is corrupt"):
        ck.load(tmp_path, target, rank=3)


def test_save_on_one_mesh_then_save_the_resharded_pieces_again(tmp_path):
    g, w = model()
    ck.save(tmp_path, 1, ShardLayout.of(g), shard_weights(g, w))
    target = ShardLayout.of(g).with_placements("tp=4", TARGETS[0][1])
    ck.save(tmp_path, 2, target, ck.load(tmp_path, target))
    assert ck.latest_step(tmp_path) == 2
    got = ck.load_full(tmp_path)
    assert all(same_bits(got[n], w[n]) for n in w)


MLP = """graph @mlp(%x: f32[8{x},16], %w1: f32[16,64{tp}] param, %b1: f32[64{tp}] param,
               %w2: f32[64{tp},16] param) -> (f32[8,16]) {mesh} {
  %a = matmul(%x, %w1) : f32[8,64]
  %b = add(%a, %b1) : f32[8,64]
  %h = relu(%b) : f32[8,64]
  %y = matmul(%h, %w2) : f32[8,16]
  return %y
}"""


def placed_mlp(mesh: str, x: str, tp: str):
    g = partita.parse(MLP.replace("{mesh}", mesh).replace("{x}", x).replace("{tp}", tp))
    propagate(g)
    return g


def test_a_megatron_checkpoint_runs_on_another_mesh(tmp_path):
    # Saved from tensor parallelism on mesh(dp=2, tp=2), loaded onto mesh(tp=4) and run there:
    # the per-rank programs on the loaded pieces compute the single-device MLP.
    saved = placed_mlp("mesh(dp=2, tp=2)", "@dp", "@tp")
    rng = np.random.default_rng(3)
    w = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in saved.inputs if v.role == "param"}
    x = rng.standard_normal((8, 16)).astype(np.float32)
    ck.save(tmp_path, 10, ShardLayout.of(saved), shard_weights(saved, w))
    target = placed_mlp("mesh(tp=4)", "", "@tp")
    layout = ShardLayout.of(target)
    assert layout.fingerprint == ShardLayout.of(saved).fingerprint
    outs = run_mesh(partition(target), target.mesh, [{"x": x}] * 4, ck.load(tmp_path, layout))
    want = partita.run(target, {"x": x}, w)[0]
    for r in range(4):
        np.testing.assert_allclose(outs[r][0], want, rtol=1e-5, atol=1e-5)


def test_ranks_write_concurrently_then_commit(tmp_path):
    g, w = model()
    layout = ShardLayout.of(g)
    shards = shard_weights(g, w)
    written = {}
    threads = [threading.Thread(target=lambda r=r: written.__setitem__(r, ck.write_shard(tmp_path, 5, layout, r, shards[r])))
               for r in reversed(range(4))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(written[r] is not None for r in range(4))
    ck.commit(tmp_path, 5, layout)
    got = ck.load_full(tmp_path)
    assert all(same_bits(got[n], w[n]) for n in w)


def test_a_rank_with_nothing_to_store_writes_no_file(tmp_path):
    w = {"r": np.arange(6, dtype=np.float32)}
    layout = ShardLayout.from_arrays(w, "dp=2")
    assert ck.write_shard(tmp_path, 0, layout, 1, w) is None
    ck.write_shard(tmp_path, 0, layout, 0, w)
    ck.commit(tmp_path, 0, layout)
    assert sorted(os.listdir(tmp_path / "step-0")) == ["manifest.json", "rank-0.safetensors"]
    assert same_bits(ck.load(tmp_path, layout, rank=1)["r"], w["r"])


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int64])
def test_round_trip_by_dtype(tmp_path, dtype):
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal((4, 6)) * 1000).astype(dtype)
    layout = ShardLayout.from_arrays({"w": arr}, "dp=2,tp=2", {"w": Placement.split(2, {0: "dp", 1: "tp"})})
    ck.save(tmp_path, 3, layout, [{"w": local_piece(arr, layout.weights[0].placement, layout.mesh, r)} for r in range(4)])
    got = ck.load_full(tmp_path, step=3)["w"]
    assert same_bits(got, arr)
    single = ck.load(tmp_path, layout.with_placements(None), rank=0)["w"]
    assert same_bits(single, arr)


def test_torch_tensors_are_saved_as_their_arrays(tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    layout = ShardLayout.from_arrays({"w": np.zeros((3, 4), ml_dtypes.bfloat16)})
    ck.save(tmp_path, 0, layout, [{"w": t}])
    got = ck.load_full(tmp_path)["w"]
    assert got.dtype == ml_dtypes.bfloat16 and got.astype(np.float32).tolist() == t.float().tolist()


# --- crashes mid-save ---------------------------------------------------------------------

def crash_on(monkeypatch, fn_owner, name, when):
    real = getattr(fn_owner, name)
    calls = []

    def boom(*args, **kwargs):
        calls.append(args)
        if when(len(calls), args):
            raise OSError(5, "simulated crash")
        return real(*args, **kwargs)

    monkeypatch.setattr(fn_owner, name, boom)


def assert_still_step_1(path, w):
    assert ck.steps(path) == [1] and ck.latest_step(path) == 1
    got = ck.load_full(path)
    assert all(same_bits(got[n], w[n]) for n in w)


def test_crash_while_writing_the_second_file_keeps_the_previous_step(saved, monkeypatch):
    path, layout, w = saved
    g, _ = model()
    w2 = {k: v + 1 if v.dtype != ml_dtypes.bfloat16 else v for k, v in w.items()}
    crash_on(monkeypatch, ck, "save_safetensors", lambda n, args: n == 2)
    with pytest.raises(OSError, match="simulated"):
        ck.save(path, 2, layout, shard_weights(g, w2))
    monkeypatch.undo()
    assert (path / "step-2.tmp").is_dir()
    assert_still_step_1(path, w)
    with pytest.raises(CheckpointError, match=r"step 2 was asked for, but .*step-2 does not exist; the committed steps are 1"):
        ck.load_full(path, step=2)
    # the next save cleans the unfinished one and commits
    ck.save(path, 3, layout, shard_weights(g, w2))
    assert not (path / "step-2.tmp").exists()
    assert ck.latest_step(path) == 3 and ck.steps(path) == [1, 3]
    assert same_bits(ck.load_full(path)["a"], w2["a"])


def test_crash_on_the_commit_rename_keeps_the_previous_step(saved, monkeypatch):
    path, layout, w = saved
    g, _ = model()
    crash_on(monkeypatch, os, "rename", lambda n, args: True)
    with pytest.raises(CheckpointError, match=r"cannot commit step 2 .*previous checkpoint is intact"):
        ck.save(path, 2, layout, shard_weights(g, w))
    monkeypatch.undo()
    assert_still_step_1(path, w)
    assert (path / "step-2.tmp" / "manifest.json").exists()  # written, never committed: ignored


def test_crash_before_latest_moves_keeps_latest_on_the_previous_step(saved, monkeypatch):
    path, layout, w = saved
    g, _ = model()
    crash_on(monkeypatch, os, "replace", lambda n, args: os.fspath(args[1]).endswith("latest"))
    with pytest.raises(CheckpointError, match=r"latest: cannot write \(simulated crash\): step 2 is committed in .*step-2, but latest still names "
                                              r"the previous step; load it with step=2"):
        ck.save(path, 2, layout, shard_weights(g, w))
    monkeypatch.undo()
    assert ck.latest_step(path) == 1 and ck.steps(path) == [1, 2]
    assert ck.read_manifest(path)["step"] == 1
    assert ck.read_manifest(path, step=2)["step"] == 2


def test_commit_before_every_rank_wrote(tmp_path):
    g, w = model()
    layout = ShardLayout.of(g)
    shards = shard_weights(g, w)
    for r in (0, 1, 3):
        ck.write_shard(tmp_path, 4, layout, r, shards[r])
    with pytest.raises(CheckpointError, match=r"rank-2.json is missing: rank 2 has not finished writing .*barrier"):
        ck.commit(tmp_path, 4, layout)
    assert ck.steps(tmp_path) == []


def test_stale_shard_of_another_layout_is_rejected_at_commit(tmp_path):
    g, w = model()
    layout = ShardLayout.of(g)
    other = layout.with_placements("dp=2,tp=2")
    # rank 0's file is left by a crashed save of the same step with every weight replicated
    ck.write_shard(tmp_path, 4, other, 0, w)
    for r in range(1, 4):
        ck.write_shard(tmp_path, 4, layout, r, shard_weights(g, w)[r])
    with pytest.raises(CheckpointError, match=r"rank-0.json: rank 0 did not write the piece of weight 'a' that the "
                                              r"layout asks for \(\[tp, -\]\)"):
        ck.commit(tmp_path, 4, layout)


# --- errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    (lambda w: {**w, "d": w["d"][:2]}, r"weight 'd' has shape \[4, 4\] in the checkpoint but \[2, 4\] in the model"),
    (lambda w: {**w, "s": w["s"].astype(np.int32)}, r"weight 's' is i64 in the checkpoint but i32 in the model"),
    (lambda w: {**w, "e": w["d"]}, r"the model's weight 'e' is not in the checkpoint"),
    (lambda w: {k: v for k, v in w.items() if k != "c"}, r"the checkpoint has weight 'c', which the model does not have"),
])
def test_checkpoint_of_another_model(saved, change, message):
    path, _, w = saved
    with pytest.raises(CheckpointError, match=r"step-1: the checkpoint is of another model .*" + message):
        ck.load(path, ShardLayout.from_arrays(change(w)), rank=0)


def test_missing_shard_file(saved):
    path, layout, _ = saved
    (path / "step-1" / "rank-1.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"rank-1.safetensors: shard file missing .*load another step"):
        ck.load_full(path)
    # a rank whose pieces are elsewhere still loads
    ck.load(path, layout, rank=2)


@pytest.mark.parametrize("damage, message", [
    (lambda raw: raw[:len(raw) - 5], r"tensor '.*' has data offsets .* truncated"),
    (lambda raw: raw[:3], r"corrupt shard file \(only 3 bytes\)"),
    (lambda raw: raw[:8] + b"{not json" + raw[17:], r"corrupt shard file \(unreadable header"),
    (lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]), r"fails its checksum"),
])
def test_corrupt_shard_file(saved, damage, message):
    path, _, _ = saved
    f = path / "step-1" / "rank-0.safetensors"
    f.write_bytes(damage(f.read_bytes()))
    with pytest.raises(CheckpointError, match=r"rank-0.safetensors: .*" + message):
        ck.load_full(path)


def test_missing_or_corrupt_manifest(saved):
    path, _, _ = saved
    m = path / "step-1" / "manifest.json"
    doc = json.loads(m.read_text())
    doc["weights"]["a"]["shape"] = [9, 6]
    m.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=r"manifest.json: corrupt manifest \(its fingerprint does not match"):
        ck.load_full(path)
    m.write_text("{")
    with pytest.raises(CheckpointError, match=r"manifest.json: corrupt manifest"):
        ck.load_full(path)
    m.unlink()
    with pytest.raises(CheckpointError, match=r"manifest.json is missing: .*step-1 is not a committed"):
        ck.load_full(path)


def test_no_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match=r"no checkpoint in .*nowhere: the directory does not exist"):
        ck.load_full(tmp_path / "nowhere")
    (tmp_path / "step-3.tmp").mkdir()
    with pytest.raises(CheckpointError, match=r"no checkpoint in .*: it has no step-<N> directory \(step-3.tmp is an "
                                              r"unfinished save"):
        ck.load_full(tmp_path)
    assert isinstance(CheckpointError("x"), WeightsError) and issubclass(CheckpointError, PartitaError)


def test_latest_pointing_nowhere(saved):
    path, _, _ = saved
    (path / "latest").write_text("9\n")
    with pytest.raises(CheckpointError, match=r"latest points at step 9, but .*step-9 does not exist; the committed steps are 1"):
        ck.load_full(path)
    (path / "latest").unlink()
    assert ck.latest_step(path) == 1  # without the pointer: the highest committed step
    ck.load_full(path)


def test_a_committed_step_is_never_overwritten(saved):
    path, layout, w = saved
    g, _ = model()
    with pytest.raises(CheckpointError, match=r"step-1 already exists: checkpoints are never overwritten"):
        ck.save(path, 1, layout, shard_weights(g, w))


def test_bad_local_weights(tmp_path):
    g, w = model()
    layout = ShardLayout.of(g)
    shard = shard_weights(g, w)[0]
    with pytest.raises(CheckpointError, match=r"rank 0: weight 'a' is f32\[8, 6\] but its piece under \[tp, -\] on "
                                              r"mesh\(dp=2, tp=2\) is f32\[4, 6\]"):
        ck.write_shard(tmp_path, 0, layout, 0, {**shard, "a": w["a"]})
    with pytest.raises(CheckpointError, match=r"rank 0: local_weights lacks weight 'b'"):
        ck.write_shard(tmp_path, 0, layout, 0, {k: v for k, v in shard.items() if k != "b"})
    with pytest.raises(CheckpointError, match=r"weight 'zz' is not a param/state of the checkpoint layout"):
        ck.write_shard(tmp_path, 0, layout, 0, {**shard, "zz": w["a"]})
    with pytest.raises(CheckpointError, match=r"rank 4 is outside mesh\(dp=2, tp=2\)"):
        ck.write_shard(tmp_path, 0, layout, 4, shard)
    with pytest.raises(CheckpointError, match=r"save got the weights of 1 rank\(s\) but mesh\(dp=2, tp=2\) has 4"):
        ck.save(tmp_path, 0, layout, [shard])
    with pytest.raises(CheckpointError, match=r"does not exist: no rank wrote step 7"):
        ck.commit(tmp_path, 7, layout)
