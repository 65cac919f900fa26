"""Test tiers: every test is marked by what it needs, so that ``make test-fast`` runs the quick
ones in a couple of minutes and ``make test`` (CI) runs them all.

- ``multiprocess``: the test starts processes (gloo ranks, ``python -m partita``, mypy, a
  compiler), as measured when ``tests/tiers.json`` was last recorded;
- ``slow``: the test used more than ``SLOW_CPU_S`` seconds of CPU in the test process when
  last recorded (CPU time, not wall time: it hardly moves when the host is busy);
- ``bench``: benchmark-shaped tests (the ``test_bench_*`` files, which run a benchmark's quick
  mode end to end).

``tests/tiers.json`` is a measurement, not a guess: ``tools/test_tiers.py`` runs the whole
suite with ``PARTITA_RECORD_TIERS`` set (this file then records each test's CPU seconds and
whether it started a process) and writes the table. A test the table does not know yet (a new
one) runs in the fast tier until the table is recorded again.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

# Which kernel runs a convolution is measured on the machine by default (codegen/choose.py), so
# it could differ between two runs of a test that checks which kernel ran: the tests run the
# kernels the rules pick; tests/codegen/test_choose.py turns measuring on where it tests it.
os.environ.setdefault("PARTITA_KERNEL_CHOICE", "off")

TIERS = Path(__file__).resolve().with_name("tiers.json")
SLOW_CPU_S = 0.5
MARKERS = {
    "slow": f"used more than {SLOW_CPU_S:g} s of CPU when tests/tiers.json was recorded",
    "multiprocess": "starts processes (gloo ranks, subprocesses, compilers)",
    "bench": "runs a benchmark's quick mode end to end",
}


def pytest_configure(config: Any) -> None:
    for name, why in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {why}")
    if os.environ.get("PARTITA_RECORD_TIERS"):
        config.pluginmanager.register(_Recorder(Path(os.environ["PARTITA_RECORD_TIERS"])), "partita-tier-recorder")


def function_key(nodeid: str) -> str:
    """A test's id without its parameters: ``tests/x.py::test_f[a-1]`` -> ``tests/x.py::test_f``."""
    return nodeid.split("[", 1)[0]


def _load_tiers() -> dict[str, list[str]]:
    if not TIERS.exists():
        return {}
    data = json.loads(TIERS.read_text())
    return {k: list(v) for k, v in data.get("marks", {}).items()}


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    table = _load_tiers()
    for item in items:
        marks = set(table.get(item.nodeid) or table.get(function_key(item.nodeid)) or ())
        if item.path.name.startswith("test_bench_"):
            marks.add("bench")
        for m in sorted(marks):
            item.add_marker(getattr(pytest.mark, m))


class _Recorder:
    """Records, per test, the CPU seconds of the test process and whether it started a
    process; writes ``<path>.<worker>.json`` at the end of the session."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: dict[str, dict[str, Any]] = {}
        self.spawned = False
        import multiprocessing.process
        import subprocess

        recorder = self
        popen_init = subprocess.Popen.__init__
        start = multiprocessing.process.BaseProcess.start

        def _popen_init(self: Any, *a: Any, **k: Any) -> None:
            recorder.spawned = True
            popen_init(self, *a, **k)

        def _start(self: Any) -> None:
            recorder.spawned = True
            start(self)

        subprocess.Popen.__init__ = _popen_init  # type: ignore[method-assign]
        multiprocessing.process.BaseProcess.start = _start  # type: ignore[method-assign]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> Any:
        self.spawned = False
        cpu, wall = time.process_time(), time.perf_counter()
        yield
        self.rows[item.nodeid] = {"cpu": round(time.process_time() - cpu, 3),
                                  "wall": round(time.perf_counter() - wall, 3), "spawned": self.spawned}

    def pytest_sessionfinish(self, session: Any) -> None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        out = self.path.with_name(f"{self.path.name}.{worker}.json")
        out.write_text(json.dumps(self.rows, indent=0, sort_keys=True))


@pytest.fixture
def fresh_dynamo():
    """dynamo's caches and the partita backend's records cleared before and after a test (a
    torch.compile test asks for it with ``pytestmark = pytest.mark.usefixtures("fresh_dynamo")``)."""
    import torch

    import partita.codegen.dynamo as pd

    torch._dynamo.reset()
    pd.reset_stats()
    yield
    torch._dynamo.reset()
    pd.reset_stats()
