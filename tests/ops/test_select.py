"""topk and sort (partita/ops/select.py) against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from optest import check_op, expect_error, rand


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i64"])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("axis", [-1, 0])
def test_topk_matches_torch(dtype, largest, axis):
    x = rand((5, 7), dtype, -50, 50)

    def oracle(a):
        if a.dtype.is_floating_point:   # no ties: torch.topk itself
            return tuple(torch.topk(a, 3, dim=axis, largest=largest, sorted=True))
        # integers tie; torch.topk orders ties arbitrarily, a stable sort by the lower index
        v, i = torch.sort(a, dim=axis, descending=largest, stable=True)
        return v.narrow(axis, 0, 3), i.narrow(axis, 0, 3)
    check_op("topk", [x], {"k": 3, "axis": axis, "largest": largest}, oracle)


@pytest.mark.parametrize("descending", [True, False])
def test_sort_matches_torch(descending):
    x = rand((4, 6), "f32")
    check_op("sort", [x], {"axis": 1, "descending": descending},
             lambda a: tuple(torch.sort(a, dim=1, descending=descending, stable=True)))


def test_ties_go_to_the_lower_index_first():
    x = np.array([[1, 3, 3, 2, 3], [0, 0, 0, 0, 0]], np.int64)
    v, i = check_op("topk", [x], {"k": 3}, lambda a: tuple(torch.sort(a, descending=True, stable=True))
                    and (torch.tensor([[3, 3, 3], [0, 0, 0]]), torch.tensor([[1, 2, 4], [0, 1, 2]])))
    assert i.tolist() == [[1, 2, 4], [0, 1, 2]]
    _, j = check_op("sort", [x], {"descending": True},
                    lambda a: tuple(torch.sort(a, dim=-1, descending=True, stable=True)))
    assert j[0].tolist() == [1, 2, 4, 3, 0]


def test_i64_extremes_and_nan():
    x = np.array([np.iinfo(np.int64).min, 5, np.iinfo(np.int64).max, 5], np.int64)
    check_op("sort", [x], {"descending": True}, lambda a: tuple(torch.sort(a, descending=True, stable=True)))
    y = np.array([1.0, np.nan, -2.0, np.nan], np.float32)
    _, idx = check_op("sort", [y], {}, lambda a: tuple(torch.sort(a, stable=True)))
    assert idx.tolist() == [2, 0, 1, 3]
    _, idx = check_op("topk", [y], {"k": 2}, lambda a: tuple(torch.sort(a, descending=True, stable=True)[i][:2]
                                                              for i in range(2)))
    assert idx.tolist() == [1, 3]


def test_errors():
    expect_error("topk", [("f32", (4, 5))], {"k": 6}, "k=6 is out of range for dim 1")
    expect_error("topk", [("f32", ())], {"k": 1}, "rank 0")
    expect_error("sort", [("bool", (3,))], {}, "not ordered")
