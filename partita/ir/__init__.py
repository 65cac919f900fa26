"""partita's IR: dtypes, tensor types, meshes and placements, the SSA graph, its text form and
its verifier."""

from .attrs import DenseAttr
from .builder import Builder
from .diagnostics import (ExecutionError, GraphEditError, ParseError, PartitaError, PassError,
                          TypeRuleError, UnknownOpError, VerifyError, WeightsError)
from .dtypes import DTYPES, DType, bf16, bool_, f16, f32, f64, i8, i16, i32, i64, promote, u8
from .graph import Graph, Node, Value
from .mesh import Mesh, MeshError
from .parser import parse, parse_file
from .placement import Placement, PlacementError
from .printer import print_graph
from .types import Location, TensorType
from .verifier import verify
from .weights import Weights

__all__ = [
    "DenseAttr", "Builder", "ExecutionError", "GraphEditError", "ParseError", "PartitaError", "PassError",
    "TypeRuleError", "UnknownOpError", "VerifyError", "WeightsError", "DTYPES", "DType", "bf16", "bool_",
    "f16", "f32", "f64", "i8", "i16", "i32", "i64", "promote", "u8", "Graph", "Node", "Value", "parse",
    "parse_file", "print_graph", "Location", "TensorType", "verify", "Weights", "Mesh", "MeshError",
    "Placement", "PlacementError",
]
