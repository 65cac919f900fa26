"""Import an ONNX model (opset 13 and newer) into a partita Graph.

    g = import_onnx("model.onnx")            # or a ModelProto
    outs = partita.run(g, [x])

The package:

- ``importer``: the graph walk (``import_onnx``, ``load_onnx``/``OnnxModel``), the value
  table, constant propagation, and the checks of the model file;
- ``common``: what converters and the importer share (``OnnxNode``, ``OnnxImportError``,
  element types, tensor data, window and axes helpers);
- ``registry``: ``ONNX_TO_PARTITA`` (op type -> converter) and the ``converter`` decorator
  that fills it;
- the converter families, each registering its converters at import: ``math``
  (elementwise, activations, logic, Gemm), ``layout`` (creation, cast, shape and layout),
  ``index`` (reductions, scans, gathers and scatters), ``conv`` (convolution and pooling),
  ``nn`` (normalizations, softmax, Einsum, losses, attention, recurrent layers, Resize),
  ``sequence`` (sequence ops, unrolled at import) and ``quant`` (quantization);
- ``backend``: ONNX's backend interface over partita, for ONNX's conformance suite (it needs
  the ``onnx`` package at import, so it is not imported here).

Importing this package imports every converter family, so the table is complete whatever
the caller imported. Semantic choices are described in docs/onnx.md.
"""

from __future__ import annotations

# The converter families register their converters in ONNX_TO_PARTITA when imported.
from . import conv, index, layout, math, nn, quant, sequence  # noqa: F401
from .common import ONNX_DTYPES, AnyConverter, Converter, OnnxImportError, OnnxNode
from .importer import (MIN_OPSET, OnnxModel, OnnxOpsetUpgradeWarning, constant_operand_inputs, convert_to_min_opset,
                       import_onnx, known_shape_and_type, load_onnx, opset_of)
from .registry import CONSTANT_OPERANDS, CONVERTER_MODULES, ONNX_TO_PARTITA, SEQUENCE_OPERANDS, converter

__all__ = [
    "AnyConverter", "CONSTANT_OPERANDS", "CONVERTER_MODULES", "Converter", "MIN_OPSET", "ONNX_DTYPES",
    "ONNX_TO_PARTITA", "OnnxImportError", "OnnxModel", "OnnxNode", "OnnxOpsetUpgradeWarning", "SEQUENCE_OPERANDS",
    "constant_operand_inputs", "convert_to_min_opset", "converter", "import_onnx", "known_shape_and_type",
    "load_onnx", "opset_of",
]
