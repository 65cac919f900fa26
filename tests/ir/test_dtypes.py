"""Dtypes: the promotion table against PyTorch, sizes, and the NumPy mapping.

The unsigned types PyTorch does not promote (u16, u32, u64) and the storage types have
their own tests in test_dtypes_extended.py.
"""

from __future__ import annotations

import pickle

import ml_dtypes
import numpy as np
import pytest
import torch

from partita.ir import dtypes as D
from partita.ir.dtypes import ALL_DTYPES, DTYPES, from_numpy, parse_dtype, promote, promote_all
from partita.ops._lazy import from_torch_dtype, to_torch_dtype

# The dtypes torch.result_type promotes.
TORCH_PROMOTED = (D.bool_, D.u8, D.i8, D.i16, D.i32, D.i64, D.f16, D.bf16, D.f32, D.f64)
PAIRS = [(a, b) for a in TORCH_PROMOTED for b in TORCH_PROMOTED]


@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_promotion_matches_torch_tensor_tensor(a, b):
    ta = torch.zeros(2, dtype=to_torch_dtype(a))
    tb = torch.zeros(2, dtype=to_torch_dtype(b))
    want = from_torch_dtype(torch.result_type(ta, tb))
    assert promote(a, b) is want
    # The result of the actual op agrees too (result_type could differ from what ops do).
    if not (a.is_bool and b.is_bool):
        assert from_torch_dtype((ta + tb).dtype) is want


def test_promotion_is_commutative_and_associative():
    for a, b in PAIRS:
        assert promote(a, b) is promote(b, a)
    for a in TORCH_PROMOTED:
        for b in TORCH_PROMOTED:
            for c in TORCH_PROMOTED:
                assert promote(promote(a, b), c) is promote(a, promote(b, c)), (a, b, c)


def test_promote_all_folds_left():
    assert promote_all([D.u8, D.i8]) is D.i16
    assert promote_all([D.bool_, D.u8, D.f16, D.bf16]) is D.f32
    assert promote_all([D.i64]) is D.i64
    with pytest.raises(StopIteration):
        promote_all([])


def test_special_cases_spelled_out():
    # The rules a reader would get wrong from "wider wins".
    assert promote(D.u8, D.i8) is D.i16
    assert promote(D.f16, D.bf16) is D.f32
    assert promote(D.i64, D.f16) is D.f16
    assert promote(D.bool_, D.u8) is D.u8


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=str)
def test_itemsize_and_numpy_mapping(dt):
    npdt = dt.np
    assert dt.itemsize == npdt.itemsize
    if dt.name not in ("f4e2m1", "i4", "u4", "i2", "u2"):  # torch has no usable 4/2-bit dtypes
        assert dt.itemsize == torch.empty((), dtype=to_torch_dtype(dt)).element_size()
        assert from_torch_dtype(to_torch_dtype(dt)) is dt
    assert from_numpy(npdt) is dt
    assert from_numpy(npdt.type) is dt
    assert DTYPES[dt.name] is dt and parse_dtype(dt.name) is dt
    kind = {"bool": "b", "uint": "u", "int": "i", "float": "f"}[dt.kind]
    if dt.name == "bf16":
        assert npdt == np.dtype(ml_dtypes.bfloat16)
    elif dt.storage:
        assert npdt.type.__module__.startswith("ml_dtypes")
    else:
        assert npdt.kind == kind
    assert dt.is_float == (dt.kind == "float")
    assert dt.is_int == (dt.kind in ("int", "uint"))
    assert dt.is_bool == (dt.name == "bool")


def test_itemsizes_spelled_out():
    assert {d.name: d.itemsize for d in ALL_DTYPES} == {
        "bool": 1, "u8": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8,
        "u16": 2, "u32": 4, "u64": 8, "f8e4m3fn": 1, "f8e4m3fnuz": 1, "f8e5m2": 1, "f8e5m2fnuz": 1, "f8e8m0": 1,
        # NumPy stores one 4- or 2-bit value per byte.
        "f4e2m1": 1, "i4": 1, "u4": 1, "i2": 1, "u2": 1}


def test_from_numpy_rejects_unsupported():
    with pytest.raises(KeyError):
        from_numpy(np.complex64)
    with pytest.raises(KeyError):
        from_numpy(np.str_)
    with pytest.raises(KeyError):
        from_numpy(ml_dtypes.float8_e4m3b11fnuz)


def test_dtype_objects_are_singletons_through_pickle_and_hash_by_value():
    for dt in ALL_DTYPES:
        assert pickle.loads(pickle.dumps(dt)) is dt
        assert hash(dt) == hash(D.DType(dt.name, dt.kind, dt.bits, dt.storage))
        assert dt == D.DType(dt.name, dt.kind, dt.bits, dt.storage)
        assert str(dt) == repr(dt) == dt.name
    assert len({d.name for d in ALL_DTYPES}) == len(ALL_DTYPES)
