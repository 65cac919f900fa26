"""quantize_linear, dequantize_linear and matmul_integer (partita/ops/quant.py) against
PyTorch's own quantized tensors (torch.quantize_per_tensor / per_channel round half to even
and saturate, as ONNX QuantizeLinear does) and integer matmul."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from optest import check_op, expect_error, rand

# torch marks its quantized tensors deprecated; they remain the independent oracle here.
pytestmark = pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")

_TORCH_Q = {"i8": torch.qint8, "u8": torch.quint8}


def _scale(shape, low=0.01, high=0.1):
    return rand(shape, "f32", low, high)


@pytest.mark.parametrize("qdt", ["i8", "u8"])
def test_quantize_per_tensor_matches_torch(qdt):
    x = rand((5, 7), "f32", -4, 4)
    # Exact halves (x / scale = k + 0.5) and values far out of range check rounding and saturation.
    x[0, :4] = np.array([0.25, 0.75, -0.25, 1.25], np.float32) * 0.5 / 0.25 * 0.25
    x[1, :2] = [1e3, -1e3]
    scale = np.array(0.5, np.float32)
    zp = np.array(3 if qdt == "i8" else 128, dtype=np.int8 if qdt == "i8" else np.uint8)
    check_op("quantize_linear", [x, scale, zp], {},
             lambda a, s, z: torch.quantize_per_tensor(a, float(s), int(z), _TORCH_Q[qdt]).int_repr())


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_per_axis_matches_torch(axis):
    x = rand((4, 6), "f32", -2, 2)
    n = x.shape[axis]
    scale = _scale((n,))
    zp = rand((n,), "i8", -5, 5).astype(np.int8)
    check_op("quantize_linear", [x, scale, zp], {"axis": axis},
             lambda a, s, z: torch.quantize_per_channel(a, s.double(), z.long(), axis % 2, torch.qint8).int_repr())


def test_quantize_rounds_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5], np.float32)
    out = check_op("quantize_linear", [x, np.array(1.0, np.float32), np.array(0, np.int8)], {},
                   lambda a, s, z: torch.round(a).to(torch.int8))
    assert out[0].tolist() == [0, 2, 2, 0, -2, -2, 4]


def test_quantize_per_block():
    x = rand((3, 10), "f32", -2, 2)
    scale = _scale((3, 3))            # blocks of 4 along axis 1: 4 + 4 + 2
    zp = np.zeros((3, 3), np.int8)

    def expect(a, s, z):
        full = torch.repeat_interleave(s, 4, dim=1)[:, :10]
        return torch.round(a / full).clamp(-128, 127).to(torch.int8)
    check_op("quantize_linear", [x, scale, zp], {"axis": 1, "block_size": 4}, expect)


@pytest.mark.parametrize("qdt", ["i8", "u8", "i16"])
def test_dequantize_matches_definition(qdt):
    np_dt = {"i8": np.int8, "u8": np.uint8, "i16": np.int16}[qdt]
    q = rand((4, 5), qdt, 0 if qdt == "u8" else -100, 100).astype(np_dt)
    scale = _scale((5,))
    zp = rand((5,), qdt, 0 if qdt == "u8" else -3, 3).astype(np_dt)
    check_op("dequantize_linear", [q, scale, zp], {"axis": 1},
             lambda a, s, z: (a.float() - z.float()) * s)


def test_dequantize_inverts_quantize_within_half_a_step():
    x = rand((8, 16), "f32", -1, 1)
    scale = (np.abs(x).max(axis=0) / 127).astype(np.float32)
    zp = np.zeros(16, np.int8)
    (q,) = check_op("quantize_linear", [x, scale, zp], {"axis": 1},
                    lambda a, s, z: torch.quantize_per_channel(a, s.double(), z.long(), 1, torch.qint8).int_repr())
    (back,) = check_op("dequantize_linear", [q, scale, zp], {"axis": 1},
                       lambda a, s, z: (a.float() - z.float()) * s)
    assert np.all(np.abs(back - x) <= scale / 2 + 1e-7)


def test_dequantize_i32_accumulator():
    q = rand((3, 4), "i32", -2**30, 2**30).astype(np.int32)
    check_op("dequantize_linear", [q, np.array(1e-6, np.float32), np.array(0, np.int32)], {},
             lambda a, s, z: (a.double() * s.double()).float())


@pytest.mark.parametrize("shape_a, shape_b", [((5, 16), (16, 8)), ((3, 5, 8), (8, 4)), ((8,), (8, 3))])
def test_matmul_integer_matches_int32_matmul(shape_a, shape_b):
    a = rand(shape_a, "i8", -128, 127).astype(np.int8)
    b = rand(shape_b, "i8", -128, 127).astype(np.int8)
    zero = np.array(0, np.int8)
    check_op("matmul_integer", [a, b, zero, zero], {}, lambda x, y, za, zb: torch.matmul(x.int(), y.int()))


def test_matmul_integer_zero_points_per_row_and_column():
    a = rand((4, 6), "u8", 0, 255).astype(np.uint8)
    b = rand((6, 3), "i8", -128, 127).astype(np.int8)
    azp = rand((4,), "u8", 100, 150).astype(np.uint8)
    bzp = rand((3,), "i8", -4, 4).astype(np.int8)
    check_op("matmul_integer", [a, b, azp, bzp], {},
             lambda x, y, za, zb: torch.matmul(x.int() - za.int()[:, None], y.int() - zb.int()))


def test_matmul_integer_accumulates_without_overflow_of_the_int8_products():
    # 256 products of (-128)(-128) = 16384 each: 4,194,304 fits i32 but not i16 or f16.
    a = np.full((2, 256), -128, np.int8)
    b = np.full((256, 8), -128, np.int8)
    zero = np.array(0, np.int8)
    (out,) = check_op("matmul_integer", [a, b, zero, zero], {}, lambda x, y, za, zb: torch.matmul(x.int(), y.int()))
    assert out[0, 0] == 256 * 128 * 128


def test_errors_name_the_fix():
    expect_error("quantize_linear", [("f32", (4, 6)), ("f32", (4,)), ("i8", (4,))], {"axis": 1},
                 "per-axis scale must be 1-D with 6 entries")
    expect_error("quantize_linear", [("f32", (4, 6)), ("f32", ()), ("i32", ())], {}, "must be one of i8, u8")
    expect_error("quantize_linear", [("f32", (4, 6)), ("f32", (6,)), ("i8", ())], {}, "scale's shape")
    expect_error("quantize_linear", [("i32", (4,)), ("f32", ()), ("i8", ())], {}, "must be f32, f16 or bf16")
    expect_error("quantize_linear", [("f32", (3, 10)), ("f32", (3, 2)), ("i8", (3, 2))],
                 {"axis": 1, "block_size": 4}, "must have shape [3,3]")
    expect_error("dequantize_linear", [("i8", (4,)), ("f32", ()), ("u8", ())], {}, "must have the input's dtype")
    expect_error("matmul_integer", [("f32", (2, 3)), ("i8", (3, 2)), ("f32", ()), ("i8", ())], {},
                 "must be i8 or u8")
    expect_error("matmul_integer", [("i8", (2, 3)), ("i8", (3, 2)), ("i8", (3,)), ("i8", ())], {},
                 "one entry per row (2)")


@pytest.mark.parametrize("target", ["f8e4m3fn", "f8e5m2", "i4"])
def test_rank0_cast_to_a_storage_type_runs_on_the_torch_executor(target):
    # A rank-0 value cast to a storage type (a float8 zero point or scale in a QDQ model) used
    # to fail on the torch executor: NumPy returns a scalar, not an array, from the rounding.
    import partita
    from partita import Builder, Graph
    from partita.ir import TensorType
    from partita.ir.dtypes import DTYPES, f32

    g = Graph("g")
    b = Builder(g)
    x = b.input("x", TensorType((), f32))
    b.ret(b.emit("cast", b.emit("cast", x, dtype=DTYPES[target]), dtype=f32))
    arr = np.array(1.3, np.float32)
    want = partita.run(g, [arr])[0]
    got = partita.run(g, [arr], backend="torch")[0]
    assert float(got) == float(want) and float(want) in (1.25, 1.0)
