"""Codegen tests: ``tests/strategies.py`` importable, and the kernel cache in a temporary
directory, so tests never write to the user's cache and start from a known state."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


@pytest.fixture(autouse=True, scope="session")
def _kernel_cache(tmp_path_factory):
    import os

    old = os.environ.get("PARTITA_CACHE_DIR")
    os.environ["PARTITA_CACHE_DIR"] = str(tmp_path_factory.mktemp("kernel-cache"))
    yield
    if old is None:
        os.environ.pop("PARTITA_CACHE_DIR", None)
    else:
        os.environ["PARTITA_CACHE_DIR"] = old


@pytest.fixture
def chain_cache(monkeypatch, tmp_path):
    """For the step-chain tests: a kernel cache of the test's own, the rules' kernels (the
    generated ones), not a measured choice that the machine's load could turn to oneDNN's,
    and one torch thread (chains run natively on one thread only)."""
    import torch

    from partita.codegen import choose

    monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "off")
    choose.clear(disk=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    choose.clear(disk=False)
