"""``torch.compile(backend="partita")`` on integer division and remainders: exact for every
integer dtype (values above 2**53 included), a zero divisor raises as eager does, and an invalid
option value is an error, not a silent fallback."""

from __future__ import annotations

import warnings

import pytest
import torch

import partita.codegen.dynamo as pd
from partita.ir.diagnostics import IntegerDivisionByZeroError, PartitaError


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _compiled(fn):
    return torch.compile(fn, backend="partita", options={"fallback": "error"})


FORMS = [
    ("floordiv", lambda a, b: a // b),
    ("trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    ("floor", lambda a, b: torch.div(a, b, rounding_mode="floor")),
    ("remainder", lambda a, b: torch.remainder(a, b)),
    ("fmod", lambda a, b: torch.fmod(a, b)),
]


@pytest.mark.parametrize("name, fn", FORMS, ids=[f[0] for f in FORMS])
def test_int64_above_2_53_is_exact(name, fn):
    a = torch.tensor([10**18 + 7, -(10**18 + 7), 2**53 + 1, -7, 7, torch.iinfo(torch.int64).max])
    b = torch.tensor([3, 3, 2, 2, -2, 7])
    got = _compiled(fn)(a, b)
    assert got.dtype == torch.int64 and got.tolist() == fn(a, b).tolist()
    assert pd.stats().fallbacks == 0, pd.stats().report()


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8])
def test_small_integer_dtypes_match_eager(dtype):
    info = torch.iinfo(dtype)
    a = torch.tensor([info.min, info.min + 1, -7 if info.min else 9, 7, info.max], dtype=dtype)
    b = torch.tensor([3, 2, 2, 3, 7], dtype=dtype) * (1 if info.min == 0 else torch.tensor([1, -1, 1, -1, 1], dtype=dtype))

    def fn(a, b):
        return a // b, torch.remainder(a, b), torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc")

    got, want = _compiled(fn)(a, b), fn(a, b)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.tolist() == w.tolist()


def test_min_over_minus_one_wraps_as_eager():
    a = torch.tensor([torch.iinfo(torch.int64).min, 5])
    b = torch.tensor([-1, -1])
    f = _compiled(lambda a, b: (a // b, torch.remainder(a, b)))
    q, r = f(a, b)
    assert q.tolist() == (a // b).tolist() == [torch.iinfo(torch.int64).min, -5]
    assert r.tolist() == [0, 0]


@pytest.mark.parametrize("name, fn", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_a_zero_divisor_raises_as_eager(name, fn, dtype):
    a = torch.tensor([5, 6, 7], dtype=dtype)
    ok = torch.tensor([1, 2, 3], dtype=dtype)
    zero = torch.tensor([1, 0, 3], dtype=dtype)
    f = _compiled(lambda a, b: fn(a, b) + 1)
    assert f(a, ok).tolist() == (fn(a, ok) + 1).tolist()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, zero)
    with pytest.raises(IntegerDivisionByZeroError, match="division by zero"):
        f(a, zero)
    assert pd.stats().fallbacks == 0, pd.stats().report()


def test_a_python_zero_divisor_raises():
    a = torch.tensor([5, 6, 7])
    with pytest.raises(IntegerDivisionByZeroError):
        _compiled(lambda a: a // 0)(a)


def _first_partita_error(e: BaseException) -> BaseException | None:
    """The PartitaError that ``e`` is or wraps (dynamo wraps a backend's errors)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, PartitaError):
            return e
        seen.add(id(e))
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
    return None


def test_an_unknown_pass_in_the_options_raises_naming_the_valid_passes():
    f = torch.compile(lambda x: x * 2 + 1, backend="partita", options={"passes": "nosuchpass"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: an error
        with pytest.raises(Exception) as e:
            f(torch.ones(3))
    err = _first_partita_error(e.value)
    assert err is not None, repr(e.value)
    text = str(err)
    assert "passes" in text and "nosuchpass" in text and "canonicalize" in text and "cse" in text, text


@pytest.mark.parametrize("options, words", [
    ({"passes": 3}, ["passes", "3"]),
    ({"fallback": "loud"}, ["fallback", "loud", "'warn'"]),
    ({"min_ops": 0}, ["min_ops", "0"]),
    ({"nosuch": 1}, ["nosuch", "passes"]),
])
def test_invalid_options_raise_a_partita_error(options, words):
    f = torch.compile(lambda x: x * 2 + 1, backend="partita", options=options)
    with pytest.raises(Exception) as e:
        f(torch.ones(3))
    err = _first_partita_error(e.value)
    assert err is not None, repr(e.value)
    assert all(w in str(err) for w in words), str(err)


def test_compile_fx_graph_checks_its_passes():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(PartitaError, match="nosuchpass"):
        pd.compile_fx_graph(gm, [torch.ones(2)], passes="nosuchpass")
