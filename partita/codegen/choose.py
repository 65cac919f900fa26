"""Measured kernel choice: where partita cannot know that its kernel wins, it times the candidates.

A node that more than one kernel can run (a convolution: partita's generated kernel, oneDNN
with a packed weight, or ATen's own ``conv2d`` as eager runs it) is timed once on this machine,
on the node's real arguments, at its first call in the steady state (once its weight is
packed), and the fastest kernel runs it from then on:

    picked = choose(key, {"generated": run_generated, "onednn": run_onednn, "aten": run_aten},
                    where="%12 at model.py:40", default="generated")

- Each candidate runs once untimed, then ``ROUNDS`` interleaved rounds (every candidate once a
  round, so a slow moment of the machine falls on all of them); the median of each is kept. A
  candidate other than ``default`` must beat the default's median by ``MARGIN`` to be picked, so
  noise does not move a node off the kernel the rules prefer.
- The choice is kept in this process (``choices()``) and on disk, in ``choices.json`` beside the
  kernel cache (``cache_dir()``), under ``key`` and this machine's fingerprint (processor,
  threads, torch version, ``VERSION``): a later process takes it from there without measuring.
  ``clear()`` forgets both.
- ``PARTITA_KERNEL_CHOICE=off`` turns measuring off: every node runs its ``default``.

``report()`` prints every choice of this process (``CompiledProgram.report()`` prints those of
its own nodes): the node, each candidate's time and the kernel picked.
"""

from __future__ import annotations

import json
import os
import platform
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .jit import cache_dir

__all__ = ["KernelChoice", "choose", "choices", "clear", "report", "enabled", "fingerprint", "ROUNDS", "MARGIN",
           "VERSION"]

# Interleaved timed rounds per candidate, after one untimed call of each.
ROUNDS = 7
# A candidate other than the default is picked only when its median is below this share of the
# default's (3% faster): a tie stays on the kernel the rules prefer.
MARGIN = 0.97
# Bumped when a kernel changes enough that the choices on disk no longer hold.
VERSION = 3
CACHE_FILE = "choices.json"


@dataclass
class KernelChoice:
    """One node's measured choice: ``key`` (what was measured: op, shapes, layout, attributes),
    ``where`` (the node), the median microseconds of each candidate (empty when the choice came
    from the disk cache), the kernel ``picked`` and whether it came from the disk (``cached``)."""

    key: str
    where: str
    picked: str
    micros: dict[str, float] = field(default_factory=dict)
    cached: bool = False
    node: Any = field(default=None, repr=False, compare=False)   # a weak reference to the node, when given

    def of(self, node: Any) -> bool:
        """Whether this is the choice of ``node``."""
        return self.node is not None and self.node() is node

    def text(self) -> str:
        if self.cached:
            how = "from the choice cache"
        else:
            how = ", ".join(f"{k} {v:.1f} us" for k, v in sorted(self.micros.items(), key=lambda kv: kv[1]))
        return f"{self.where}: {self.picked} ({how})"


_LOCK = threading.Lock()
_CHOICES: list[KernelChoice] = []
_DISK: dict[str, str] | None = None


def enabled() -> bool:
    """Whether kernels are measured (``PARTITA_KERNEL_CHOICE`` is not ``off``)."""
    return os.environ.get("PARTITA_KERNEL_CHOICE", "measure") != "off"


def fingerprint() -> str:
    """This machine as the choices depend on it: processor, torch's thread count, torch's
    version and ``VERSION``."""
    from ..ops._lazy import torch

    return f"{_processor()}|threads={torch.get_num_threads()}|torch={torch.__version__}|v{VERSION}"


def _processor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _path() -> Path:
    return cache_dir() / CACHE_FILE


def _load() -> dict[str, str]:
    global _DISK
    if _DISK is None:
        try:
            data = json.loads(_path().read_text())
            _DISK = {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
        except (OSError, ValueError):
            _DISK = {}
    return _DISK


def _store(full_key: str, picked: str) -> None:
    """Add one choice to the file, merged with what other processes wrote since (written to a
    temporary file and renamed, so a reader never sees half a file)."""
    disk = _load()
    disk[full_key] = picked
    path = _path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            merged = json.loads(path.read_text())
            if not isinstance(merged, dict):
                merged = {}
        except (OSError, ValueError):
            merged = {}
        merged.update(disk)
        tmp = path.with_name(f"{CACHE_FILE}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(merged, indent=0, sort_keys=True))
        os.replace(tmp, path)
    except OSError:  # a read-only cache: the choice holds for this process only
        pass


def choose(key: str, candidates: Mapping[str, Callable[[], Any]], *, where: str = "", default: str | None = None,
           node: Any = None, clock: Callable[[], float] = time.perf_counter, rounds: int = ROUNDS) -> str:
    """The name of the fastest of ``candidates`` (callables of no argument that run the node on
    its real arguments) for ``key``: from this process's or the disk's cache, else measured
    (see the module doc). ``default`` (the first candidate when None) is what runs when
    measuring is off or only one candidate exists. ``node``: the graph node measured (kept
    weakly, for ``CompiledProgram.report()``)."""
    names = list(candidates)
    if not names:
        raise ValueError("choose: no candidates")
    default = names[0] if default is None else default
    if default not in candidates:
        raise ValueError(f"choose: the default {default!r} is not one of the candidates {names}")
    if len(names) == 1 or not enabled():
        return default
    ref = None if node is None else weakref.ref(node)
    full_key = f"{fingerprint()}|{key}|{','.join(sorted(names))}"
    with _LOCK:
        known = _load().get(full_key)
    if known is not None and known in candidates:
        with _LOCK:
            _CHOICES.append(KernelChoice(key, where, known, cached=True, node=ref))
        return known
    micros = measure(candidates, clock=clock, rounds=rounds)
    best = min(micros, key=lambda k: micros[k])
    picked = best if micros[best] < MARGIN * micros[default] else default
    with _LOCK:
        _CHOICES.append(KernelChoice(key, where, picked, micros, node=ref))
        _store(full_key, picked)
    return picked


def measure(candidates: Mapping[str, Callable[[], Any]], *, clock: Callable[[], float] = time.perf_counter,
            rounds: int = ROUNDS) -> dict[str, float]:
    """Each candidate's median time in microseconds: one untimed call each, then ``rounds``
    interleaved rounds."""
    for fn in candidates.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in candidates}
    for _ in range(rounds):
        for k, fn in candidates.items():
            t0 = clock()
            fn()
            times[k].append((clock() - t0) * 1e6)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def choices() -> list[KernelChoice]:
    """The choices this process made (measured, or taken from the disk cache), in order."""
    with _LOCK:
        return list(_CHOICES)


def report(of: list[KernelChoice] | None = None) -> str:
    """The choices (``of``, or all of this process's) as lines: node, kernel picked, each
    candidate's time."""
    cs = choices() if of is None else of
    if not cs:
        return "no measured kernel choices"
    return "\n".join([f"{len(cs)} measured kernel choice(s):"] + [f"  {c.text()}" for c in cs])


def clear(disk: bool = True) -> None:
    """Forget this process's choices, and (``disk``) the choice cache file."""
    global _DISK
    with _LOCK:
        _CHOICES.clear()
        _DISK = None
        if disk:
            try:
                _path().unlink()
            except OSError:
                pass
