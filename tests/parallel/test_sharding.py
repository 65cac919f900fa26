"""Every sharding rule, checked numerically on a simulated mesh.

For each op with a rule and each sample below, and for every splittable label of its
DimSpec (and pairs of labels on a 2-D mesh, and one label over both axes of it), the test
splits the operands as the label says, runs the op's NumPy reference on each rank's local
pieces with the rule's localized attributes, reassembles the results by the placements
``result_placements`` gives (pieces concatenated in rank order along split dims, summands
added over partial axes) and compares with the op on the global operands. A rank's result
is scaled by 1/n where the rule averages over a label split n ways (DimSpec.averages), as the
partition does. Operands the rule calls linear are also fed as partial sums (random
summands). Rules that refuse a placement are checked to return a Conflict.

``test_every_op_is_accounted_for`` keeps the table complete: a new op gets a rule and a
sample here, or is listed in ``sharding.WITHOUT_RULE`` (the passes replicate it).

The last tests run partitioned programs with ``run_mesh``: means and cross entropy over
split dims (the 1/n scaling, on 1-D and 2-D meshes), and data-parallel training steps of
imported torch models (an MLP with layer_norm, a CNN, a one-layer GPT-2), which must match the
single-device step while communicating only the gradients' and the loss's all-reduces.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import partita  # (importing it attaches the rules)
from partita.ir import TensorType
from partita.ir.dtypes import DTYPES, i64
from partita.ir.printer import value_names
from partita.ops.registry import OPS
from partita.parallel import Mesh, Placement
from partita.parallel.partition import local_piece, partition_with_report, shard_weights
from partita.parallel.propagate import propagate
from partita.parallel.interpreter import run_mesh
from partita.parallel.sharding import (WITHOUT_RULE, Conflict, DimSpec, average_factor, result_placements,
                                       sharding_spec)

# Operand specs: ("f", shape) floats; ("pos", shape) floats in [0.5, 2]; ("idx", shape, high)
# i64 in [0, high); ("bool", shape); ("step", value) an f64 scalar; ("f32", shape) f32 floats;
# ("scale", shape) f32 in [0.01, 0.1]; ("unit", shape) floats in (-0.9, 0.9);
# ("i8" | "u8" | "i32", shape) integers of that dtype.
SAMPLES: dict[str, list[tuple[list, dict]]] = {
    "topk": [([("f", (4, 6))], {"k": 3}), ([("f", (4, 6, 2))], {"k": 2, "axis": 1, "largest": False})],
    "sort": [([("f", (4, 6))], {"axis": 0, "descending": True})],
    "quantize_linear": [([("f32", (4, 6)), ("scale", ()), ("i8", ())], {}),
                        ([("f32", (4, 6)), ("scale", (6,)), ("i8", (6,))], {"axis": 1}),
                        ([("f32", (4, 6)), ("scale", (4, 2)), ("i8", (4, 2))], {"axis": 1, "block_size": 3})],
    "dequantize_linear": [([("i8", (4, 6)), ("scale", (4,)), ("i8", (4,))], {"axis": 0}),
                          ([("i32", (4, 6)), ("scale", ()), ("i32", ())], {})],
    "matmul_integer": [([("i8", (4, 6)), ("i8", (6, 2)), ("i8", ()), ("i8", ())], {}),
                       ([("u8", (2, 4, 6)), ("i8", (6, 4)), ("u8", (4,)), ("i8", (4,))], {})],
    "add": [([("f", (4, 6)), ("f", (6,))], {}), ([("f", (2, 1, 4)), ("f", (4, 1))], {})],
    "sub": [([("f", (4, 6)), ("f", (4, 1))], {})],
    "mul": [([("f", (4, 6)), ("f", (1, 6))], {}), ([("f", ()), ("f", (2, 4))], {})],
    "div": [([("f", (4, 6)), ("pos", (6,))], {})],
    "pow": [([("pos", (4, 2)), ("f", (4, 2))], {})],
    "maximum": [([("f", (4, 6)), ("f", (6,))], {})],
    "minimum": [([("f", (4, 2)), ("f", (4, 2))], {})],
    "equal": [([("idx", (4, 2), 3), ("idx", (4, 2), 3)], {})],
    "not_equal": [([("idx", (4, 2), 3), ("idx", (2,), 3)], {})],
    "less": [([("f", (4, 2)), ("f", (4, 2))], {})],
    "less_equal": [([("f", (4, 2)), ("f", (4, 2))], {})],
    "greater": [([("f", (4, 2)), ("f", (4, 2))], {})],
    "greater_equal": [([("f", (4, 2)), ("f", (4, 2))], {})],
    "logical_and": [([("bool", (4, 2)), ("bool", (4, 2))], {})],
    "logical_or": [([("bool", (4, 2)), ("bool", (1, 2))], {})],
    "logical_not": [([("bool", (4, 2))], {})],
    # A fused kernel runs replicated (its body has fixed shapes): nothing to split.
    "fused": [([("f", (4, 6)), ("f", (6,))], {"body": "graph @kernel(%x0: f32[4,6], %x1: f32[6]) -> (f32[4,6]) {\n"
                                                       "  %0 = add(%x0, %x1) : f32[4,6]\n  %1 = tanh(%0) : f32[4,6]\n"
                                                       "  return %1\n}\n"})],
    # The library kernels with fused epilogues run replicated (made for single-device inference).
    "conv2d_pointwise": [([("f", (2, 3, 6, 6)), ("f", (4, 3, 3, 3)), ("f", (4,)), ("f", (2, 4, 6, 6))],
                          {"padding": [1, 1], "binary": "add", "unary": "relu"})],
    "linear_pointwise": [([("f", (4, 6)), ("f", (2, 6)), ("f", (2,))], {"unary": "gelu", "weight_layout": "nk"})],
    "grn": [([("f", (2, 3, 3, 4)), ("f", (1, 1, 1, 4)), ("f", (1, 1, 1, 4))], {})],
    "rel_scores": [([("f", (2, 3, 4)), ("f", (1, 5, 4)), ("idx", (3, 3), 5)], {"transpose": True})],
    "rotary_attention": [([("f", (2, 3, 5, 4)), ("f", (2, 3, 5, 4)), ("f", (2, 3, 5, 4)), ("f", (1, 1, 5, 4)),
                           ("f", (1, 1, 5, 4))], {"causal": True})],
    "add_norm": [([("f", (4, 6)), ("f", (4, 6)), ("f", (6,)), ("f", (6,))], {"kind": "layer"}),
                 ([("f", (2, 3, 6)), ("f", (2, 3, 6)), ("f", (6,))], {"kind": "rms", "eps": 1e-6})],
    "group_norm": [([("f", (2, 6, 3, 3)), ("f", (6,)), ("f", (6,))], {"groups": 2, "unary": "relu"})],
    "pool_mixer": [([("f", (2, 6, 4, 5)), ("f", (6,)), ("f", (6,)), ("f", (6,))], {"groups": 2, "kernel": [3, 3]})],
    "se_block": [([("f", (2, 6, 4, 5)), ("f", (3, 6, 1, 1)), ("f", (3,)), ("f", (6, 3, 1, 1)), ("f", (6,))],
                  {"act": "relu", "gate": "hardsigmoid"})],
    "where": [([("bool", (4, 6)), ("f", (4, 6)), ("f", (6,))], {}), ([("bool", (4, 1)), ("f", (4, 6)), ("f", (4, 6))], {})],
    **{n: [([("f", (4, 2))], {})] for n in ("neg", "abs", "exp", "sin", "cos", "tanh", "sigmoid", "relu",
                                             "silu", "erf", "sign")},
    **{n: [([("pos", (4, 2))], {})] for n in ("log", "sqrt", "rsqrt")},
    "gelu": [([("f", (4, 2))], {"approximate": "tanh"})],
    **{n: [([("f", (4, 2)), ("f", (4, 2))], {})] for n in ("relu_grad", "sigmoid_grad", "tanh_grad", "silu_grad",
                                                            "gelu_grad")},
    "cast": [([("f", (4, 2))], {"dtype": "f32"})],
    **{n: [([("f", (4, 2))], {})] for n in ("floor", "ceil", "round", "trunc", "tan", "atan", "sinh", "cosh",
                                             "asinh", "isnan", "isinf")},
    **{n: [([("unit", (4, 2))], {})] for n in ("asin", "acos", "atanh")},
    "acosh": [([("pos", (4, 2))], {})],
    **{n: [([("i32", (4, 2)), ("i32", (2,))], {})] for n in ("bitwise_and", "bitwise_or", "bitwise_xor")},
    "bitwise_not": [([("u8", (4, 2))], {})],
    **{n: [([("i8", (4, 2)), ("i8", (4, 2))], {})] for n in ("bitwise_left_shift", "bitwise_right_shift")},
    **{n: [([("f", (4, 2)), ("pos", (2,))], {}), ([("i32", (4, 2)), ("i32", (4, 2))], {})]
       for n in ("remainder", "fmod")},
    "int_div": [([("i32", (4, 2)), ("i32", (2,))], {"rounding": "floor"}),
                ([("i32", (4, 2)), ("i32", (4, 2))], {"rounding": "trunc"})],
    "dropout": [([("f", (4, 6))], {"p": 0.3}), ([("f", (4, 6))], {"p": 0.3, "train": True, "seed": 3})],
    "sum": [([("f", (4, 2, 6))], {"axes": [1]}), ([("f", (4, 2))], {}), ([("f", (4, 2))], {"axes": [0], "keepdim": True})],
    "mean": [([("f", (4, 2, 6))], {"axes": [0, 2]}), ([("f", (4, 2))], {"axes": [1], "keepdim": True}),
             ([("f", (4, 8))], {})],
    "max": [([("f", (4, 2, 6))], {"axes": [1]})],
    "min": [([("f", (4, 2))], {"axes": [1], "keepdim": True})],
    "prod": [([("pos", (4, 2))], {"axes": [1]})],
    "argmax": [([("f", (4, 6))], {"axes": [1]})],
    "argmin": [([("f", (4, 6))], {"axes": [0], "keepdim": True})],
    "cumsum": [([("f", (4, 6))], {"axis": 1})],
    "matmul": [([("f", (4, 6)), ("f", (6, 2))], {}), ([("f", (2, 4, 6)), ("f", (6, 2))], {}),
               ([("f", (6,)), ("f", (2, 6, 4))], {}), ([("f", (2, 1, 4, 6)), ("f", (2, 6, 2))], {}),
               ([("f", (6,)), ("f", (6,))], {})],
    "transpose": [([("f", (2, 4, 6))], {"perm": [2, 0, 1]}), ([("f", (4, 2))], {})],
    "reshape": [([("f", (4, 6))], {"shape": [24]}), ([("f", (24,))], {"shape": [4, 6]}),
                ([("f", (4, 6, 2))], {"shape": [4, 3, 4]}), ([("f", (2, 1, 6))], {"shape": [2, 6, 1]}),
                ([("f", (4, 6))], {"shape": [-1, 2]})],
    "broadcast_to": [([("f", (4, 1))], {"shape": [2, 4, 6]})],
    "squeeze": [([("f", (4, 1, 2))], {}), ([("f", (2, 1, 4))], {"axes": [1]})],
    "unsqueeze": [([("f", (4, 2))], {"axes": [0, 2]})],
    "concat": [([("f", (2, 4)), ("f", (6, 4))], {"axis": 0})],
    "split": [([("f", (6, 4))], {"axis": 0, "sizes": [2, 4]})],
    "slice": [([("f", (8, 4))], {"axis": 0, "start": 1, "end": 7, "step": 2})],
    "pad": [([("f", (4, 6))], {"pads": [1, 0, 0, 0]}), ([("f", (4, 6))], {"pads": [0, 0, 2, 1], "value": 1.5})],
    "softmax": [([("f", (4, 6))], {}), ([("f", (2, 4, 2))], {"axis": 1})],
    "log_softmax": [([("f", (4, 6))], {"axis": 0})],
    "softmax_grad": [([("f", (4, 6)), ("f", (4, 6))], {})],
    "log_softmax_grad": [([("f", (4, 6)), ("f", (4, 6))], {"axis": 0})],
    "masked_softmax": [([("f", (2, 4, 6, 6))], {"causal": True, "scale": 0.5}),
                       ([("f", (2, 4, 6)), ("bool", (4, 6))], {}),
                       ([("f", (2, 2, 4, 6)), ("f", (2, 1, 1, 6))], {"causal": True})],
    "masked_softmax_grad": [([("f", (2, 4, 6, 6)), ("pos", (2, 4, 6, 6))], {"causal": True, "scale": 0.5}),
                            ([("f", (4, 6)), ("pos", (4, 6))], {})],
    "layer_norm": [([("f", (4, 8)), ("f", (8,)), ("f", (8,))], {}), ([("f", (2, 4, 4))], {"axes": [-2, -1]})],
    "rms_norm": [([("f", (4, 8)), ("f", (8,))], {"eps": 1e-6})],
    "embedding": [([("f", (10, 4)), ("idx", (2, 4), 10)], {})],
    "gather": [([("f", (4, 6)), ("idx", (2, 6), 4)], {"axis": 0}), ([("f", (4, 6)), ("idx", (4, 2), 6)], {"axis": 1})],
    "index_select": [([("f", (4, 6)), ("idx", (2,), 6)], {"axis": 1})],
    "cross_entropy": [([("f", (4, 5)), ("idx", (4,), 5)], {}),
                      ([("f", (4, 5, 4)), ("idx", (4, 4), 5)], {"label_smoothing": 0.2}),
                      ([("f", (2, 5, 4)), ("idx", (2, 4), 5)], {"reduction": "sum", "label_smoothing": 0.1}),
                      ([("f", (4, 5)), ("idx", (4,), 5)], {"reduction": "none"})],
    "conv2d": [([("f", (2, 3, 6, 6)), ("f", (4, 3, 3, 3)), ("f", (4,))], {"stride": [2, 1], "padding": [1, 1]}),
               ([("f", (2, 4, 5, 5)), ("f", (6, 4, 3, 3))], {"padding": [1, 1]}),
               ([("f", (2, 4, 5, 5)), ("f", (4, 2, 2, 2))], {"groups": 2})],
    "conv3d": [([("f", (2, 2, 4, 4, 4)), ("f", (4, 2, 2, 3, 2))], {})],
    "conv_transpose2d": [([("f", (2, 4, 3, 3)), ("f", (4, 2, 3, 3)), ("f", (2,))], {"stride": [2, 2]}),
                         ([("f", (2, 4, 3, 3)), ("f", (4, 6, 2, 2))], {"stride": [2, 2], "padding": [1, 1]}),
                         ([("f", (2, 4, 3, 3)), ("f", (4, 3, 2, 2)), ("f", (6,))], {"groups": 2})],
    "conv_transpose3d": [([("f", (2, 2, 2, 3, 2)), ("f", (2, 4, 2, 2, 2))], {})],
    "max_pool2d": [([("f", (2, 4, 6, 6))], {"kernel": [2, 2]})],
    "max_pool3d": [([("f", (2, 2, 4, 4, 4))], {"kernel": [2, 2, 2]})],
    "max_pool2d_with_indices": [([("f", (2, 4, 6, 6))], {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]})],
    "max_pool3d_with_indices": [([("f", (2, 2, 4, 4, 4))], {"kernel": [2, 2, 2]})],
    "avg_pool2d": [([("f", (2, 4, 6, 6))], {"kernel": [2, 2]})],
    "avg_pool3d": [([("f", (2, 2, 4, 4, 4))], {"kernel": [2, 2, 2]})],
    "batch_norm": [([("f", (4, 2, 2, 2)), ("f", (2,)), ("f", (2,)), ("f", (2,)), ("pos", (2,))], {"training": True}),
                   ([("f", (4, 2, 2)), ("f", (2,)), ("f", (2,)), ("f", (2,)), ("pos", (2,))], {})],
    "attention": [([("f", (2, 4, 5, 4)), ("f", (2, 4, 6, 4)), ("f", (2, 4, 6, 4))], {"causal": True}),
                  ([("f", (2, 5, 4)), ("f", (2, 6, 4)), ("f", (2, 6, 4)), ("bool", (2, 5, 6))], {}),
                  ([("f", (2, 2, 5, 4)), ("f", (2, 2, 6, 4)), ("f", (2, 2, 6, 4)), ("f", (2, 1, 1, 6))], {})],
    # Backward ops (operands: the upstream gradient first, then what the kernel reads).
    "layer_norm_grad": [([("f", (4, 8)), ("f", (4, 8)), ("f", (8,))], {}),
                        ([("f", (2, 4, 4)), ("f", (2, 4, 4))], {"axes": [-1]}),
                        ([("f", (4, 6, 2)), ("f", (4, 6, 2)), ("f", (6,))], {"axes": [1], "eps": 1e-3})],
    "rms_norm_grad": [([("f", (4, 8)), ("f", (4, 8)), ("f", (8,))], {"eps": 1e-6}),
                      ([("f", (2, 4, 4)), ("f", (2, 4, 4))], {"axes": [-2, -1]})],
    "batch_norm_grad": [([("f", (4, 2, 2, 2)), ("f", (4, 2, 2, 2)), ("f", (2,))], {"training": True}),
                        ([("f", (4, 2, 2, 4)), ("f", (4, 2, 2, 4)), ("f", (2,)), ("f", (2,)), ("pos", (2,))],
                         {"training": False})],
    "conv2d_grad": [([("f", (2, 4, 3, 6)), ("f", (2, 4, 6, 6)), ("f", (4, 4, 3, 3))],
                     {"stride": [2, 1], "padding": [1, 1]}),
                    ([("f", (2, 4, 4, 4)), ("f", (2, 4, 5, 5)), ("f", (4, 2, 2, 2))], {"groups": 2}),
                    ([("f", (2, 2, 3, 2, 3)), ("f", (2, 2, 4, 4, 4)), ("f", (2, 2, 2, 3, 2))], {}),
                    ([("f", (2, 4, 4)), ("f", (2, 2, 6)), ("f", (4, 2, 3))], {"mask": [0, 1, 1]})],
    "max_pool2d_grad": [([("f", (2, 4, 3, 3)), ("f", (2, 4, 6, 6))], {"kernel": [2, 2]}),
                        ([("f", (2, 4, 3, 3)), ("f", (2, 4, 6, 6)), ("idx", (2, 4, 3, 3), 36)],
                         {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]}),
                        ([("f", (2, 2, 2, 2, 2)), ("f", (2, 2, 4, 4, 4))], {"kernel": [2, 2, 2]})],
    "avg_pool2d_grad": [([("f", (2, 4, 3, 3)), ("f", (2, 4, 6, 6))],
                         {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1], "count_include_pad": False})],
    "attention_grad": [([("f", (2, 4, 5, 4)), ("f", (2, 4, 5, 4)), ("f", (2, 4, 6, 4)), ("f", (2, 4, 6, 4)),
                         ("f", (2, 4, 5, 4)), ("f", (2, 4, 5))], {"causal": True}),
                       ([("f", (2, 5, 4)), ("f", (2, 5, 4)), ("f", (2, 6, 4)), ("f", (2, 6, 4)), ("f", (2, 5, 4)),
                         ("f", (2, 5)), ("bool", (2, 5, 6))], {}),
                       ([("f", (2, 2, 5, 4)), ("f", (2, 2, 5, 4)), ("f", (2, 2, 6, 4)), ("f", (2, 2, 6, 4)),
                         ("f", (2, 2, 5, 4)), ("f", (2, 2, 5)), ("f", (2, 1, 1, 6))], {"scale": 0.3})],
    "cross_entropy_grad": [([("f", ()), ("f", (4, 5)), ("idx", (4,), 5)], {}),
                           ([("f", ()), ("f", (4, 5, 4)), ("idx", (4, 4), 5)], {"label_smoothing": 0.1}),
                           ([("f", ()), ("f", (2, 5, 4)), ("idx", (2, 4), 5)], {"reduction": "sum"}),
                           ([("f", (4,)), ("f", (4, 5)), ("idx", (4,), 5)], {"reduction": "none"})],
    "embedding_grad": [([("f", (2, 4, 4)), ("idx", (2, 4), 10)], {"num_embeddings": 10})],
    "slice_grad": [([("f", (4, 3))], {"shape": [4, 8], "axis": 1, "start": 1, "end": 7, "step": 2}),
                   ([("f", (3, 4, 2))], {"shape": [8, 4, 2], "axis": 0, "start": -7, "step": 3})],
    "scatter_add": [([("f", (4, 6)), ("idx", (2, 6), 4), ("f", (3, 6))], {"axis": 0}),
                    ([("f", (4, 6)), ("idx", (4, 2), 6), ("f", (4, 3))], {"axis": 1})],
    "index_add": [([("f", (4, 6)), ("idx", (3,), 6), ("f", (4, 3))], {"axis": 1}),
                  ([("f", (4, 2, 2)), ("idx", (5,), 4), ("f", (5, 2, 2))], {"axis": 0})],
    "scatter_elements": [([("f", (4, 6)), ("idx", (2, 6), 4), ("f", (2, 6))], {"axis": 0, "reduction": "add"}),
                         ([("f", (4, 6)), ("idx", (4, 2), 6), ("f", (4, 3))], {"axis": 1, "reduction": "max"}),
                         ([("f", (4, 6)), ("idx", (4, 6), 4), ("f", (4, 6))], {"axis": 0, "reduction": "mul"})],
    "cumprod": [([("f", (4, 6))], {"axis": 1}), ([("f", (4, 6, 2))], {"axis": 0})],
    "adamw_update": [([("f", (4, 2)), ("f", (4, 2)), ("f", (4, 2)), ("pos", (4, 2)), ("step", 3.0)], {})],
    "sgd_update": [([("f", (4, 2)), ("f", (4, 2))], {"lr": 0.1}),
                   ([("f", (4, 2)), ("f", (4, 2)), ("f", (4, 2))], {"momentum": 0.9, "nesterov": True})],
}



def _is_collective_module(op) -> bool:
    where = str(op.defined_at.file).replace("\\", "/") if op.defined_at is not None else ""
    return where.endswith("ops/collective.py")


def _array(spec, rng: np.random.Generator) -> np.ndarray:
    kind = spec[0]
    if kind == "f":
        return rng.standard_normal(spec[1])
    if kind == "pos":
        return rng.uniform(0.5, 2.0, spec[1])
    if kind == "idx":
        return rng.integers(0, spec[2], spec[1]).astype(np.int64)
    if kind == "bool":
        return rng.random(spec[1]) < 0.5
    if kind == "step":
        return np.asarray(spec[1])
    if kind == "unit":
        return rng.uniform(-0.9, 0.9, spec[1])
    if kind == "f32":
        return rng.standard_normal(spec[1]).astype(np.float32)
    if kind == "scale":
        return rng.uniform(0.01, 0.1, spec[1]).astype(np.float32)
    if kind in ("i8", "u8", "i32"):
        lo, hi = {"i8": (-128, 128), "u8": (0, 256), "i32": (-2**20, 2**20)}[kind]
        return rng.integers(lo, hi, spec[1]).astype(kind.replace("i", "int").replace("u", "uint"))
    raise AssertionError(kind)


def _type(a: np.ndarray) -> TensorType:
    name = {np.dtype(np.float64): "f64", np.dtype(np.int64): "i64", np.dtype(np.bool_): "bool",
            np.dtype(np.float32): "f32", np.dtype(np.int8): "i8", np.dtype(np.uint8): "u8",
            np.dtype(np.int32): "i32"}[a.dtype]
    return TensorType(tuple(a.shape), DTYPES[name])


def _run(op: str, args: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    out = OPS[op].reference(args, attrs)
    return [np.asarray(o) for o in out] if isinstance(out, (tuple, list)) else [np.asarray(out)]


def _piece(p: Placement, shape, mesh: Mesh, rank: int) -> tuple[slice, ...]:
    """The global index range rank ``rank`` holds of a tensor placed by ``p``."""
    out = []
    for n, axes in zip(shape, p.dims):
        k, idx = 1, 0
        for a in axes:  # major to minor
            idx = idx * mesh.axis_size(a) + mesh.coord(rank, a)
            k *= mesh.axis_size(a)
        out.append(slice(idx * (n // k), (idx + 1) * (n // k)))
    return tuple(out)


def _locals(x: np.ndarray, p: Placement, mesh: Mesh, rng) -> list[np.ndarray]:
    """Each rank's piece of ``x``; over partial axes, random summands that add up to it."""
    summands: dict[tuple, np.ndarray] = {}
    if p.partial:
        groups = list(itertools.product(*(range(mesh.axis_size(a)) for a in p.partial)))
        parts = [rng.standard_normal(x.shape) for _ in groups[:-1]]
        parts.append(x - sum(parts) if parts else x)
        summands = dict(zip(groups, parts))
    res = []
    for r in range(mesh.size):
        whole = summands[tuple(mesh.coord(r, a) for a in p.partial)] if p.partial else x
        res.append(whole[_piece(p, x.shape, mesh, r)])
    return res


def _assemble(pieces: list[np.ndarray], p: Placement, shape, mesh: Mesh) -> np.ndarray:
    """The global value from each rank's piece: pieces placed by their splits, summands added
    over the partial axes; ranks that differ only along unused axes must hold the same."""
    used = set(p.axes_used())
    out = np.zeros(shape, dtype=np.result_type(pieces[0].dtype, np.float64))
    for r in range(mesh.size):
        coords = dict(zip(mesh.names, mesh.coords(r)))
        twin = mesh.rank([0 if a not in used else coords[a] for a in mesh.names])
        if twin != r:
            np.testing.assert_array_equal(pieces[r], pieces[twin], err_msg=f"replicas {twin} and {r} differ")
            continue
        sl = _piece(p, shape, mesh, r)
        assert pieces[r].shape == out[sl].shape, (pieces[r].shape, out[sl].shape, p)
        out[sl] += pieces[r]
    return out


def _check(op: str, args: list[np.ndarray], attrs: dict, spec: DimSpec, placements: list[Placement],
           mesh: Mesh, rng) -> list[Placement]:
    types = [_type(a) for a in args]
    want = _run(op, args, attrs)
    res_types = OPS[op].infer_types(types, attrs)
    res = result_placements(spec, placements, types, mesh, res_types)
    assert not isinstance(res, Conflict), f"{op}: {res} for {[str(p) for p in placements]}"
    pieces = [_locals(a, p, mesh, rng) for a, p in zip(args, placements)]
    # A split averaged label leaves each rank n times its share (DimSpec.averages).
    n = average_factor(spec, placements, mesh)
    outs_by_rank = []
    for r in range(mesh.size):
        local = [pieces[i][r] for i in range(len(args))]
        la = spec.localize_attrs(attrs, [_type(a) for a in local], types)
        outs_by_rank.append([o * (1.0 / n) if o.dtype.kind == "f" else o for o in _run(op, local, la)])
    for k, (w, p) in enumerate(zip(want, res)):
        got = _assemble([o[k] for o in outs_by_rank], p, w.shape, mesh)
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-9,
                                   err_msg=f"{op} result {k} with {[str(q) for q in placements]} -> {p}")
    return res


def _split_placements(spec: DimSpec, args, assign: dict[str, tuple[str, ...]]) -> list[Placement]:
    return [Placement(tuple(assign.get(lab, ()) if lab is not None else () for lab in labels))
            for labels in spec.operands]


def _cases():
    for op, samples in SAMPLES.items():
        for i, s in enumerate(samples):
            yield pytest.param(op, s, id=f"{op}-{i}")


def _setup(op, sample):
    rng = np.random.default_rng(0)
    specs, attrs = sample
    args = [_array(s, rng) for s in specs]
    attrs = OPS[op].normalize_attrs(attrs)
    spec = sharding_spec(op, [_type(a) for a in args], attrs)
    assert spec is not None, f"{op} has no sharding rule"
    return rng, args, attrs, spec


@pytest.mark.parametrize("op,sample", list(_cases()))
def test_rule_matches_reference(op, sample):
    rng, args, attrs, spec = _setup(op, sample)
    mesh1, mesh2 = Mesh.of("x=2"), Mesh.of("a=2,b=2")
    # A split ranged label runs the op's local form (with collectives), not the op itself:
    # tests/parallel/test_local_forms.py checks those on the simulated mesh.
    labels = [lab for lab in spec.splittable() if lab not in spec.ranged]
    results = []
    for lab in labels:
        pl = _split_placements(spec, args, {lab: ("x",)})
        results.append(_check(op, args, attrs, spec, pl, mesh1, rng))
    # Every split of a label is visible in some result: as a split dim or a partial sum.
    for lab, res in zip(labels, results):
        assert any(p.partial or any(p.dims) for p in res), f"{op}: splitting {lab} left every result replicated"
    for l1, l2 in itertools.islice(itertools.combinations(labels, 2), 3):
        _check(op, args, attrs, spec, _split_placements(spec, args, {l1: ("a",), l2: ("b",)}), mesh2, rng)
    for lab in labels:
        sizes = {a.shape[d] for a, ls in zip(args, spec.operands) for d, x in enumerate(ls) if x == lab}
        if all(n % 4 == 0 for n in sizes):
            _check(op, args, attrs, spec, _split_placements(spec, args, {lab: ("a", "b")}), mesh2, rng)
            break
    # Partial sums through the linear operands.
    if spec.linear:
        groups = [sorted(spec.linear)] if spec.joint else [[i] for i in sorted(spec.linear)]
        for g in groups:
            pl = [Placement(Placement.replicated(a.ndim).dims, ("x",) if i in g else ())
                  for i, a in enumerate(args)]
            res = _check(op, args, attrs, spec, pl, mesh1, rng)
            assert all(p.partial == ("x",) for p in res)
            if labels:  # a partial operand alongside a split label on another axis
                pl2 = [Placement(p.dims, ("a",) if p.partial else ()) for p in
                       _split_placements(spec, args, {labels[0]: ("b",)})]
                pl2 = [Placement(q.dims, ("a",) if i in g else ()) for i, q in enumerate(pl2)]
                _check(op, args, attrs, spec, pl2, mesh2, rng)


def test_every_op_is_accounted_for():
    missing = sorted(n for n, o in OPS.items()
                     if o.sharding is None and n not in WITHOUT_RULE and not _is_collective_module(o))
    assert not missing, f"ops without a sharding rule and not in sharding.WITHOUT_RULE: {missing}"
    stale = sorted(n for n in WITHOUT_RULE if n not in OPS or OPS[n].sharding is not None)
    assert not stale, f"sharding.WITHOUT_RULE lists ops that have a rule (or do not exist): {stale}"
    # Only ops without operands stay without a rule: nothing flows into them.
    assert all(not OPS[n].operands and WITHOUT_RULE[n] for n in WITHOUT_RULE)
    # send's rule (any split, nothing pending) is checked in test_p2p.py: its reference runs
    # only on a mesh of ranks.
    untested = sorted(n for n, o in OPS.items() if o.sharding is not None and n not in SAMPLES
                      and not _is_collective_module(o))
    assert not untested, f"ops with a rule but no sample: {untested}"
    # The collectives have no rule (the passes insert them, placed as the reshard they
    # implement); of the point-to-point ops only send has one.
    assert all(OPS[n].sharding is None for n in OPS if _is_collective_module(OPS[n]) and n != "send")


def _conflict(op, arg_types, attrs, placements, mesh="x=2"):
    attrs = OPS[op].normalize_attrs(attrs)
    spec = sharding_spec(op, arg_types, attrs)
    res = result_placements(spec, placements, arg_types, Mesh.of(mesh), OPS[op].infer_types(arg_types, attrs))
    assert isinstance(res, Conflict), f"{op}: expected a conflict, got {res}"
    return res


F = DTYPES["f32"]


def T(*shape):
    return TensorType(tuple(shape), F)


def test_softmax_axis_split_is_a_conflict():
    c = _conflict("softmax", [T(4, 6)], {}, [Placement.split(2, {1: "x"})])
    assert "dim 1 of operand 0 may not be split" in str(c) and c.operands == (0,)


def test_disagreeing_operands_are_named():
    c = _conflict("add", [T(4, 6), T(4, 6)], {}, [Placement.split(2, {0: "x"}), Placement.split(2, {1: "x"})])
    assert c.operands == (0, 1) and c.label == "o0"
    c = _conflict("matmul", [T(4, 6), T(6, 2)], {}, [Placement.split(2, {1: "x"}), None])
    assert c.label == "k" and "operand 1 (unsplit)" in str(c)


def test_non_sum_reductions_refuse_a_split_reduced_dim():
    for op in ("max", "argmax", "prod"):
        c = _conflict(op, [T(4, 6)], {"axes": [1]}, [Placement.split(2, {1: "x"})])
        assert c.operands == (0,)
    _conflict("cumsum", [T(4, 6)], {"axis": 1}, [Placement.split(2, {1: "x"})])


def test_partial_operands_follow_linearity():
    p = Placement(((), ()), ("x",))
    _conflict("add", [T(4, 6), T(4, 6)], {}, [p, None])          # x + 2y, not x + y
    _conflict("mul", [T(4, 6), T(4, 6)], {}, [p, p])             # a product of sums
    _conflict("relu", [T(4, 6)], {}, [p])
    _conflict("div", [T(4, 6), T(4, 6)], {}, [None, p])
    _conflict("pad", [T(4, 6)], {"pads": [0, 0, 1, 0], "value": 1.0}, [p])
    c = _conflict("matmul", [T(4, 6), T(6, 2)], {}, [p, Placement.split(2, {1: "x"})])
    assert "replicated over 'x'" in str(c)
    ok = result_placements(sharding_spec("add", [T(4, 6)] * 2, {}), [p, p], [T(4, 6)] * 2, Mesh.of("x=2"))
    assert ok == [p]


def test_reshape_split_into_an_odd_leading_factor_is_a_conflict():
    c = _conflict("reshape", [T(6, 4)], {"shape": [3, 2, 4]}, [Placement.split(2, {0: "x"})])
    assert "does not divide" in str(c)


def test_reshape_labels_follow_the_factorization():
    attrs = OPS["reshape"].normalize_attrs({"shape": [4, 3, 2, 2]})
    spec = sharding_spec("reshape", [T(4, 6, 2, 1)], attrs)
    # 4 -> 4 kept; 6 -> (3, 2) split: the leading 3 keeps the label; 2 -> 2 kept; 1s never split.
    assert spec.operands == (("d0", "d1", "d2", None),)
    assert spec.results == (("d0", "d1", None, "d2"),)
    spec = sharding_spec("reshape", [T(2, 3, 4)], OPS["reshape"].normalize_attrs({"shape": [6, 4]}))
    assert spec.operands == (("d0", None, "d2"),) and spec.results == (("d0", "d2"),)


def test_dropout_in_training_splits_through_its_local_form():
    # The mask hashes the global index: a split training dropout runs local_forms.dropout (its
    # piece's origin; tests/parallel/test_dropout_split.py checks the values), and so does a
    # dropout that already is a piece (with an origin: a microbatch's), adding to it.
    attrs = OPS["dropout"].normalize_attrs({"train": True, "p": 0.5})
    spec = sharding_spec("dropout", [T(4, 6)], attrs)
    assert spec.ranged == {"d0", "d1"} and spec.local_form is not None
    piece = sharding_spec("dropout", [T(4, 6), TensorType((2,), i64)], dict(attrs, whole=(8, 6)))
    assert piece.operands == (("d0", "d1"), (None,)) and piece.local_form is not None


def test_localize_rewrites_size_attributes():
    spec = sharding_spec("reshape", [T(4, 6)], OPS["reshape"].normalize_attrs({"shape": [24]}))
    assert spec.localize_attrs({"shape": (24,)}, [T(2, 6)], [T(4, 6)])["shape"] == (12,)
    spec = sharding_spec("broadcast_to", [T(4, 1)], {"shape": (2, 4, 6)})
    assert spec.localize_attrs({"shape": (2, 4, 6)}, [T(2, 1)], [T(4, 1)])["shape"] == (2, 2, 6)
    spec = sharding_spec("squeeze", [T(2, 1, 4)], {"axes": None})
    assert spec.localize_attrs({"axes": None}, [T(1, 1, 4)], [T(2, 1, 4)])["axes"] == (1,)
    spec = sharding_spec("sum", [T(4, 6)], OPS["sum"].normalize_attrs({}))
    assert spec.localize_attrs({"axes": None, "keepdim": False}, [T(2, 6)], [T(4, 6)]) == \
        {"axes": None, "keepdim": False}


def test_attached_at_import():
    assert OPS["matmul"].sharding is not None and OPS["all_reduce"].sharding is None
    spec = sharding_spec("matmul", [T(4, 6), T(6, 2)], {})
    assert spec.sums == {"k"} and spec.results == (("m", "n"),)
    res = result_placements(spec, [Placement.split(2, {0: "dp", 1: "tp"}), Placement.split(2, {0: "tp"})],
                            [T(4, 6), T(6, 2)], Mesh.of("dp=2,tp=2"))
    assert res == [Placement((("dp",), ()), ("tp",))]


# --- what the rules allow: the splits training needs -----------------------------------------

def _spec(op, arg_types, attrs):
    return sharding_spec(op, arg_types, OPS[op].normalize_attrs(attrs))


def test_rules_split_what_training_needs():
    conv = {"padding": [1, 1]}
    assert set(_spec("conv2d", [T(2, 4, 5, 5), T(6, 4, 3, 3)], conv).splittable()) == {"n", "c", "o"}
    # With a bias every input-channel summand would add it; with groups the channel blocks
    # of x and of the weight do not line up.
    assert set(_spec("conv2d", [T(2, 4, 5, 5), T(6, 4, 3, 3), T(6)], conv).splittable()) == {"n", "o"}
    assert set(_spec("conv2d", [T(2, 4, 5, 5), T(4, 2, 3, 3)], {"groups": 2}).splittable()) == {"n"}
    spec = _spec("conv_transpose2d", [T(2, 4, 3, 3), T(4, 6, 2, 2)], {})
    assert spec.operands[1][:2] == ("c", "o") and spec.results[0][:2] == ("n", "o") and spec.sums == {"c"}
    spec = _spec("conv2d_grad", [T(2, 4, 3, 6), T(2, 4, 6, 6), T(4, 4, 3, 3)], {"stride": [2, 1], "padding": [1, 1]})
    assert set(spec.splittable()) == {"n", "o", "c"} and spec.linear == {0}
    assert set(_spec("conv2d_grad", [T(2, 4, 4, 4), T(2, 4, 5, 5), T(4, 2, 2, 2)],
                     {"groups": 2}).splittable()) == {"n"}
    spec = _spec("layer_norm_grad", [T(4, 8), T(4, 8), T(8)], {})
    assert spec.splittable() == ("d0",) and spec.results == (("d0", None), (None,), (None,)) and spec.sums == {"d0"}
    assert set(_spec("embedding_grad", [T(2, 4, 4), TensorType((2, 4), DTYPES["i64"])],
                     {"num_embeddings": 10}).splittable()) == {"i0", "i1", "e"}
    q = T(2, 4, 5, 4)
    assert _spec("attention_grad", [q, q, T(2, 4, 6, 4), T(2, 4, 6, 4), q, T(2, 4, 5)], {}).splittable() == ("b0", "b1")
    assert _spec("batch_norm_grad", [T(4, 2, 3, 3)] * 2 + [T(2)], {"training": True}).splittable() == ("c",)
    assert set(_spec("batch_norm_grad", [T(4, 2, 3, 3)] * 2 + [T(2)] * 3, {"training": False}).splittable()) == \
        {"n", "c", "s2", "s3"}
    i64 = TensorType((4,), DTYPES["i64"])
    for red in ("mean", "sum", "none"):
        spec = _spec("cross_entropy_grad", [T(4) if red == "none" else T(), T(4, 5), i64], {"reduction": red})
        # The classes split only through the distributed local form (vocab-parallel loss).
        assert spec.splittable() == ("t0", "c") and spec.results == ((("t0", "c")),) and spec.ranged == {"c"}
        assert spec.averages == ({"t0"} if red == "mean" else set())
    spec = _spec("cross_entropy", [T(4, 5), i64], {})
    assert spec.sums == spec.averages == {"t0"} and spec.ranged == {"c"} and spec.local_form is not None
    # A table split by rows is a vocab-parallel lookup: a partial result, by the local form.
    spec = _spec("embedding", [T(10, 4), TensorType((2, 4), DTYPES["i64"])], {})
    assert spec.sums == spec.ranged == {"v"} and spec.results == (("i0", "i1", "e"),)
    spec = _spec("mean", [T(4, 6)], {"axes": [1]})
    assert spec.sums == spec.averages == {"d1"} and spec.results == (("d0",),)


def test_a_summed_label_splits_the_results_that_carry_it():
    # layer_norm_grad's dx keeps the rows split; its dweight and dbias sum over them.
    mesh = Mesh.of("x=2")
    types = [T(4, 8), T(4, 8), T(8)]
    spec = _spec("layer_norm_grad", types, {})
    rows = Placement.split(2, {0: "x"})
    res = result_placements(spec, [rows, rows, None], types, mesh)
    assert res == [rows, Placement(((),), ("x",)), Placement(((),), ("x",))]
    # conv2d_grad: split output channels leave dx a pending sum; split input channels leave
    # dbias (which never reads x) whole on every rank.
    types = [T(2, 4, 4, 4), T(2, 4, 4, 4), T(4, 4, 1, 1)]
    spec = _spec("conv2d_grad", types, {})
    o = [Placement.split(4, {1: "x"}), None, Placement.split(4, {0: "x"})]
    assert result_placements(spec, o, types, mesh) == [Placement(((),) * 4, ("x",)), Placement.split(4, {0: "x"}),
                                                       Placement.split(1, {0: "x"})]
    c = [None, Placement.split(4, {1: "x"}), Placement.split(4, {1: "x"})]
    assert result_placements(spec, c, types, mesh) == [Placement.split(4, {1: "x"}), Placement.split(4, {1: "x"}),
                                                       Placement.replicated(1)]


def test_average_factor_counts_every_axis_of_an_averaged_label():
    mesh = Mesh.of("a=2,b=2")
    spec = _spec("mean", [T(8, 4)], {})
    assert average_factor(spec, [Placement.split(2, {0: "a", 1: "b"})], mesh) == 4
    assert average_factor(spec, [Placement.split(2, {0: ("a", "b")})], mesh) == 4
    assert average_factor(spec, [Placement.split(2, {1: "b"})], mesh) == 2
    assert average_factor(spec, [None], mesh) == 1
    # Only the averaged labels count: mean over dim 1 with the rows split is exact as is.
    assert average_factor(_spec("mean", [T(8, 4)], {"axes": [1]}), [Placement.split(2, {0: "a"})], mesh) == 1


# --- the partition applies the averages ----------------------------------------------------------

def _partition_and_run(g, inputs: dict, weights=None):
    """Propagate and partition ``g``, run it on its mesh: (per-rank graph, report, outputs by
    rank, the global outputs)."""
    weights = dict(g.weights) if weights is None else weights
    propagate(g)
    local, report = partition_with_report(g)
    partita.verify(local)
    mesh = g.mesh
    want = partita.run(g, inputs, weights)
    by_name = {v.name: v for v in g.inputs}
    inputs_by_rank = [{k: local_piece(a, by_name[k].placement, mesh, r) for k, a in inputs.items()}
                      for r in range(mesh.size)]
    outs = run_mesh(local, mesh, inputs_by_rank, shard_weights(g, weights, mesh))
    return local, report, outs, want


def test_partitioned_mean_on_a_2d_mesh_is_the_global_mean():
    g = partita.parse("""graph @m(%x: f32[8@dp,4@tp]) -> (f32[], f32[8,1]) mesh(dp=2, tp=2) {
      %all = mean(%x) : f32[]
      %row = mean(%x) {axes=[1], keepdim=true} : f32[8,1]
      return %all, %row
    }""")
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    local, report, outs, want = _partition_and_run(g, {"x": x})
    for r in range(4):
        np.testing.assert_allclose(outs[r][0], want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outs[r][1], local_piece(want[1], Placement.split(2, {0: "dp"}), g.mesh, r),
                                   rtol=1e-5)
    assert g.outputs[1].placement == Placement(((("dp",), ())), ("tp",))
    # One constant and one mul per averaging node, right after it: 1/4 for both dims, 1/2 for tp.
    scales = sorted(float(n.attrs["value"].array) for n in local.nodes if n.op == "constant")
    assert scales == [0.25, 0.5]
    for n in local.nodes:
        if n.op == "mean":
            (user,) = n.results[0].users
            assert user.op == "mul"
    assert {c.op for c in report.collectives} == {"all_reduce"}, report.text()


CE = """graph @ce(%z: f32[4@dp,5], %t: i64[4@dp]) -> (f32[], f32[4,5]) mesh(dp=2) {
  %loss = cross_entropy(%z, %t) {ignore_index=-1} : f32[]
  %one = full() {shape=[], value=1.0} : f32[]
  %dz = cross_entropy_grad(%one, %z, %t) {ignore_index=-1} : f32[4,5]
  return %loss, %dz
}"""


def test_cross_entropy_mean_is_global_when_ranks_ignore_equally():
    z = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    g = partita.parse(CE)
    local, report, outs, want = _partition_and_run(g, {"z": z, "t": np.array([0, -1, 3, -1])})
    assert [c.op for c in report.collectives] == ["all_reduce"] and report.collectives[0].value == "loss"
    for r in range(2):
        np.testing.assert_allclose(outs[r][0], want[0], rtol=1e-6)
        np.testing.assert_allclose(outs[r][1], want[1][2 * r:2 * r + 2], rtol=1e-6)
    # Uneven ignored targets: each rank's mean weighs its own kept targets (as DDP's
    # per-rank averaging does), which is not the global mean; documented, not hidden.
    t = np.array([-1, 2, 3, 1])
    g = partita.parse(CE)
    local, report, outs, want = _partition_and_run(g, {"z": z, "t": t})
    attrs = OPS["cross_entropy"].normalize_attrs({"ignore_index": -1})
    per_rank = [OPS["cross_entropy"].reference([z[2 * r:2 * r + 2], t[2 * r:2 * r + 2]], attrs) for r in range(2)]
    np.testing.assert_allclose(outs[0][0], np.mean(per_rank), rtol=1e-6)
    assert abs(float(outs[0][0]) - float(want[0])) > 1e-3


# --- data-parallel training steps, end to end --------------------------------------------------

def _torch_models():
    import torch
    from torch import nn
    import torch.nn.functional as F

    class LayerNormMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.ln, self.fc2 = nn.Linear(12, 16), nn.LayerNorm(16), nn.Linear(16, 5)

        def forward(self, x):
            return self.fc2(F.gelu(self.ln(self.fc1(x))))

    class CNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn = nn.Conv2d(3, 4, 3, 1, 1), nn.BatchNorm2d(4)
            self.conv2 = nn.Conv2d(4, 4, 3, 2, 1, bias=False)
            self.pool, self.fc = nn.MaxPool2d(2), nn.Linear(16, 5)

        def forward(self, x):
            x = F.relu(self.conv2(F.relu(self.bn(self.conv1(x)))))
            return self.fc(torch.flatten(self.pool(x), 1))

    return torch, LayerNormMLP, CNN


def _gpt2_case():
    pytest.importorskip("transformers")
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "autodiff"))
    try:
        from test_training import gpt2
    finally:
        sys.path.pop(0)
    import torch
    torch.manual_seed(0)
    return gpt2(1), torch.randint(0, 128, (2, 16)), torch.randint(0, 128, (2, 16))


def _case(name: str):
    torch, LayerNormMLP, CNN = _torch_models()
    torch.manual_seed(0)
    if name == "mlp_layer_norm":
        return LayerNormMLP(), torch.randn(8, 12), torch.randint(0, 5, (8,))
    if name == "cnn":
        return CNN(), torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
    return _gpt2_case()


@pytest.mark.parametrize("name", ["mlp_layer_norm", "cnn", "gpt2"])
def test_data_parallel_training_step_needs_only_gradient_all_reduces(name):
    model, x, target = _case(name)
    fwd = partita.import_torch(model.eval(), (x,))
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.5)
    step.mesh = Mesh.of("dp=2")
    (data,) = [v for v in step.inputs if v.role == "input" and v.name != "target"]
    for v in step.inputs:
        if v.role == "input":  # the batch and its targets, split by rows
            v.placement = Placement.split(v.type.rank, {0: "dp"})
    local, report, outs, want = _partition_and_run(step, {data.name: x.numpy(), "target": target.numpy()})
    # Every rank ends with the single-device step's loss and new params.
    for r in range(2):
        for i, v in enumerate(step.outputs):
            assert not any(v.placement.dims), f"output {i} is {v.placement}"
            np.testing.assert_allclose(outs[r][i], want[i], rtol=1e-5, atol=1e-6, err_msg=f"rank {r}, output {i}")
    # Communication: one all-reduce per gradient and one of the loss; activations never move.
    names = value_names(step)
    grads = {names[n.operands[1]] for n in step.nodes if n.op == "sgd_update"}
    params = [v for v in step.inputs if v.role == "param"]
    assert len(grads) == len(params)
    for c in report.collectives:
        assert (c.op, c.axis) == ("all_reduce", "dp") and (c.value in grads or c.value == "loss"), report.text()
    assert sorted(c.value for c in report.collectives) == sorted(grads | {"loss"}), report.text()


def test_channel_parallel_convolutions_need_one_all_reduce():
    # Output channels split in the first convolution, input channels in the second (no
    # bias): the activations stay split, and the second's partial sums are reduced once.
    g = partita.parse("""graph @cnn(%x: f32[2,4,6,6], %w1: f32[8@tp,4,3,3] param, %b1: f32[8] param,
                                    %w2: f32[4,8@tp,3,3] param) -> (f32[2,4,6,6]) mesh(tp=2) {
      %a = conv2d(%x, %w1, %b1) {padding=[1, 1]} : f32[2,8,6,6]
      %h = relu(%a) : f32[2,8,6,6]
      %y = conv2d(%h, %w2) {padding=[1, 1]} : f32[2,4,6,6]
      return %y
    }""")
    rng = np.random.default_rng(2)
    weights = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs if v.role == "param"}
    local, report, outs, want = _partition_and_run(g, {"x": rng.standard_normal((2, 4, 6, 6)).astype(np.float32)},
                                                   weights)
    assert [(c.op, c.value) for c in report.collectives] == [("all_reduce", "y")], report.text()
    # The bias follows its output channels; the activations stay split by channels.
    h = next(n for n in g.nodes if n.op == "relu").results[0]
    assert str(g.inputs[2].placement) == "[tp]" and str(h.placement) == "[-, tp, -, -]"
    for r in range(2):
        np.testing.assert_allclose(outs[r][0], want[0], rtol=1e-5, atol=1e-5)
