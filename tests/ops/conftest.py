"""Shared fixtures for the op tests: makes ``optest`` importable and reseeds its inputs."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    # Test modules here import the helper as ``from optest import check_op`` whatever
    # pytest's import mode is.
    sys.path.insert(0, _HERE)

import optest  # noqa: E402


@pytest.fixture(autouse=True)
def _seed_inputs(request):
    """Each test draws the same random inputs whatever order (or worker) runs it."""
    optest.reseed(zlib.crc32(request.node.nodeid.encode()))
    yield
