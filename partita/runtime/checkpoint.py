"""Sharded checkpoints: every rank saves only its own pieces; any mesh loads them back.

A checkpoint directory holds one subdirectory per saved step and a ``latest`` pointer::

    ckpt/
      latest                     "7": the last committed step
      step-7/
        manifest.json            model fingerprint, mesh, and per weight: global shape, dtype,
                                 placement, and which file holds which piece (index range,
                                 crc32 per chunk of rows)
        rank-0.safetensors       the pieces rank 0 stored (one tensor per weight, named as it)
        rank-1.safetensors
        ...

Saving has two phases. ``write_shard`` (every rank, in parallel) writes the rank's pieces
into ``step-<N>.tmp/``; a piece replicated over some mesh axes is written only by the rank
whose coordinate along those axes is 0, so nothing is stored twice. ``commit`` (rank 0, once
every rank has written: after a barrier in a multi-process run) checks the shards, writes the
manifest, renames ``step-<N>.tmp`` to ``step-<N>`` (the commit point: a directory rename is
atomic) and then replaces ``latest``. A crash anywhere before the rename leaves only a
``.tmp`` directory, which loads ignore, and the previous checkpoint and ``latest`` untouched.

Loading reshards: ``load`` cuts each rank's piece for any mesh and placements out of the
stored pieces, reading only the stored pieces that overlap it, and of those only the chunks
of leading-dim rows that overlap (a chunk is about ``CHUNK_BYTES``; each has its crc32 in
the manifest, checked on read). A rank of a larger mesh thus reads about its share of the
checkpoint when the new split is on a leading dim; a split on a later dim reads the whole
rows. ``load_full`` reassembles the global arrays.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import struct
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..backend.common import as_numpy
from ..ir.diagnostics import WeightsError
from ..ir.dtypes import DType, DTYPES, from_numpy
from ..ir.graph import Graph, input_name
from ..ir.weights import DTYPE_OF_SAFETENSORS_NAME, save_safetensors
from ..ir.mesh import Mesh
from ..ir.placement import Placement

__all__ = ["CheckpointError", "ShardLayout", "WeightSpec", "commit", "latest_step", "load", "load_full",
           "model_fingerprint", "read_manifest", "save", "stage_dir", "stage_dirs", "steps", "write_shard"]

FORMAT = "partita-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
LATEST = "latest"
# Stored pieces are checksummed, and read back, in chunks of whole leading-dim rows of
# about this many bytes: big enough that the manifest stays small, small enough that a rank
# reading its slice of a replicated weight reads little more than the slice.
CHUNK_BYTES = 32 << 20
_STEP_RE = re.compile(r"step-(\d+)\Z")
_TMP_RE = re.compile(r"step-(\d+)\.tmp\Z")

Bounds = tuple[tuple[int, int], ...]


class CheckpointError(WeightsError):
    """A checkpoint that cannot be written or read as asked: another model's checkpoint, a
    missing or damaged file, no checkpoint at all. The message names the file or weight."""


# --- the layout ---------------------------------------------------------------------------

@dataclass(frozen=True)
class WeightSpec:
    """One param/state tensor of a model: its global shape and dtype, and how it is placed.

    ``padded``: the global shape the ranks hold when some dims are padded so that the mesh
    splits them (a padded vocabulary, ``partita.parallel.pad``), else None. The checkpoint
    stores the real entries only, so it loads onto a mesh that pads differently (or not)."""

    name: str
    shape: tuple[int, ...]
    dtype: DType
    placement: Placement
    padded: tuple[int, ...] | None = None

    @property
    def held_shape(self) -> tuple[int, ...]:
        """The global shape the placement cuts (padded, where padded)."""
        return self.padded if self.padded is not None else self.shape


@dataclass(frozen=True)
class ShardLayout:
    """What a checkpoint must agree on: the mesh (None: one device) and each weight's
    global shape, dtype and placement. Build it with ``ShardLayout.of(global_graph)``."""

    mesh: Mesh | None
    weights: tuple[WeightSpec, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for w in self.weights:
            if w.name in seen:
                raise CheckpointError(f"weight '{w.name}' appears twice in the layout; names identify weights")
            seen.add(w.name)
            p = w.placement
            if p.partial:
                raise CheckpointError(
                    f"weight '{w.name}' is placed as {p}, a pending sum over {', '.join(p.partial)}: its "
                    f"ranks hold summands, not pieces, so there is nothing to save; all-reduce it (or place "
                    f"it replicated or split) before checkpointing")
            if self.mesh is None:
                if any(p.dims):
                    raise CheckpointError(f"weight '{w.name}' is placed as {p} but the layout has no mesh; "
                                          f"give the layout the mesh the placement refers to")
                if p.rank != len(w.shape):
                    raise CheckpointError(f"the placement of weight '{w.name}' has {p.rank} dim(s) but its "
                                          f"shape {list(w.shape)} has {len(w.shape)}")
            else:
                p.validate(w.held_shape, self.mesh, f"weight '{w.name}'")

    # --- construction -------------------------------------------------------------------
    @classmethod
    def of(cls, graph: Graph, padding: "Mapping[str, Mapping[int, int]] | None" = None) -> "ShardLayout":
        """The layout of a global graph's param and state inputs: ``graph.mesh`` and each
        input's placement (an unplaced input is replicated; a graph without a mesh is one
        device). A partial placement is a CheckpointError. ``padding``: inputs whose dims
        are padded, name -> {dim: real size} (``ParallelProgram.padding.inputs``)."""
        if graph.mesh is not None and all(v.placement is None for v in graph.values()):
            # A per-rank program has a mesh but no placements: its local shapes would be taken
            # for global ones and every rank's pieces for replicas that rank 0 alone stores.
            raise CheckpointError(
                f"@{graph.name} has a mesh but no placed value: it is a per-rank program or has not been "
                f"propagated; build the layout from the placed global graph (after propagate)")
        specs = []
        for v in graph.inputs:
            if v.role not in ("param", "state"):
                continue
            p = v.placement if v.placement is not None else Placement.replicated(len(v.type.shape))
            if p.partial:
                raise CheckpointError(
                    f"@{graph.name}: weight %{v.name} is placed as {p}, a pending sum over "
                    f"{', '.join(p.partial)}: a checkpoint stores pieces, not summands; place it replicated "
                    f"or split (all-reduce it first) before building the checkpoint layout")
            name = input_name(v)
            pads = (padding or {}).get(name)
            if pads:
                real = tuple(pads.get(d, n) for d, n in enumerate(v.type.shape))
                specs.append(WeightSpec(name, real, v.type.dtype, p, tuple(v.type.shape)))
            else:
                specs.append(WeightSpec(name, tuple(v.type.shape), v.type.dtype, p))
        return cls(graph.mesh, tuple(specs))

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any], mesh: "Mesh | str | None" = None,
                    placements: Mapping[str, Placement] | None = None) -> "ShardLayout":
        """The layout of global ``arrays`` (name -> array: shapes and dtypes) on ``mesh``,
        with ``placements`` by name (missing names: replicated)."""
        m = None if mesh is None else Mesh.of(mesh)
        placements = dict(placements or {})
        unknown = sorted(set(placements) - set(arrays))
        if unknown:
            raise CheckpointError(f"placements name weight '{unknown[0]}', which is not among the arrays "
                                  f"({', '.join(arrays) or 'none'})")
        specs = []
        for name, a in arrays.items():
            arr = as_numpy(a)
            try:
                dt = from_numpy(arr.dtype)
            except KeyError:
                raise CheckpointError(f"weight '{name}' has dtype {arr.dtype}, which partita does not support") from None
            p = placements.get(name, Placement.replicated(arr.ndim))
            specs.append(WeightSpec(name, tuple(arr.shape), dt, p))
        return cls(m, tuple(specs))

    def with_placements(self, mesh: "Mesh | str | None",
                        placements: Mapping[str, Placement] | None = None) -> "ShardLayout":
        """The same model on another mesh, with ``placements`` by name (missing: replicated)."""
        placements = dict(placements or {})
        unknown = sorted(set(placements) - set(self.names))
        if unknown:
            raise CheckpointError(f"placements name weight '{unknown[0]}', which the layout does not have; "
                                  f"its weights are {', '.join(self.names) or 'none'}")
        m = None if mesh is None else Mesh.of(mesh)
        return ShardLayout(m, tuple(
            WeightSpec(w.name, w.shape, w.dtype, placements.get(w.name, Placement.replicated(len(w.shape))))
            for w in self.weights))

    # --- facts --------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(w.name for w in self.weights)

    @property
    def size(self) -> int:
        """The number of ranks."""
        return 1 if self.mesh is None else self.mesh.size

    @property
    def fingerprint(self) -> str:
        """Identifies the model: a hash of the weights' names, global shapes and dtypes (not
        of the mesh or the placements, which a load may change)."""
        return model_fingerprint((w.name, w.shape, w.dtype.name) for w in self.weights)

    @property
    def mesh_text(self) -> str:
        return "single device" if self.mesh is None else str(self.mesh)

    def check_rank(self, rank: int) -> None:
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.size:
            raise CheckpointError(f"rank {rank!r} is outside {self.mesh_text}, which has {self.size} rank(s)")

    def bounds(self, w: WeightSpec, rank: int) -> Bounds:
        """The index range ``((start, stop), ...)`` per dim of the piece of ``w`` on ``rank``
        (split dims cut major axis first, as ``partition.local_piece`` cuts them), of the
        real entries: a padded dim's range stops at the real size."""
        out = []
        for n, held, axes in zip(w.shape, w.held_shape, w.placement.dims):
            k, pieces = 0, 1
            for a in axes:
                assert self.mesh is not None
                size = self.mesh.axis_size(a)
                k = k * size + self.mesh.coord(rank, a)
                pieces *= size
            step = held // pieces
            out.append((min(k * step, n), min((k + 1) * step, n)))
        return tuple(out)

    def local_shape(self, w: WeightSpec) -> tuple[int, ...]:
        """The shape of the piece of ``w`` each rank holds (padding included)."""
        out = []
        for held, axes in zip(w.held_shape, w.placement.dims):
            pieces = 1
            for a in axes:
                assert self.mesh is not None
                pieces *= self.mesh.axis_size(a)
            out.append(held // pieces)
        return tuple(out)

    def stores(self, w: WeightSpec, rank: int) -> bool:
        """Whether ``rank`` writes its piece of ``w``: of the ranks that hold the same piece
        (those that differ only along axes that do not split ``w``), the one at coordinate 0."""
        if self.mesh is None:
            return rank == 0
        used = set(w.placement.axes_used())
        return all(c == 0 for a, c in zip(self.mesh.names, self.mesh.coords(rank)) if a not in used)


def model_fingerprint(entries) -> str:
    """The hash of ``(name, shape, dtype name)`` entries, order-independent."""
    canon = sorted([str(n), [int(d) for d in s], str(dt)] for n, s, dt in entries)
    return hashlib.sha256(json.dumps(canon, separators=(",", ":")).encode()).hexdigest()[:32]


# --- saving -------------------------------------------------------------------------------

def write_shard(ckpt_dir: "str | os.PathLike", step: int, layout: ShardLayout, rank: int,
                local_weights: Mapping[str, Any]) -> Path | None:
    """Write ``rank``'s pieces (``local_weights``: name -> its local array, NumPy or torch)
    into ``<ckpt_dir>/step-<step>.tmp/rank-<rank>.safetensors``. Only the pieces this rank
    stores are written (see ``ShardLayout.stores``); returns the file, or None when every
    piece of the rank is stored by another rank. Call ``commit`` once all ranks are done."""
    root = Path(ckpt_dir)
    _check_step(step)
    layout.check_rank(rank)
    final = root / f"step-{step}"
    if final.exists():
        raise CheckpointError(f"{final} already exists: checkpoints are never overwritten; save under a new "
                              f"step or delete that directory first")
    known = set(layout.names)
    extra = [n for n in local_weights if n not in known]
    if extra:
        raise CheckpointError(f"rank {rank}: weight '{extra[0]}' is not a param/state of the checkpoint layout "
                              f"(its weights are {', '.join(layout.names) or 'none'}); build the layout from the "
                              f"graph these weights belong to")
    arrays: dict[str, np.ndarray] = {}
    pieces: dict[str, dict] = {}
    for w in layout.weights:
        b = layout.bounds(w, rank)
        writes = layout.stores(w, rank)
        if w.name not in local_weights:
            if writes:
                raise CheckpointError(f"rank {rank}: local_weights lacks weight '{w.name}', whose piece this "
                                      f"rank stores; pass every param/state piece the rank holds")
            continue
        arr = as_numpy(local_weights[w.name])
        want = layout.local_shape(w)
        if tuple(arr.shape) != want or arr.dtype != w.dtype.np:
            got_dt = _dtype_name(arr.dtype)
            raise CheckpointError(
                f"rank {rank}: weight '{w.name}' is {got_dt}{list(arr.shape)} but its piece under {w.placement} "
                f"on {layout.mesh_text} is {w.dtype.name}{list(want)}; pass the rank's local piece "
                f"(shard_weights cuts them)")
        if writes:
            if w.padded is not None:  # only the real entries are stored
                arr = arr[tuple(slice(0, e - s) for s, e in b)]
            arr = np.ascontiguousarray(arr).reshape(arr.shape)  # ascontiguousarray makes a scalar 1-D
            arrays[w.name] = arr
            pieces[w.name] = {"start": [s for s, _ in b], "stop": [e for _, e in b],
                              "placement": str(w.placement), **_chunk_crcs(arr)}
    if not arrays:
        return None
    tmp = root / f"step-{step}.tmp"
    try:
        tmp.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"{tmp}: cannot create the checkpoint directory ({e.strerror or e})") from None
    path = tmp / f"rank-{rank}.safetensors"
    save_safetensors(path, arrays)
    # The receipt is written last: its presence tells commit the rank's file is complete, and
    # its content lets commit reject a stale file left by a crashed save of another layout.
    _write_json_atomic(tmp / f"rank-{rank}.json", {"step": step, "rank": rank, "fingerprint": layout.fingerprint,
                                                   "mesh": layout.mesh_text, "pieces": pieces})
    return path


def commit(ckpt_dir: "str | os.PathLike", step: int, layout: ShardLayout) -> Path:
    """Finish a save once every rank's ``write_shard`` returned: check the shards, write the
    manifest, rename ``step-<N>.tmp`` to ``step-<N>`` and point ``latest`` at it. Called
    once (rank 0; after a barrier in a multi-process run). Returns the step directory."""
    root = Path(ckpt_dir)
    _check_step(step)
    tmp = root / f"step-{step}.tmp"
    final = root / f"step-{step}"
    if final.exists():
        raise CheckpointError(f"{final} already exists: checkpoints are never overwritten; save under a new "
                              f"step or delete that directory first")
    if not tmp.is_dir():
        raise CheckpointError(f"{tmp} does not exist: no rank wrote step {step}; call write_shard on every rank "
                              f"before commit")
    receipts: dict[int, dict] = {}
    weights: dict[str, dict] = {}
    for w in layout.weights:
        pieces: list[dict] = []
        for r in range(layout.size):
            if not layout.stores(w, r):
                continue
            if r not in receipts:
                receipts[r] = _read_receipt(tmp, r, step, layout)
            got = receipts[r]["pieces"].get(w.name)
            b = layout.bounds(w, r)
            want = {"start": [s for s, _ in b], "stop": [e for _, e in b], "placement": str(w.placement)}
            if not isinstance(got, dict) or any(got.get(k) != v for k, v in want.items()):
                raise CheckpointError(f"{tmp / f'rank-{r}.json'}: rank {r} did not write the piece of weight "
                                      f"'{w.name}' that the layout asks for ({w.placement}); every rank must "
                                      f"save with the same layout")
            pieces.append({"file": f"rank-{r}.safetensors", **want, "chunk_rows": got.get("chunk_rows"),
                           "crc32": got.get("crc32")})
        weights[w.name] = {"shape": list(w.shape), "dtype": w.dtype.name, "placement": str(w.placement),
                           "split": [list(a) for a in w.placement.dims], "pieces": pieces}
    for r in receipts:
        _check_shard_header(tmp / f"rank-{r}.safetensors", layout, r)
    expected = {f"rank-{r}.safetensors" for r in receipts} | {f"rank-{r}.json" for r in receipts}
    for leftover in tmp.iterdir():
        # Leftovers of a crashed save of this step with another layout: not part of this one.
        if leftover.name not in expected:
            _remove(leftover)
    manifest = {"format": FORMAT, "version": VERSION, "step": step, "fingerprint": layout.fingerprint,
                "mesh": None if layout.mesh is None else [[n, s] for n, s in layout.mesh.axes],
                "mesh_text": layout.mesh_text, "weights": weights}
    try:
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        os.rename(tmp, final)
    except OSError as e:
        raise CheckpointError(f"{final}: cannot commit step {step} ({e.strerror or e}); the previous checkpoint "
                              f"is intact") from None
    _fsync_dir(root)
    for r in receipts:
        _remove(final / f"rank-{r}.json")
    try:
        _write_text_atomic(root / LATEST, f"{step}\n")
    except CheckpointError as e:
        raise CheckpointError(f"{e}: step {step} is committed in {final}, but {LATEST} still names the previous "
                              f"step; load it with step={step}, or write {step} into {root / LATEST}") from None
    for old in root.iterdir():
        m = _TMP_RE.match(old.name)
        # Only older unfinished saves are removed: a later step's .tmp may be a save in flight.
        if m and int(m.group(1)) <= step and old.is_dir():
            _remove(old)
    return final


def save(ckpt_dir: "str | os.PathLike", step: int, layout: ShardLayout,
         shards_by_rank: Sequence[Mapping[str, Any]]) -> Path:
    """Save every rank's pieces from one process (``shards_by_rank[r]``: rank r's local
    weights, as ``shard_weights`` returns them) and commit. Returns the step directory."""
    if len(shards_by_rank) != layout.size:
        raise CheckpointError(f"save got the weights of {len(shards_by_rank)} rank(s) but {layout.mesh_text} has "
                              f"{layout.size}; pass one dict of local pieces per rank")
    _check_step(step)
    stale = Path(ckpt_dir) / f"step-{step}.tmp"
    if stale.exists():
        _remove(stale)
    for r, shard in enumerate(shards_by_rank):
        write_shard(ckpt_dir, step, layout, r, shard)
    return commit(ckpt_dir, step, layout)


# --- loading ------------------------------------------------------------------------------

# A pipeline's checkpoint is one checkpoint per stage, ``stage-<p>/``, each over its stage's
# ranks (every stage saves only its own params); a weight two stages share is in both. The
# functions below read such a directory as one: its steps are those every stage committed.
_STAGE_RE = re.compile(r"^stage-(\d+)$")


def stage_dir(ckpt_dir: "str | os.PathLike", stage: int) -> Path:
    """Where pipeline stage ``stage`` saves its checkpoint inside ``ckpt_dir``."""
    return Path(ckpt_dir) / f"stage-{stage}"


def stage_dirs(ckpt_dir: "str | os.PathLike") -> list[Path]:
    """The stage checkpoints of a pipeline checkpoint, by stage (empty for any other)."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = sorted((int(m.group(1)), f) for f in root.iterdir() if (m := _STAGE_RE.match(f.name)) and f.is_dir())
    return [f for _, f in found]


def steps(ckpt_dir: "str | os.PathLike") -> list[int]:
    """The committed steps in ``ckpt_dir`` (``step-<N>`` directories), ascending; of a
    pipeline checkpoint, the steps every stage committed."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    stages = stage_dirs(root)
    if stages:
        common = set(steps(stages[0]))
        for d in stages[1:]:
            common &= set(steps(d))
        return sorted(common)
    return sorted(int(m.group(1)) for f in root.iterdir() if (m := _STEP_RE.match(f.name)) and f.is_dir())


def latest_step(ckpt_dir: "str | os.PathLike") -> int | None:
    """The step ``latest`` points at (without it, the highest committed step), or None; of
    a pipeline checkpoint, the latest step every stage committed."""
    root = Path(ckpt_dir)
    stages = stage_dirs(root)
    if stages:
        latest = [latest_step(d) for d in stages]
        if any(x is None for x in latest):
            return None
        common = [x for x in steps(root) if x <= min(x for x in latest if x is not None)]
        return common[-1] if common else None
    pointer = root / LATEST
    if pointer.exists():
        text = pointer.read_text().strip()
        if not text.isdigit():
            raise CheckpointError(f"{pointer}: corrupt pointer {text[:40]!r} (expected a step number); write the "
                                  f"step to load into it, or delete it to load the highest step")
        return int(text)
    found = steps(root)
    return found[-1] if found else None


def read_manifest(ckpt_dir: "str | os.PathLike", step: int | None = None) -> dict:
    """The manifest of ``step`` (default: the latest), checked for form (of a pipeline
    checkpoint: its first stage's, whose ``step`` is the pipeline's)."""
    stages = stage_dirs(ckpt_dir)
    if stages:
        return _Checkpoint.open(stages[0], latest_step(ckpt_dir) if step is None else step).manifest
    return _Checkpoint.open(ckpt_dir, step).manifest


def load_full(ckpt_dir: "str | os.PathLike", step: int | None = None) -> dict[str, np.ndarray]:
    """The global arrays of ``step`` (default: the latest), reassembled bit-exactly (of a
    pipeline checkpoint: every stage's; a weight two stages share is bit-identical in both)."""
    stages = stage_dirs(ckpt_dir)
    if stages:
        at = latest_step(ckpt_dir) if step is None else step
        if at is None:
            raise CheckpointError(f"{ckpt_dir}: no step that every pipeline stage ({len(stages)}) committed; a save "
                                  "was interrupted before the last stage committed: resume from an earlier run's "
                                  "checkpoint")
        out: dict[str, np.ndarray] = {}
        for d in stages:
            for k, v in load_full(d, at).items():
                out.setdefault(k, v)
        return out
    ck = _Checkpoint.open(ckpt_dir, step)
    return {name: ck.assemble(name, tuple((0, n) for n in e["shape"])) for name, e in ck.manifest["weights"].items()}


def load(ckpt_dir: "str | os.PathLike", layout: ShardLayout, rank: int | None = None,
         step: int | None = None) -> "dict[str, np.ndarray] | list[dict[str, np.ndarray]]":
    """``rank``'s pieces under ``layout`` (whose mesh and placements may differ from the
    saved ones: the pieces are recut), or every rank's as a list when ``rank`` is None.
    The checkpoint must be of the same model (names, global shapes, dtypes)."""
    ck = _Checkpoint.open(ckpt_dir, step)
    ck.check_model(layout)
    ranks = range(layout.size) if rank is None else [rank]
    if rank is not None:
        layout.check_rank(rank)
    out = [{w.name: _held_piece(ck.assemble(w.name, layout.bounds(w, r)), layout, w) for w in layout.weights}
           for r in ranks]
    return out if rank is None else out[0]


def _held_piece(real: np.ndarray, layout: ShardLayout, w: WeightSpec) -> np.ndarray:
    """A rank's piece of real entries, padded with zeros to the shape the rank holds."""
    if w.padded is None:
        return real
    want = layout.local_shape(w)
    return np.pad(real, [(0, h - n) for h, n in zip(want, real.shape)])


class _Checkpoint:
    """One committed step being read: its manifest and the shard files opened so far."""

    def __init__(self, directory: Path, manifest: dict) -> None:
        self.dir = directory
        self.manifest = manifest
        self.files: dict[str, _ShardFile] = {}
        self.chunks: dict[tuple[str, str, int], np.ndarray] = {}

    @classmethod
    def open(cls, ckpt_dir: "str | os.PathLike", step: int | None) -> "_Checkpoint":
        root = Path(ckpt_dir)
        if not root.is_dir():
            raise CheckpointError(f"no checkpoint in {root}: the directory does not exist; check the path")
        if step is None:
            step = latest_step(root)
            if step is None:
                unfinished = sorted(f.name for f in root.iterdir() if _TMP_RE.match(f.name))
                note = (f" ({', '.join(unfinished)} {'is an unfinished save' if len(unfinished) == 1 else 'are unfinished saves'}, "
                        f"never committed)") if unfinished else ""
                raise CheckpointError(f"no checkpoint in {root}: it has no step-<N> directory{note}; save one "
                                      f"first or point at the right directory")
            where = f"{root / LATEST} points at step {step}, but"
        else:
            _check_step(step)
            where = f"step {step} was asked for, but"
        d = root / f"step-{step}"
        if not d.is_dir():
            have = steps(root)
            raise CheckpointError(f"{where} {d} does not exist; the committed steps are "
                                  f"{', '.join(map(str, have)) or 'none'}")
        path = d / MANIFEST
        if not path.exists():
            raise CheckpointError(f"{path} is missing: {d} is not a committed partita checkpoint (a save writes the "
                                  f"manifest last); load another step (committed: {', '.join(map(str, steps(root)))})")
        try:
            manifest = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: corrupt manifest ({e}); load another step") from None
        _check_manifest(manifest, path)
        return cls(d, manifest)

    def check_model(self, layout: ShardLayout) -> None:
        """Raise unless the checkpoint holds exactly ``layout``'s weights (names, shapes, dtypes)."""
        saved = self.manifest["weights"]
        problem = None
        for w in layout.weights:
            e = saved.get(w.name)
            if e is None:
                problem = f"the model's weight '{w.name}' is not in the checkpoint"
            elif tuple(e["shape"]) != w.shape:
                problem = f"weight '{w.name}' has shape {e['shape']} in the checkpoint but {list(w.shape)} in the model"
            elif e["dtype"] != w.dtype.name:
                problem = f"weight '{w.name}' is {e['dtype']} in the checkpoint but {w.dtype.name} in the model"
            if problem:
                break
        if problem is None:
            extra = [n for n in saved if n not in set(layout.names)]
            if extra:
                problem = f"the checkpoint has weight '{extra[0]}', which the model does not have"
        if problem is not None:
            raise CheckpointError(f"{self.dir}: the checkpoint is of another model (fingerprint "
                                  f"{self.manifest['fingerprint']}, the model's {layout.fingerprint}): {problem}; "
                                  f"load it into the model it was saved from")

    def read_rows(self, name: str, piece: dict, lo: int, hi: int) -> np.ndarray:
        """Rows ``[lo, hi)`` (along dim 0, piece coordinates) of a stored piece, read and
        checked chunk by chunk; a scalar piece is one chunk."""
        file = piece["file"]
        if file not in self.files:
            self.files[file] = _ShardFile(self.dir / file)
        f = self.files[file]
        dt, shape, _, _ = f.entry(name)
        want = tuple(e - s for s, e in zip(piece["start"], piece["stop"]))
        if shape != want:
            raise CheckpointError(f"{f.path}: weight '{name}' is stored as {list(shape)}, but the manifest says "
                                  f"{list(want)}: the checkpoint is damaged; load another step")
        if not shape:
            return self.chunk(f, name, piece, 0, 0, 1)
        rows = shape[0]
        step = piece["chunk_rows"]
        parts = [self.chunk(f, name, piece, c, c * step, min(rows, (c + 1) * step))
                 for c in range(lo // step, -(-hi // step))]
        first = (lo // step) * step
        return np.concatenate(parts)[lo - first:hi - first]

    def chunk(self, f: "_ShardFile", name: str, piece: dict, c: int, lo: int, hi: int) -> np.ndarray:
        key = (piece["file"], name, c)
        if key not in self.chunks:
            arr = f.read_rows(name, lo, hi)
            if _crc32(arr) != piece["crc32"][c]:
                raise CheckpointError(f"{f.path}: chunk {c} (rows {lo}..{hi}) of weight '{name}' fails its checksum: "
                                      f"the file is corrupt; load another step")
            self.chunks[key] = arr
        return self.chunks[key]

    def assemble(self, name: str, target: Bounds) -> np.ndarray:
        """The region ``target`` of weight ``name``, copied from the stored rows overlapping it."""
        e = self.manifest["weights"][name]
        out = np.empty(tuple(b - a for a, b in target), dtype=DTYPES[e["dtype"]].np)
        if out.size == 0:
            return out
        covered = 0
        for piece in e["pieces"]:
            inter = [(max(a, s), min(b, t)) for (a, b), s, t in zip(target, piece["start"], piece["stop"])]
            if any(lo >= hi for lo, hi in inter):
                continue
            local = [(lo - s, hi - s) for (lo, hi), s in zip(inter, piece["start"])]
            if local:
                rows = self.read_rows(name, piece, *local[0])
                src = (slice(None),) + tuple(slice(lo, hi) for lo, hi in local[1:])
            else:
                rows, src = self.read_rows(name, piece, 0, 1), ()
            dst = tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(inter, target))
            out[dst] = rows[src]
            covered += math.prod(hi - lo for lo, hi in inter)
        if covered != out.size:
            raise CheckpointError(f"{self.dir / MANIFEST}: the stored pieces of weight '{name}' cover {covered} of "
                                  f"the {out.size} elements asked for: the manifest is damaged; load another step")
        return out


class _ShardFile:
    """A safetensors file read one tensor at a time: the header first, then only the bytes
    of the tensors asked for."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.exists():
            raise CheckpointError(f"{path}: shard file missing (the manifest lists it); the checkpoint is "
                                  f"incomplete, so load another step")
        try:
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise self.corrupt(f"only {len(head)} bytes")
                (n,) = struct.unpack("<Q", head)
                self.size = os.fstat(f.fileno()).st_size
                if 8 + n > self.size:
                    raise self.corrupt(f"a header of {n} bytes runs past the end of the file ({self.size} bytes)")
                header = json.loads(f.read(n))
        except OSError as e:
            raise CheckpointError(f"{path}: cannot read the shard file ({e.strerror or e})") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self.corrupt(f"unreadable header: {e}") from None
        if not isinstance(header, dict):
            raise self.corrupt("the header is not a JSON object")
        self.data_start = 8 + n
        self.header = header

    def corrupt(self, why: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: corrupt shard file ({why}); the checkpoint is damaged, so load "
                               f"another step")

    def entry(self, name: str) -> tuple[DType, tuple[int, ...], int, int]:
        info = self.header.get(name)
        if info is None:
            raise self.corrupt(f"no tensor '{name}', which the manifest says it holds")
        try:
            dt = DTYPES[DTYPE_OF_SAFETENSORS_NAME[info["dtype"]]]
            shape = tuple(int(d) for d in info["shape"])
            start, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise self.corrupt(f"tensor '{name}' has an invalid entry {info!r}") from None
        if any(d < 0 for d in shape) or not 0 <= start <= end or end - start != math.prod(shape) * dt.itemsize \
                or self.data_start + end > self.size:
            raise self.corrupt(f"tensor '{name}' has data offsets {start}..{end} that do not fit its shape "
                               f"{list(shape)} or the file ({self.size} bytes): truncated")
        return dt, shape, start, end

    def read_rows(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Rows ``[lo, hi)`` along dim 0 of tensor ``name`` (a scalar: the whole tensor),
        reading only their bytes."""
        dt, shape, start, end = self.entry(name)
        row_bytes = math.prod(shape[1:]) * dt.itemsize
        if shape:
            start, end, shape = start + lo * row_bytes, start + hi * row_bytes, (hi - lo,) + shape[1:]
        try:
            with open(self.path, "rb") as f:
                f.seek(self.data_start + start)
                raw = f.read(end - start)
        except OSError as e:
            raise CheckpointError(f"{self.path}: cannot read the shard file ({e.strerror or e})") from None
        if len(raw) != end - start:
            raise self.corrupt(f"tensor '{name}' is cut short: truncated")
        arr = np.frombuffer(raw, dtype=dt.np.newbyteorder("<") if dt.itemsize > 1 else dt.np)
        return arr.astype(dt.np, copy=True).reshape(shape)


# --- helpers ------------------------------------------------------------------------------

def _check_step(step: int) -> None:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"a checkpoint step is a non-negative integer, got {step!r}")


def _dtype_name(dt: np.dtype) -> str:
    try:
        return from_numpy(dt).name
    except KeyError:
        return str(dt)


def _chunk_crcs(arr: np.ndarray) -> dict:
    """``chunk_rows`` and the crc32 of each chunk of that many leading-dim rows of ``arr``."""
    if arr.ndim == 0:
        return {"chunk_rows": 1, "crc32": [_crc32(arr)]}
    row_bytes = max(1, arr.itemsize * math.prod(arr.shape[1:]))
    step = max(1, CHUNK_BYTES // row_bytes)
    return {"chunk_rows": step, "crc32": [_crc32(arr[i:i + step]) for i in range(0, arr.shape[0], step)]}


def _crc32(arr: np.ndarray) -> int:
    a = np.ascontiguousarray(arr).reshape(-1)
    if sys.byteorder != "little" and a.dtype.itemsize > 1:
        a = a.astype(a.dtype.newbyteorder("<"))
    return zlib.crc32(a.view(np.uint8).data)


def _read_receipt(tmp: Path, rank: int, step: int, layout: ShardLayout) -> dict:
    path = tmp / f"rank-{rank}.json"
    if not path.exists():
        raise CheckpointError(f"{path} is missing: rank {rank} has not finished writing its shard of step {step}; "
                              f"commit only after every rank's write_shard returned (a barrier in a "
                              f"multi-process run)")
    try:
        receipt = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt shard receipt ({e}); save step {step} again") from None
    if not isinstance(receipt, dict) or not isinstance(receipt.get("pieces"), dict):
        raise CheckpointError(f"{path}: corrupt shard receipt; save step {step} again")
    if receipt.get("fingerprint") != layout.fingerprint or receipt.get("mesh") != layout.mesh_text \
            or receipt.get("step") != step:
        raise CheckpointError(f"{path}: rank {rank}'s shard was written for another model or mesh "
                              f"({receipt.get('mesh')}, fingerprint {receipt.get('fingerprint')}); a stale file of "
                              f"a crashed save? Every rank must call write_shard with the committing layout")
    return receipt


def _check_shard_header(path: Path, layout: ShardLayout, rank: int) -> None:
    f = _ShardFile(path)
    for w in layout.weights:
        if not layout.stores(w, rank):
            continue
        dt, shape, _, _ = f.entry(w.name)
        want = tuple(e - s for s, e in layout.bounds(w, rank))
        if dt != w.dtype or shape != want:
            raise CheckpointError(f"{path}: weight '{w.name}' is stored as {dt.name}{list(shape)}, but the layout "
                                  f"asks for {w.dtype.name}{list(want)}; save step again with one layout")


def _check_manifest(m: Any, path: Path) -> None:
    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{path}: corrupt manifest ({why}); load another step")

    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise bad(f"not a {FORMAT} manifest")
    if m.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {m.get('version')!r}, but this partita reads "
                              f"version {VERSION}; load it with the partita that saved it")
    weights = m.get("weights")
    if not isinstance(weights, dict):
        raise bad("no weights table")
    for name, e in weights.items():
        try:
            shape = [int(d) for d in e["shape"]]
            if e["dtype"] not in DTYPES:
                raise ValueError(e["dtype"])
            for p in e["pieces"]:
                if not (isinstance(p["file"], str) and _is_shard_name(p["file"])
                        and len(p["start"]) == len(p["stop"]) == len(shape)
                        and all(isinstance(x, int) for x in p["start"] + p["stop"])
                        and all(0 <= s <= t <= n for s, t, n in zip(p["start"], p["stop"], shape))
                        and isinstance(p["chunk_rows"], int) and p["chunk_rows"] >= 1
                        and isinstance(p["crc32"], list)
                        and len(p["crc32"]) == (-(-(p["stop"][0] - p["start"][0]) // p["chunk_rows"]) if shape else 1)):
                    raise ValueError(p)
        except (KeyError, TypeError, ValueError):
            raise bad(f"weight '{name}' has an invalid entry") from None
    fp = model_fingerprint((n, e["shape"], e["dtype"]) for n, e in weights.items())
    if m.get("fingerprint") != fp:
        raise bad("its fingerprint does not match its weights")


def _is_shard_name(name: str) -> bool:
    # Files are named by the manifest; a name with a path in it must not reach outside the step.
    return re.fullmatch(r"rank-\d+\.safetensors", name) is not None


def _write_json_atomic(path: Path, obj: Any) -> None:
    _write_text_atomic(path, json.dumps(obj, separators=(",", ":")))


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot write ({e.strerror or e})") from None
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    # Makes a rename durable; not every filesystem lets a directory be opened or synced.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except OSError:
            pass
