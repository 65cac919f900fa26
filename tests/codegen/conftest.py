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
