"""torch.export import of the rounding, inverse and hyperbolic, float-class, bitwise and
remainder ATen ops: each tiny module imports as the partita op and matches eager."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
import torch
import torch.nn as nn

import partita


class Fn(nn.Module):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.fn(*xs)


def _import_and_compare(fn: Callable, args: tuple, op: str) -> list:
    g = partita.import_torch(Fn(fn), args)
    partita.verify(g)
    assert op in [n.op for n in g.nodes], [n.op for n in g.nodes]
    with torch.no_grad():
        want = fn(*args)
    got_np = np.asarray(partita.run(g, [a.numpy() for a in args], backend="numpy")[0])
    got_t = partita.run(g, list(args), backend="torch")[0]
    assert got_np.dtype == want.numpy().dtype and got_t.dtype == want.dtype
    np.testing.assert_allclose(got_np, want.numpy(), rtol=1e-5, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(got_t.numpy(), want.numpy(), rtol=1e-5, atol=1e-6, equal_nan=True)
    return [n.op for n in g.nodes]


X = (torch.randn(3, 5) * 3,)
UNIT = (torch.rand(3, 5) * 1.8 - 0.9,)
INTS = (torch.randint(-50, 50, (3, 5), dtype=torch.int32), torch.randint(1, 9, (5,), dtype=torch.int32))

UNARY = [
    (torch.floor, X, "floor"), (torch.ceil, X, "ceil"), (torch.round, X, "round"), (torch.trunc, X, "trunc"),
    (torch.tan, UNIT, "tan"), (torch.asin, UNIT, "asin"), (torch.acos, UNIT, "acos"), (torch.atan, X, "atan"),
    (torch.sinh, X, "sinh"), (torch.cosh, X, "cosh"), (torch.asinh, X, "asinh"),
    (torch.acosh, (torch.rand(3, 5) * 4 + 1,), "acosh"), (torch.atanh, UNIT, "atanh"),
    (lambda x: torch.isnan(torch.log(x)), X, "isnan"), (lambda x: torch.isinf(1 / torch.round(x)), X, "isinf"),
    (torch.bitwise_not, INTS[:1], "bitwise_not"), (torch.reciprocal, X, "div"),
]


@pytest.mark.parametrize("fn, args, op", UNARY, ids=[u[2] for u in UNARY])
def test_unary_ops_import_and_match_eager(fn, args, op):
    _import_and_compare(fn, args, op)


BINARY = [
    (lambda a, b: a & b, INTS, "bitwise_and"), (lambda a, b: a | b, INTS, "bitwise_or"),
    (lambda a, b: a ^ b, INTS, "bitwise_xor"), (lambda a, b: (a & 6) ^ 3, INTS, "bitwise_xor"),
    (lambda a, b: a << b, INTS, "bitwise_left_shift"), (lambda a, b: a >> b, INTS, "bitwise_right_shift"),
    (lambda a, b: a >> 2, INTS, "bitwise_right_shift"),
    (lambda a, b: a % b, INTS, "remainder"), (lambda a, b: a % 7, INTS, "remainder"),
    (lambda a, b: torch.fmod(a, b), INTS, "fmod"), (lambda a, b: torch.fmod(a, 3), INTS, "fmod"),
    (lambda a, b: torch.remainder(a, b), (torch.randn(3, 5) * 5, torch.rand(5) + 0.5), "remainder"),
    (lambda a, b: torch.fmod(a, 1.5), (torch.randn(3, 5) * 5, torch.rand(5)), "fmod"),
]


@pytest.mark.parametrize("fn, args, op", BINARY, ids=[f"{b[2]}-{i}" for i, b in enumerate(BINARY)])
def test_binary_ops_import_and_match_eager(fn, args, op):
    _import_and_compare(fn, args, op)


def test_bitwise_ops_on_bools_stay_logical():
    m = (torch.rand(3, 5) > 0.5, torch.rand(5) > 0.5)
    assert "logical_and" in _import_and_compare(lambda a, b: a & b, m, "logical_and")
    _import_and_compare(lambda a, b: a ^ b, m, "bitwise_xor")


def test_round_with_decimals_scales_as_torch_does():
    x = (torch.randn(4, 6) * 100,)
    _import_and_compare(lambda x: torch.round(x, decimals=2), x, "round")
    _import_and_compare(lambda x: torch.round(x, decimals=-1), x, "round")
