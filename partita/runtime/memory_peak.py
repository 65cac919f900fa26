"""Opt-in: each rank's peak of live tensor bytes during a step, measured (off by default).

With ``PARTITA_MEMORY_DIR`` set to a folder in the launching process's environment, every rank
of ``run_ranks`` / ``partita.launch`` runs its steps under ``torch.profiler`` with
``profile_memory=True`` (the CPU allocator reports each allocation and free as a memory event)
and writes ``rank<r>.json`` there: per step, ``resident`` (the bytes of the step's inputs as
given: params, optimizer state, batch; each storage once), ``allocated`` (the largest running
sum of the allocations and frees inside the step, from its start) and ``peak`` (their sum).
What one rank's ``memory_report`` predicts is the same quantity: params + optimizer state +
batch + the most bytes live at once inside the program. Measuring adds the profiler's
overhead to every op: time a launch without it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

ENV = "PARTITA_MEMORY_DIR"


def memory_dir() -> str | None:
    """The folder the ranks write their peaks to, or None when measuring is off."""
    return os.environ.get(ENV) or None


def resident_bytes(feed: Mapping[str, Any]) -> int:
    """The bytes of a step's inputs (tensors or arrays), each underlying storage counted once."""
    seen: set[int] = set()
    total = 0
    for a in feed.values():
        if hasattr(a, "untyped_storage"):
            s = a.untyped_storage()
            key, size = s.data_ptr(), s.nbytes()
        elif hasattr(a, "__array_interface__"):
            key, size = int(a.__array_interface__["data"][0]), int(a.nbytes)
        else:
            continue
        if key not in seen:
            seen.add(key)
            total += int(size)
    return total


class StepMemory:
    """One rank's measured peaks, step by step (see the module docstring)."""

    def __init__(self, rank: int, folder: str) -> None:
        self.rank = rank
        self.folder = folder
        self.steps: list[dict[str, int]] = []

    def run(self, program: Any, feed: dict[str, Any]) -> Any:
        """``program(feed, {})`` under the memory profiler; records this step's figures."""
        from torch.profiler import ProfilerActivity, profile

        resident = resident_bytes(feed)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
            outs = program(feed, {})
        self.steps.append({"resident": resident, **allocation_peak(prof), })
        self.steps[-1]["peak"] = resident + self.steps[-1]["allocated"]
        return outs

    def write(self) -> None:
        """Write ``rank<r>.json`` in the folder."""
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        (Path(self.folder) / f"rank{self.rank}.json").write_text(json.dumps({"rank": self.rank, "steps": self.steps}))


def allocation_peak(prof: Any) -> dict[str, int]:
    """The largest running sum of a profile's CPU memory events (``allocated``) and where it ended (``net``)."""
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    run = peak = 0
    for e in events:
        run += int(e.nbytes())
        peak = max(peak, run)
    return {"allocated": peak, "net": run}


def read_peaks(folder: str, ranks: int) -> list[list[dict[str, int]]]:
    """Per rank, the steps' figures the ranks wrote in ``folder``; LookupError naming a missing file."""
    out = []
    for r in range(ranks):
        f = Path(folder) / f"rank{r}.json"
        if not f.exists():
            raise LookupError(f"memory peaks: {f} is missing; was the launch run with {ENV}={folder}?")
        out.append(json.loads(f.read_text())["steps"])
    return out
