"""The ONNX converter registry: which op types the importer claims, and how they got there.

Every converter module of partita/frontend/onnx/ registers its converters with the
``converter`` decorator when the package is imported; nothing else writes the table."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from partita.frontend import onnx as onnx_frontend
from partita.frontend.onnx import CONSTANT_OPERANDS, CONVERTER_MODULES, ONNX_TO_PARTITA, SEQUENCE_OPERANDS, converter

PACKAGE = Path(onnx_frontend.__file__).parent

# The 158 ONNX op types the importer claimed when the converters were moved into the package.
CLAIMED = {
    "Abs", "Acos", "Acosh", "Add", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh", "Attention",
    "AveragePool", "BatchNormalization", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor",
    "Cast", "CastLike", "Ceil", "Celu", "Clip", "Concat", "ConcatFromSequence", "Constant",
    "ConstantOfShape", "Conv", "ConvTranspose", "Cos", "Cosh", "CumProd", "CumSum", "DepthToSpace",
    "DequantizeLinear", "Div", "Dropout", "DynamicQuantizeLinear", "Einsum", "Elu", "Equal", "Erf", "Exp",
    "Expand", "EyeLike", "Flatten", "Floor", "GRU", "Gather", "GatherElements", "GatherND", "Gelu", "Gemm",
    "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "Greater", "GreaterOrEqual", "GroupNormalization",
    "HardSigmoid", "HardSwish", "Hardmax", "Identity", "InstanceNormalization", "IsInf", "IsNaN", "LRN",
    "LSTM", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log", "LogSoftmax",
    "LpNormalization", "LpPool", "MatMul", "MatMulInteger", "Max", "MaxPool", "Mean",
    "MeanVarianceNormalization", "Min", "Mish", "Mod", "Mul", "Neg", "NegativeLogLikelihoodLoss", "Not",
    "OneHot", "Or", "PRelu", "Pad", "Pow", "QuantizeLinear", "RMSNormalization", "RNN", "Range",
    "Reciprocal", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare", "Relu", "Reshape", "Resize",
    "ReverseSequence", "RotaryEmbedding", "Round", "Scatter", "ScatterElements", "ScatterND", "Selu",
    "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert", "SequenceLength",
    "Shape", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Size", "Slice", "Softmax",
    "SoftmaxCrossEntropyLoss", "Softplus", "Softsign", "SpaceToDepth", "Split", "SplitToSequence", "Sqrt",
    "Squeeze", "Sub", "Sum", "SwiGLU", "Swish", "Tan", "Tanh", "ThresholdedRelu", "Tile", "TopK",
    "Transpose", "Trilu", "Unsqueeze", "Upsample", "Where", "Xor"
}
# The op types added since then.
ADDED = {"Col2Im"}

FAMILIES = {"conv", "index", "layout", "math", "nn", "quant", "sequence"}


def test_the_registry_holds_the_claimed_op_types():
    """The package claims exactly the op types it claimed as one module, and those added since."""
    assert len(CLAIMED) == 158
    assert set(ONNX_TO_PARTITA) == CLAIMED | ADDED


def test_every_converter_was_registered_by_a_family_module_decorator():
    """Each op type's converter was registered by ``converter`` (which records the module) in
    one of the family modules, and is the function that module defines."""
    assert set(CONVERTER_MODULES) == set(ONNX_TO_PARTITA)
    for op, fn in ONNX_TO_PARTITA.items():
        module = CONVERTER_MODULES[op]
        assert module.rsplit(".", 1) == ["partita.frontend.onnx", module.rsplit(".", 1)[-1]], (op, module)
        assert module.rsplit(".", 1)[-1] in FAMILIES, (op, module)
        assert fn.__module__ == module, (op, fn)
        assert getattr(importlib.import_module(module), fn.__name__) is fn, (op, fn.__name__)


def test_operand_tables_name_registered_op_types_only():
    assert set(CONSTANT_OPERANDS) <= set(ONNX_TO_PARTITA)
    assert set(SEQUENCE_OPERANDS) <= set(ONNX_TO_PARTITA)


def test_no_module_writes_the_tables_directly():
    """The tables are filled by the decorator only: no module of the package assigns to them
    or updates them."""
    tables = {"ONNX_TO_PARTITA", "CONSTANT_OPERANDS", "SEQUENCE_OPERANDS", "CONVERTER_MODULES"}
    mutators = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__"}
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name == "registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                assert not (isinstance(node.value, ast.Name) and node.value.id in tables), (path.name, node.lineno)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in mutators:
                target = node.func.value
                assert not (isinstance(target, ast.Name) and target.id in tables), (path.name, node.lineno)


def test_an_op_type_registered_twice_is_refused():
    with pytest.raises(ValueError, match="Relu is registered twice"):
        converter("Relu")(lambda n: [n.input(0)])
    assert CONVERTER_MODULES["Relu"] == "partita.frontend.onnx.math"
