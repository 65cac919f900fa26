"""Import an ONNX model (opset 13 and newer) into a partita Graph.

    g = import_onnx("model.onnx")            # or a ModelProto
    outs = partita.run(g, [x])

Graph inputs that are not initializers become ``input`` values; initializers become
``param`` inputs whose arrays go to ``graph.weights``. Every ONNX node is converted by the
one entry for its op type in ``ONNX_TO_PARTITA``; the partita Builder infers each result
type, and the importer compares it with ONNX's own shape inference wherever that is known.
Semantic choices are described in docs/onnx.md.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Container, Mapping, Sequence

import numpy as np

from ...ir import dtypes as dt
from ...ir.attrs import DenseAttr
from ...ir.builder import Builder
from ...ir.graph import Graph, Node, Value
from ...ir.types import Location, TensorType
from .common import (ONNX_DTYPES, SMALL_CONST, OnnxImportError, OnnxNode, np_for_partita, onnx_dtype, onnx_package,
                     tensor_array)
from .registry import CONSTANT_OPERANDS, ONNX_TO_PARTITA, SEQUENCE_OPERANDS

MIN_OPSET = 13


_NAME_BAD = re.compile(r"[^A-Za-z0-9_.]")


def _sanitize(name: str, taken: set[str]) -> str:
    """A .pir-printable input name for an ONNX name (which may hold ':' or '/')."""
    base = _NAME_BAD.sub("_", name) or "v"
    if not (base[0].isalpha() or base[0] == "_"):
        base = "v" + base
    out, k = base, 1
    while out in taken:
        out, k = f"{base}_{k}", k + 1
    taken.add(out)
    return out


def constant_operand_inputs(model: Any) -> list[str]:
    """Names of graph inputs (not initializers) whose values an operand in CONSTANT_OPERANDS
    depends on, directly or through the nodes that compute it (a function body's shape
    arithmetic); the walk skips the inputs whose values are not read (Shape's, Size's,
    CastLike's second).

    A caller that knows their values (a test harness, a specializing runtime) passes them
    as ``static_inputs`` to ``import_onnx``.
    """
    g = model.graph
    inits = {t.name for t in g.initializer}
    graph_inputs = {vi.name for vi in g.input} - inits
    producer = {name: node for node in g.node for name in node.output if name}
    out: list[str] = []
    seen: set[str] = set()
    for node in g.node:
        stack = [node.input[i] for i in CONSTANT_OPERANDS.get(node.op_type, ()) if i < len(node.input)]
        while stack:
            name = stack.pop()
            if not name or name in seen:
                continue
            seen.add(name)
            if name in graph_inputs:
                out.append(name)
            elif name in producer:
                node_in = producer[name]
                free = _VALUE_FREE_INPUTS.get(node_in.op_type, ())
                stack.extend(x for k, x in enumerate(node_in.input) if k not in free)
    return out


# Largest input (in elements) constant propagation evaluates a node on.
_FOLD_INPUT_LIMIT = 1 << 16
# Inputs of which an op reads only the type or shape, never the values: they need not be
# known for the op to fold, nor bound for an operand computed from them.
_VALUE_FREE_INPUTS: dict[str, tuple[int, ...]] = {"CastLike": (1,), "Shape": (0,), "Size": (0,), "EyeLike": (0,)}
# Op types whose result's shape or values depend on data in ways import does not evaluate.
_DATA_DEPENDENT = frozenset({"NonZero", "Unique", "Compress", "NonMaxSuppression", "TopK", "RandomNormal",
                             "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"})


# --- the importer -------------------------------------------------------------------------

def _load(model: Any) -> tuple[Any, str, str | None]:
    """(ModelProto, the name errors use, the folder external data is read from: None for a
    ModelProto given in memory)."""
    onnx = onnx_package()
    if isinstance(model, onnx.ModelProto):
        if not model.HasField("graph"):
            raise OnnxImportError("<onnx>: the ModelProto has no graph")
        return model, "<onnx>", None
    try:
        path = os.fspath(model)
    except TypeError:
        raise OnnxImportError(f"import_onnx takes a path or an onnx.ModelProto, not {type(model).__name__}") from None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise OnnxImportError(f"{path}: cannot read the ONNX file: {e.strerror}") from None
    if not data:
        raise OnnxImportError(f"{path}: the file is empty, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:
        raise OnnxImportError(f"{path}: not a valid ONNX model (the protobuf does not parse: {e}); "
                              "the file is corrupt or truncated") from None
    if not proto.HasField("graph") or len(proto.opset_import) == 0:
        raise OnnxImportError(f"{path}: not a valid ONNX model (no graph or no opset_import); "
                              "the file is corrupt, truncated or not ONNX")
    return proto, path, os.path.dirname(os.path.abspath(path))


class OnnxOpsetUpgradeWarning(UserWarning):
    """A model of an opset older than MIN_OPSET was upgraded with ``onnx.version_converter``."""


def _foreign_ops(proto: Any) -> dict[str, list[str]]:
    """'domain::OpType' -> the names of the nodes of a domain other than the default one."""
    out: dict[str, list[str]] = {}
    for i, node in enumerate(proto.graph.node):
        if node.domain not in ("", "ai.onnx"):
            out.setdefault(f"{node.domain}::{node.op_type}", []).append(node.name or f"#{i + 1}")
    return out


def _listed(ops: Mapping[str, list[str]]) -> str:
    return "; ".join(f"{op} (nodes: {', '.join(names)})" for op, names in sorted(ops.items()))


def opset_of(proto: Any, where: str) -> int:
    """The default-domain opset version ``proto`` imports; an error naming ``where`` if it imports none,
    several, or one newer than the installed onnx knows."""
    versions = sorted({int(imp.version) for imp in proto.opset_import if imp.domain in ("", "ai.onnx")})
    if not versions:
        foreign = _foreign_ops(proto)
        if foreign:
            domains = sorted({op.split("::")[0] for op in foreign})
            raise OnnxImportError(f"{where}: the model's nodes are all in the domain(s) {', '.join(domains)}, which "
                                  f"partita does not import (it imports the default ai.onnx domain); unsupported "
                                  f"op type(s): {_listed(foreign)}")
        raise OnnxImportError(f"{where}: the model imports no default-domain (ai.onnx) opset")
    if len(versions) > 1:
        raise OnnxImportError(f"{where}: the model imports the default domain (ai.onnx) at several opsets "
                              f"{versions}; a model imports each domain once")
    version = versions[0]
    newest = int(onnx_package().defs.onnx_opset_version())
    if version > newest:
        raise OnnxImportError(f"{where}: the model uses opset {version}, newer than the newest the installed onnx "
                              f"package knows ({newest}), so its operators' definitions are unknown: upgrade "
                              f"onnx, or export the model at opset {newest} or older")
    return version


def convert_to_min_opset(proto: Any, where: str, version: int) -> Any:
    """``proto`` converted to opset MIN_OPSET by ONNX's version converter, with a warning."""
    import warnings

    from onnx import version_converter

    try:
        out = version_converter.convert_version(proto, MIN_OPSET)
    except Exception as e:  # the converter raises bare RuntimeErrors from C++
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OnnxImportError(f"{where}: the model uses opset {version} and ONNX's version converter cannot "
                              f"upgrade it to opset {MIN_OPSET}: {first}; export the model again at opset "
                              f"{MIN_OPSET} or newer") from None
    warnings.warn(f"{where}: the model uses opset {version}; partita upgraded it to opset {MIN_OPSET} with "
                  "onnx.version_converter (save the upgraded model to skip this step next time)",
                  OnnxOpsetUpgradeWarning, stacklevel=3)
    return out


def _tensor_type(vi: Any, what: str, overrides: Mapping[str, Sequence[int]]) -> TensorType:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        if vi.type.HasField("sequence_type"):
            raise OnnxImportError(f"{what} '{vi.name}' is a sequence: sequence-typed graph inputs/outputs "
                                  "are not supported: partita's values are tensors (sequences built inside "
                                  "the graph are unrolled at import time)")
        raise OnnxImportError(f"{what} '{vi.name}' is not a tensor (sequences, maps and optionals "
                              "are not supported)")
    dtype = onnx_dtype(tt.elem_type, f"{what} '{vi.name}'")
    if vi.name in overrides:
        fixed = tuple(int(s) for s in overrides[vi.name])
        if tt.HasField("shape") and len(tt.shape.dim) != len(fixed):
            declared = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
            raise OnnxImportError(f"{what} '{vi.name}' has rank {len(declared)} ({declared}); the shape given for "
                                  f"it, {list(fixed)}, has rank {len(fixed)}")
        return TensorType(fixed, dtype)
    if not tt.HasField("shape"):
        raise OnnxImportError(f"{what} '{vi.name}' has no shape; pass input_shapes={{'{vi.name}': [...]}}")
    shape = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            sym = d.dim_param or "?"
            raise OnnxImportError(f"{what} '{vi.name}' has a symbolic dim '{sym}'; partita shapes are static: "
                                  f"pass input_shapes={{'{vi.name}': [...]}}")
        if d.dim_value < 0:
            raise OnnxImportError(f"{what} '{vi.name}' has a negative dim {d.dim_value}; the model is malformed")
        shape.append(int(d.dim_value))
    return TensorType(tuple(shape), dtype)


def known_shape_and_type(vi: Any) -> tuple[tuple[int, ...] | None, int]:
    """(shape if every dim is known, element type) of a value_info; 0 elem type = unknown."""
    if not vi.type.HasField("tensor_type"):
        return None, 0
    tt = vi.type.tensor_type
    if not tt.HasField("shape") or not all(d.HasField("dim_value") for d in tt.shape.dim):
        return None, tt.elem_type
    return tuple(int(d.dim_value) for d in tt.shape.dim), tt.elem_type


class _Importer:
    def __init__(self, proto: Any, where: str, opset: int, base_dir: str | None = None) -> None:
        self.proto, self.where, self.opset = proto, where, opset
        # The folder external tensor data is read from (None: a ModelProto given in memory).
        self.base_dir = base_dir
        # What defined each ONNX value name, for the error on a second definition.
        self.defined: dict[str, str] = {}
        self.graph = Graph(_NAME_BAD.sub("_", proto.graph.name) or "main")
        self.b = Builder(self.graph)
        self.values: dict[str, Value] = {}
        self.consts: dict[str, np.ndarray] = {}
        # The node that defines each ONNX value name (for why_not_constant).
        self.producers: dict[str, Any] = {}
        # Graph inputs bound to values (static_inputs): constants, not weights.
        self.static_names: set[str] = set()
        # Sequence-typed ONNX values, unrolled: each is a Python list of tensor Values.
        self.seqs: dict[str, list[Value]] = {}

    def run(self, input_shapes: dict[str, Sequence[int]], static: dict[str, np.ndarray]) -> Graph:
        g = self.proto.graph
        unknown: dict[str, list[str]] = {}
        readers: dict[str, Any] = {}  # the first node that reads each name, for the initializers' errors
        for i, node in enumerate(g.node):
            for name in node.input:
                readers.setdefault(name, node)
            if node.domain not in ("", "ai.onnx") or node.op_type not in ONNX_TO_PARTITA:
                op = node.op_type or "(empty op_type)"
                key = op if node.domain in ("", "ai.onnx") else f"{node.domain}::{op}"
                unknown.setdefault(key, []).append(node.name or f"#{i}")
        if unknown:
            listed = "; ".join(f"{op} (nodes: {', '.join(names)})" for op, names in sorted(unknown.items()))
            raise OnnxImportError(f"{self.where}: unsupported ONNX op type(s): {listed}. Supported: "
                                  f"{', '.join(sorted(ONNX_TO_PARTITA))}")
        if not g.output:
            raise OnnxImportError(f"{self.where}: the graph declares no outputs; a model returns at least one value")
        taken: set[str] = set()
        inits: dict[str, np.ndarray] = {}
        for k, t in enumerate(g.initializer):
            self._check_name(t.name, k, inits, "initializer", "defined")
            what = f"{self.where}: initializer '{t.name}'"
            if t.name in readers:
                reader = readers[t.name]
                what += f", read by node '{reader.name or '<unnamed>'}' ({reader.op_type})"
            inits[t.name] = tensor_array(t, what, self.base_dir)
        seen: set[str] = set()
        for k, vi in enumerate(g.input):
            self._check_name(vi.name, k, seen, "graph input", "declared")
            seen.add(vi.name)
        for name in static:
            if name not in seen or name in inits:
                raise OnnxImportError(f"{self.where}: static input '{name}' is not a graph input")
        inits.update(static)
        inputs = [vi.name for vi in g.input if vi.name not in inits]
        shapes: dict[str, list[int]] = {}
        for name, shape in input_shapes.items():
            if name not in inputs:
                known = ", ".join(f"'{x}'" for x in inputs) or "none"
                why = " (it is an initializer, whose data fixes its shape)" if name in inits else ""
                raise OnnxImportError(f"{self.where}: a shape is given for '{name}', which is not an input of the "
                                      f"model{why}; its inputs are: {known}")
            dims: list[Any]
            try:
                dims = list(shape)
            except TypeError:
                dims = [shape]
            if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
                raise OnnxImportError(f"{self.where}: the shape given for input '{name}', {dims}, must be a list "
                                      "of non-negative integer sizes")
            shapes[name] = [int(d) for d in dims]
        for vi in g.input:
            if vi.name in inits:
                continue
            t = _tensor_type(vi, f"{self.where}: graph input", shapes)
            self.values[vi.name] = self.b.input(_sanitize(vi.name, taken), t)
            self.defined[vi.name] = "a graph input"
        for name, init in inits.items():
            arr = np_for_partita(np.asarray(init), f"{self.where}: initializer '{name}'")
            self.defined[name] = "an initializer" if name not in static else "a static input"
            pname = _sanitize(name, taken)
            if name in static:
                self.static_names.add(pname)
            self.values[name] = self.b.param(pname, TensorType(tuple(arr.shape), dt.from_numpy(arr.dtype)))
            self.graph.weights[pname] = arr
            self.consts[name] = arr
        expected = {vi.name: vi for vi in list(g.value_info) + list(g.output)}
        for i, node in enumerate(g.node):
            self._convert(i, node, expected)
        outs = []
        for vi in g.output:
            if vi.name in self.seqs or vi.type.HasField("sequence_type"):
                raise OnnxImportError(f"{self.where}: graph output '{vi.name}' is a sequence: sequence-typed "
                                      "graph inputs/outputs are not supported: partita's values are tensors "
                                      "(return its elements, or ConcatFromSequence, instead)")
            if vi.name not in self.values:
                raise OnnxImportError(f"{self.where}: graph output '{vi.name}' is produced by no node "
                                      "(the model is malformed or truncated)")
            outs.append(self.values[vi.name])
        self.b.ret(*outs)
        self._erase_unread()
        return self.graph

    def _erase_unread(self) -> None:
        """Erase the ops whose results nothing reads (the constants that fed a Reshape target,
        the shape arithmetic constant propagation replaced), keeping any op with effects."""
        from ...ops.registry import get_op

        for node in list(self.graph.reversed_nodes()):
            if not any(r.has_uses for r in node.results) and not get_op(node.op).effects:
                self.graph.erase(node)

    def _check_name(self, name: str, k: int, seen: Container[str], what: str, verb: str) -> None:
        """Entry ``k`` of the graph's initializers or inputs has a name, not one of ``seen``."""
        if not name:
            raise OnnxImportError(f"{self.where}: {what} #{k + 1} has no name; every {what.split()[-1]} needs one")
        if name in seen:
            raise OnnxImportError(f"{self.where}: {what} '{name}' is {verb} twice; ONNX value names must be unique")

    def _convert(self, i: int, node: Any, expected: dict[str, Any]) -> None:
        loc = Location(self.where, i + 1)
        n = OnnxNode(node, i, [], {}, self, loc)
        for name in node.output:
            if name in self.defined:
                raise n.error(f"output '{name}' is already defined by {self.defined[name]}; ONNX value names "
                              "must be unique (each value is assigned once)")
            if name:
                self.defined[name] = f"node '{node.name or '<unnamed>'}' ({node.op_type}, node {i + 1})"
                self.producers[name] = node
        ins: list[Value | None] = []
        for name in node.input:
            if name == "":
                ins.append(None)
            elif name in self.seqs:
                if node.op_type not in SEQUENCE_OPERANDS or len(ins) not in SEQUENCE_OPERANDS[node.op_type]:
                    raise OnnxImportError(f"{loc}: node '{node.name}' ({node.op_type}) reads sequence '{name}' as "
                                          f"input {len(ins)}; the importer unrolls sequences only into "
                                          f"{', '.join(sorted(SEQUENCE_OPERANDS))} (partita's values are tensors)")
                ins.append(None)  # the converter reads it with n.seq(i)
            elif name in self.values:
                ins.append(self.values[name])
            else:
                raise OnnxImportError(f"{loc}: node '{node.name}' ({node.op_type}) reads '{name}', which no "
                                      "earlier node, input or initializer defines (the graph is not "
                                      "topologically sorted, or the model is malformed or truncated)")
        n.inputs, n.attrs = ins, self._attributes(n)
        before = self.graph.last
        outs = ONNX_TO_PARTITA[node.op_type](n)
        free = _VALUE_FREE_INPUTS.get(node.op_type, ())
        if node.input and all(name == "" or name in self.consts or k in free for k, name in enumerate(node.input)):
            outs = self._fold(n, before, outs)
        for k, name in enumerate(node.output):
            if name == "":
                continue
            if k >= len(outs) or outs[k] is None:
                raise n.error(f"output {k} ('{name}') is not supported by the importer")
            v = outs[k]
            assert v is not None
            if isinstance(v, list):
                self.seqs[name] = v
                continue
            if name in expected:
                shape, elem = known_shape_and_type(expected[name])
                want_dt = ONNX_DTYPES.get(elem) if elem else None
                if (shape is not None and shape != v.type.shape) or (want_dt is not None and want_dt is not v.type.dtype):
                    want = f"{want_dt.name if want_dt else '?'}{list(shape) if shape is not None else '[?]'}"
                    raise n.error(f"output '{name}': partita infers {v.type} but ONNX shape inference says "
                                  f"{want}; the importer maps this op incorrectly or the model is invalid")
            self.values[name] = v


    def why_not_constant(self, name: str) -> str:
        """Why the ONNX value ``name`` has no known array: the chain of nodes back to the graph
        input or the node whose result is computed at run time."""
        chain: list[str] = []
        seen: set[str] = set()
        while name not in seen:
            seen.add(name)
            if name not in self.producers:
                path = f" (through {' <- '.join(chain)})" if chain else ""
                return (f"it depends on graph input '{name}'{path}, whose value is known only at run time; "
                        f"bind it with static_inputs={{'{name}': ...}} if it is fixed")
            node = self.producers[name]
            label = f"node '{node.name or '<unnamed>'}' ({node.op_type})"
            free = _VALUE_FREE_INPUTS.get(node.op_type, ())
            unknown = [x for k, x in enumerate(node.input) if x and x not in self.consts and k not in free]
            if not unknown:
                why = ("its result depends on its inputs' values in a way partita does not evaluate at "
                       "import" if node.op_type in _DATA_DEPENDENT else
                       f"its inputs are constants but it was not evaluated at import (a result larger than "
                       f"{SMALL_CONST} elements, a float computed from a weight, or an op with effects)")
                path = f" (through {' <- '.join(chain)})" if chain else ""
                return f"it is computed from {label}{path}: {why}"
            chain.append(label)
            name = unknown[0]
        return "it is defined in a cycle (the model is malformed)"

    def _fold(self, n: OnnxNode, before: Node | None, outs: Sequence[Any]) -> Sequence[Any]:
        """Constant propagation: a node whose inputs are all known arrays (initializers,
        Constants, Shape of a static shape, and what earlier folds computed) is evaluated at
        import with the NumPy references of the ops its converter emitted, so a Reshape
        target computed as ``Shape -> Gather -> Concat`` or an Expand shape from ``Where``
        is a constant the converters can read. Small results (at most SMALL_CONST elements)
        are kept; the emitted ops are then replaced by one constant per output. Weights stay
        parameters: a float result computed from a parameter is not folded."""
        from ...backend.numpy_ref import run_node_reference
        from ...ops.registry import get_op

        emitted = []
        node = before.next if before is not None else self.graph.first
        while node is not None:
            emitted.append(node)
            node = node.next
        if any(get_op(e.op).effects for e in emitted):
            return outs
        env: dict[int, np.ndarray] = {}
        from_param = False
        for name in n.proto.input:
            if name and name in self.consts:
                v = self.values[name]
                if self.consts[name].size > _FOLD_INPUT_LIMIT:
                    return outs
                from_param = from_param or (v.is_input and v.name not in self.static_names)
                env[id(v)] = self.consts[name]
        for e in emitted:
            args = []
            for v in e.operands:
                if id(v) not in env:
                    return outs  # reads a value that is not known (cannot happen for a pure converter)
                args.append(env[id(v)])
            try:
                res = run_node_reference(e, args)
            except Exception:  # noqa: BLE001: not foldable here; the executor reports it at run time
                return outs
            for r, a in zip(e.results, res):
                env[id(r)] = np.asarray(a)
        tensors = [(k, v) for k, v in enumerate(outs) if isinstance(v, Value)]
        if not tensors or any(isinstance(v, list) for v in outs):
            return outs
        if from_param and any(v.type.dtype.is_float for _, v in tensors):
            return outs
        if any(id(v) not in env or env[id(v)].size > SMALL_CONST for _, v in tensors):
            return outs
        new = list(outs)
        for k, v in tensors:
            if k < len(n.proto.output) and n.proto.output[k]:
                self.consts[n.proto.output[k]] = env[id(v)]
        # The outputs the emitted ops computed become constants (an output that is an input,
        # as Identity's, stays that value); the emitted ops, now unread, are erased.
        made = {id(r) for e in emitted for r in e.results}
        for k, v in tensors:
            if id(v) in made:
                new[k] = n.emit("constant", value=DenseAttr(env[id(v)].astype(v.type.dtype.np, copy=False)))
        for e in reversed(emitted):
            if all(not r.has_uses for r in e.results):
                self.graph.erase(e)
        return new

    def _attributes(self, n: OnnxNode) -> dict[str, Any]:
        """The node's attributes as Python values, each of the type the op's schema (at the
        model's opset) gives it, and every attribute the schema requires present."""
        onnx = onnx_package()
        ap = onnx.AttributeProto
        spec = _schema_attributes(n.proto.op_type, self.opset)

        def kind(code: int) -> str:
            try:
                return str(ap.AttributeType.Name(code))
            except ValueError:
                return f"type code {code}"

        attrs: dict[str, Any] = {}
        for a in n.proto.attribute:
            if a.name in attrs:
                raise n.error(f"attribute '{a.name}' is given twice")
            if a.ref_attr_name:
                raise n.error(f"attribute '{a.name}' refers to '{a.ref_attr_name}', an attribute of an enclosing "
                              "function; only a function body may do that (the model is malformed)")
            want = spec.get(a.name)
            if a.type == ap.UNDEFINED:
                raise n.error(f"attribute '{a.name}' has no type (UNDEFINED); the model is malformed")
            if want is not None and want[0] != a.type:
                raise n.error(f"attribute '{a.name}' is of type {kind(a.type)}, but {n.proto.op_type} "
                              f"(opset {self.opset}) takes {kind(want[0])}")
            attrs[a.name] = onnx.helper.get_attribute_value(a)
        missing = [name for name, (_, required) in spec.items() if required and name not in attrs]
        if missing:
            raise n.error(f"the required attribute(s) {', '.join(repr(m) for m in missing)} are missing")
        return attrs


@functools.cache
def _schema_attributes(op_type: str, opset: int) -> dict[str, tuple[int, bool]]:
    """The attributes the default-domain schema of ``op_type`` at ``opset`` declares (name ->
    its type code and whether it is required), empty for an op without a schema; looked up
    once per op and opset."""
    onnx = onnx_package()
    try:
        attrs = onnx.defs.get_schema(op_type, opset, "").attributes
    except onnx.defs.SchemaError:
        return {}
    return {name: (int(a.type), bool(a.required)) for name, a in attrs.items()}


def _check_text(proto: Any, where: str) -> None:
    """Every name the importer reads must be text: protobuf gives a string field that is not
    valid UTF-8 as bytes. Raise naming the node (or value) that holds one."""
    def bad(v: Any) -> bool:
        return isinstance(v, (bytes, bytearray))

    def show(v: Any) -> str:
        return bytes(v).decode("utf-8", "backslashreplace")

    msg = "is not valid UTF-8 text (the model is corrupt)"
    for op in proto.opset_import:
        if bad(op.domain):
            raise OnnxImportError(f"{where}: opset_import domain '{show(op.domain)}' {msg}")
    g = proto.graph
    if bad(g.name):
        raise OnnxImportError(f"{where}: the graph name '{show(g.name)}' {msg}")
    for what, vis in (("graph input", g.input), ("graph output", g.output), ("value_info", g.value_info),
                      ("initializer", g.initializer)):
        for k, vi in enumerate(vis):
            if bad(vi.name):
                raise OnnxImportError(f"{where}: {what} #{k + 1} has a name '{show(vi.name)}' that {msg}")
    for i, node in enumerate(g.node):
        # The usual case, every field text: one pass over them, no message built.
        texts = [node.name, node.op_type, node.domain, *node.input, *node.output]
        texts += [x for a in node.attribute for x in (a.name, a.ref_attr_name)]
        if all(type(x) is str for x in texts):
            continue
        label = show(node.name) if bad(node.name) else (node.name or "<unnamed>")
        op = show(node.op_type) if bad(node.op_type) else node.op_type
        at = f"{Location(where, i + 1)}: node '{label}' ({op})"
        if bad(node.name) or bad(node.op_type) or bad(node.domain):
            raise OnnxImportError(f"{at}: its name, op_type or domain {msg}")
        for kind, names in (("input", node.input), ("output", node.output)):
            for k, name in enumerate(names):
                if bad(name):
                    raise OnnxImportError(f"{at}: {kind} {k} ('{show(name)}') {msg}")
        for a in node.attribute:
            if bad(a.name) or bad(a.ref_attr_name):
                raise OnnxImportError(f"{at}: an attribute name ('{show(a.name)}') {msg}")


def import_onnx(model: Any, input_shapes: dict[str, Sequence[int]] | None = None,
                static_inputs: dict[str, Any] | None = None) -> Graph:
    """Import an ONNX model (a path or a ``onnx.ModelProto``) as a partita Graph.

    ``input_shapes`` fixes the shape of graph inputs whose ONNX shape is symbolic or
    missing (partita shapes are static). ``static_inputs`` (name -> array) binds graph
    inputs to known values, treated like initializers: this is how a Reshape shape or
    Squeeze axes that arrive as graph inputs get the constant the importer needs. Initializers become ``param`` inputs with their
    arrays in ``graph.weights``. Raises OnnxImportError (a PartitaError) for a corrupt or
    truncated file, an opset older than 13 that ONNX's version converter cannot
    upgrade (the others are upgraded, with an OnnxOpsetUpgradeWarning), unsupported ops (all listed at once), or a
    node whose semantics partita cannot express, naming the node.
    """
    proto, where, base_dir = _read(model)
    return _import_proto(proto, where, base_dir, input_shapes, static_inputs)


def _read(model: Any) -> tuple[Any, str, str | None]:
    """The checked ModelProto at opset MIN_OPSET or newer (older ones upgraded), the name
    errors use, and the folder external data is read from."""
    proto, where, base_dir = _load(model)
    _check_text(proto, where)
    opset = opset_of(proto, where)
    if opset < MIN_OPSET:
        proto = convert_to_min_opset(proto, where, opset)
    return proto, where, base_dir


def _import_proto(proto: Any, where: str, base_dir: str | None, input_shapes: Mapping[str, Sequence[int]] | None,
                  static_inputs: Mapping[str, Any] | None) -> Graph:
    """The Graph of a ModelProto that _read returned."""
    try:
        inferred = onnx_package().shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception as e:
        raise OnnxImportError(f"{where}: ONNX shape inference rejects the model: {e}") from None
    static = {k: np.asarray(v) for k, v in (static_inputs or {}).items()}
    return _Importer(inferred, where, opset_of(proto, where), base_dir).run(dict(input_shapes or {}), static)


class OnnxModel:
    """An ONNX model whose dynamic axes are bound by the inputs it is called with.

    ``load_onnx(path)`` reads and checks the file once; the first call with arrays of given
    shapes imports the graph specialized on those shapes (partita's shapes are static), and
    later calls with the same shapes reuse it. ``input_shapes`` binds some axes up front
    (those inputs' shapes are then fixed). ``graph_for(shapes)`` gives the imported graph.
    """

    def __init__(self, model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None,
                 backend: str = "torch") -> None:
        if backend not in ("numpy", "torch"):
            raise OnnxImportError(f"load_onnx: backend must be 'numpy' or 'torch', got {backend!r}")
        proto, self.where, self._base_dir = _read(model)
        self.proto, self.backend = proto, backend
        self.fixed = {k: [int(d) for d in v] for k, v in (input_shapes or {}).items()}
        inits = {t.name for t in proto.graph.initializer}
        self.input_names = [vi.name for vi in proto.graph.input if vi.name not in inits]
        self._graphs: dict[tuple, Graph] = {}
        if all(known_shape_and_type(vi)[0] is not None or vi.name in self.fixed
               for vi in proto.graph.input if vi.name not in inits):
            self.graph_for({})  # every shape known: import now, so errors surface at load time

    def graph_for(self, shapes: Mapping[str, Sequence[int]]) -> Graph:
        """The graph imported with these input shapes (and those given to load_onnx)."""
        bound = {**{k: tuple(int(d) for d in v) for k, v in shapes.items()},
                 **{k: tuple(v) for k, v in self.fixed.items()}}
        key = tuple(sorted(bound.items()))
        if key not in self._graphs:
            self._graphs[key] = _import_proto(self.proto, self.where, self._base_dir, dict(bound), None)
        return self._graphs[key]

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Run on arrays given in the order of the graph inputs, or by ONNX input name."""
        if args and kwargs:
            raise OnnxImportError(f"{self.where}: give the inputs in order or by name, not both")
        if len(args) > len(self.input_names):
            raise OnnxImportError(f"{self.where}: the model takes {len(self.input_names)} input(s) "
                                  f"({', '.join(self.input_names)}), got {len(args)}")
        feed = dict(zip(self.input_names, args)) if args else dict(kwargs)
        unknown = sorted(set(feed) - set(self.input_names))
        missing = [k for k in self.input_names if k not in feed]
        if unknown or missing:
            raise OnnxImportError(f"{self.where}: inputs {', '.join(self.input_names)} expected; "
                                  + (f"unknown: {', '.join(unknown)}" if unknown else f"missing: {', '.join(missing)}"))
        shapes = {k: tuple(np.shape(np.asarray(v) if not hasattr(v, "shape") else v)) for k, v in feed.items()}
        graph = self.graph_for(shapes)
        values = [feed[k] for k in self.input_names]
        if self.backend == "torch":
            from ...backend.torch_exec import run as run_torch

            return list(run_torch(graph, values))
        from ...backend.numpy_ref import run as run_numpy

        return list(run_numpy(graph, values))


def load_onnx(model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None,
              backend: str = "torch") -> OnnxModel:
    """An ONNX file (or ModelProto) as a callable whose dynamic axes are bound by the first
    inputs of each shape it sees (see OnnxModel)."""
    return OnnxModel(model, input_shapes, backend)
