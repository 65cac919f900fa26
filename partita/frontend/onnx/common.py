"""What the ONNX converter modules and the importer share: the node a converter sees, the
element types and tensor data, and the helpers several converters use. It imports no other
module of the package, so every one of them can import it."""

from __future__ import annotations

import math
import os
import sys
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ...ir import dtypes as dt
from ...ir.attrs import DenseAttr
from ...ir.diagnostics import PartitaError
from ...ir.graph import Value
from ...ir.types import Location
from .. import FrontendError


class OnnxImportError(FrontendError):
    """An ONNX model partita cannot import: the message names the file, node and fix."""


def onnx_package() -> Any:
    try:
        import onnx
    except ImportError as e:  # pragma: no cover - environment dependent
        raise OnnxImportError("import_onnx needs the 'onnx' package: pip install onnx") from e
    return onnx


# ONNX TensorProto element types partita has a dtype for.
ONNX_DTYPES: dict[int, dt.DType] = {
    1: dt.f32, 2: dt.u8, 3: dt.i8, 5: dt.i16, 6: dt.i32, 7: dt.i64, 9: dt.bool_, 10: dt.f16,
    11: dt.f64, 16: dt.bf16, 4: dt.u16, 12: dt.u32, 13: dt.u64,
    # Storage types (cast and data movement only).
    17: dt.f8e4m3fn, 18: dt.f8e4m3fnuz, 19: dt.f8e5m2, 20: dt.f8e5m2fnuz, 21: dt.u4, 22: dt.i4,
    23: dt.f4e2m1, 24: dt.f8e8m0, 25: dt.u2, 26: dt.i2,
}


def onnx_dtype(elem_type: Any, what: str) -> dt.DType:
    """The partita dtype of an ONNX element-type code; an error naming ``what`` otherwise."""
    if isinstance(elem_type, int) and elem_type in ONNX_DTYPES:
        return ONNX_DTYPES[elem_type]
    supported = ", ".join(d.name for d in ONNX_DTYPES.values())
    if not isinstance(elem_type, int):
        raise OnnxImportError(f"{what}: element type {elem_type!r} is not an integer TensorProto.DataType code "
                              f"(supported: {supported})")
    try:
        name = onnx_package().TensorProto.DataType.Name(elem_type) if elem_type else "UNDEFINED"
    except ValueError:
        raise OnnxImportError(f"{what}: {elem_type} is not an ONNX element-type code (TensorProto.DataType); "
                              f"the model is malformed (partita's codes: {supported})") from None
    raise OnnxImportError(f"{what}: element type {name} has no partita dtype (supported: {supported})")


def onnx_type_name(code: int) -> str:
    try:
        return str(onnx_package().TensorProto.DataType.Name(code))
    except ValueError:
        return str(code)


def tensor_array(t: Any, what: str, base_dir: str | None) -> np.ndarray:
    """The array of TensorProto ``t``, checked before onnx.numpy_helper reads it: a known
    element type, non-negative dims, and exactly the data its dims need (raw_data, the typed
    field, or the external file, which must lie in ``base_dir``, the model's folder).
    ``what`` names the tensor (and its node) in every error."""
    onnx = onnx_package()
    tp = onnx.TensorProto
    if not isinstance(t, tp):
        raise OnnxImportError(f"{what}: expected a tensor (an attribute of type TENSOR), got {type(t).__name__}")
    dtype = onnx_dtype(t.data_type, what)
    dims = [int(d) for d in t.dims]
    if any(d < 0 for d in dims):
        raise OnnxImportError(f"{what}: dims {dims} hold a negative size; the tensor is malformed")
    if t.HasField("segment"):
        raise OnnxImportError(f"{what}: segmented tensors (TensorProto.segment) are not supported")
    count = math.prod(dims)
    # The data's bytes, read once: each read of a bytes field copies it out of the message.
    raw: bytes | None = None
    if t.data_location == tp.EXTERNAL:
        raw, source = _external_bytes(t, what, base_dir), "its external data"
    elif t.HasField("raw_data"):
        raw, source = t.raw_data, "raw_data"
    if raw is not None:
        # 4- and 2-bit types are packed two and four to a byte.
        need = (count * dtype.bits + 7) // 8
        if len(raw) != need:
            raise OnnxImportError(f"{what}: {source} holds {len(raw)} bytes, but dims {dims} of {onnx_type_name(t.data_type)} "
                                  f"need {need}; the tensor is corrupt or truncated")
    else:
        field = onnx.helper.tensor_dtype_to_field(t.data_type)
        # The typed field holds one entry per element (one per packed byte below 8 bits).
        need = count if dtype.bits >= 8 else (count * dtype.bits + 7) // 8
        have = len(getattr(t, field))
        if have != need:
            raise OnnxImportError(f"{what}: {field} holds {have} values, but dims {dims} of {onnx_type_name(t.data_type)} "
                                  f"need {need} "
                                  "(and there is no raw_data); the tensor is corrupt or truncated")
    try:
        arr = onnx.numpy_helper.to_array(t) if raw is None else _raw_array(t, raw, dtype, dims)
    except Exception as e:
        raise OnnxImportError(f"{what}: onnx cannot read the tensor: {e}") from None
    if tuple(arr.shape) != tuple(dims):
        raise OnnxImportError(f"{what}: the data reads as shape {list(arr.shape)}, not its dims {dims}")
    return arr


def _raw_array(t: Any, raw: bytes, dtype: dt.DType, dims: list[int]) -> np.ndarray:
    """The array of tensor ``t`` whose data is ``raw`` (its raw_data or external bytes), as
    onnx.numpy_helper.to_array reads it. Whole-byte types on a little-endian host are a view
    of ``raw``; the rest (packed 4- and 2-bit types, byte swapping) go through onnx."""
    onnx = onnx_package()
    if dtype.bits >= 8 and sys.byteorder == "little":
        return np.frombuffer(raw, dtype=onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).reshape(dims)
    if t.data_location == onnx.TensorProto.EXTERNAL:
        t2 = onnx.TensorProto()
        t2.CopyFrom(t)
        t2.data_location = onnx.TensorProto.DEFAULT
        del t2.external_data[:]
        t2.raw_data = raw
        t = t2
    return onnx.numpy_helper.to_array(t)


def _external_bytes(t: Any, what: str, base_dir: str | None) -> bytes:
    """The bytes of an external-data tensor, from a file inside ``base_dir`` only."""
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    if base_dir is None:
        raise OnnxImportError(f"{what}: its data is in an external file ('{loc}'), but the model was given as a "
                              "ModelProto: pass the .onnx file's path, or load it with onnx.load(path), which "
                              "reads the external data")
    if not loc:
        raise OnnxImportError(f"{what}: data_location is EXTERNAL but external_data has no 'location'")
    base = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(base, loc))
    if os.path.isabs(loc) or os.path.commonpath([base, path]) != base:
        raise OnnxImportError(f"{what}: external data location '{loc}' points outside the model's folder {base}; "
                              "partita reads external data only from files in that folder or below it")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise OnnxImportError(f"{what}: external data offset {info.get('offset')!r} and length "
                              f"{info.get('length')!r} must be integers") from None
    if offset < 0 or (length is not None and length < 0):
        raise OnnxImportError(f"{what}: external data offset {offset} and length {length} must be non-negative")
    if not os.path.isfile(path):
        raise OnnxImportError(f"{what}: its external data file '{loc}' is missing from {base} "
                              "(copy it beside the .onnx file)")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            end = size if length is None else offset + length
            if end > size or offset > size:
                raise OnnxImportError(f"{what}: external data at offset {offset}, length {length} extends past the "
                                      f"end of '{loc}' ({size} bytes); the file is truncated")
            f.seek(offset)
            return f.read(end - offset)
    except OSError as e:
        raise OnnxImportError(f"{what}: cannot read its external data file '{loc}': {e.strerror}") from None


@dataclass
class OnnxNode:
    """What a converter sees of one ONNX node: its inputs as partita values (None for an
    omitted optional input), its attributes as Python values, and where it came from."""

    proto: Any
    index: int
    inputs: list[Value | None]
    attrs: dict[str, Any]
    ctx: Any  # the importer (importer.py's _Importer): the builder, constants, sequences, base_dir
    loc: Location = field(default_factory=lambda: Location("<onnx>", 0))

    @property
    def where(self) -> str:
        """The location, name and op type, as error messages print them."""
        return f"{self.loc}: node '{self.proto.name or '<unnamed>'}' ({self.proto.op_type})"

    def error(self, msg: str) -> OnnxImportError:
        """An OnnxImportError for this node (the caller raises it)."""
        return OnnxImportError(f"{self.where}: {msg}")

    def attr(self, name: str, default: Any = None) -> Any:
        """The ONNX attribute ``name`` as a Python value, or ``default``."""
        return self.attrs.get(name, default)

    def input(self, i: int) -> Value:
        """The partita value of input ``i``; an error if the input is absent."""
        if i >= len(self.inputs) or self.inputs[i] is None:
            raise self.error(f"input {i} is required but missing")
        v = self.inputs[i]
        assert v is not None
        return v

    def has_input(self, i: int) -> bool:
        """Whether optional input ``i`` is given."""
        return i < len(self.inputs) and (self.inputs[i] is not None or self.proto.input[i] in self.ctx.seqs)

    def seq(self, i: int) -> list[Value]:
        """A copy of the sequence held by input ``i``; an error if input ``i`` is not a sequence."""
        name = self.proto.input[i] if i < len(self.proto.input) else ""
        if name not in self.ctx.seqs:
            raise self.error(f"input {i} ('{name}') must be a sequence (from SequenceConstruct, "
                             "SequenceEmpty, SequenceInsert, SequenceErase or SplitToSequence)")
        return list(self.ctx.seqs[name])

    def const(self, i: int, what: str) -> np.ndarray:
        """The array of input ``i``, which must be an initializer or a Constant's output."""
        if i >= len(self.proto.input) or self.proto.input[i] == "":
            raise self.error(f"{what} (input {i}) is required but missing")
        name = self.proto.input[i]
        arr = self.ctx.consts.get(name)
        if arr is None:
            raise self.error(f"{what} (input {i}, '{name}') must be known at import time (partita's "
                             f"shapes are static), but {self.ctx.why_not_constant(name)}")
        return arr

    def emit(self, op: str, *operands: Value, **attrs: Any) -> Any:
        """Emit a partita op at this node's location; a type-rule error names the node."""
        try:
            return self.ctx.b.emit(op, *operands, loc=self.loc, **attrs)
        except OnnxImportError:
            raise
        except PartitaError as e:
            raise self.error(str(e)) from e

    def scalar(self, value: float, like: Value) -> Value:
        """A rank-0 constant of ``like``'s dtype."""
        return self.emit("constant", value=DenseAttr(np.array(value, dtype=like.type.dtype.np)))

    def tensor_attr(self, name: str) -> np.ndarray:
        """The array of the TENSOR attribute ``name``, checked (see tensor_array)."""
        t = self.attrs[name]
        label = f" (tensor '{t.name}')" if getattr(t, "name", "") else ""
        return tensor_array(t, f"{self.where}: attribute '{name}'{label}", self.ctx.base_dir)

    def n_outputs(self) -> int:
        """How many outputs the ONNX node declares (omitted optional ones included)."""
        return len(self.proto.output)

    def used_output(self, i: int) -> bool:
        """Whether output ``i`` is requested (declared with a non-empty name)."""
        return i < len(self.proto.output) and self.proto.output[i] != ""


Converter = Callable[[OnnxNode], Sequence[Value | None]]
# What ONNX_TO_PARTITA holds: a tensor Converter, or a sequence converter whose entry for a
# sequence-typed output is a list of Values (sequences are unrolled at import time).
AnyConverter = Callable[[OnnxNode], Sequence[Value | list[Value] | None]]

def cast_attrs(n: OnnxNode) -> dict[str, Any]:
    """Cast's and CastLike's saturate (opset 19) and round_mode (opset 24), whose defaults
    (1, "up") are partita's."""
    return {"saturate": bool(n.attr("saturate", 1)), "round_mode": attr_text(n.attr("round_mode", "up"))}


def attr_text(v: Any) -> str:
    """A string attribute as text (ONNX stores them as bytes)."""
    return v.decode() if isinstance(v, bytes) else str(v)


def auto_pad_mode(n: OnnxNode) -> str:
    """The node's auto_pad attribute as text (NOTSET when absent or empty); an error for an unknown mode."""
    auto = n.attr("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto not in ("NOTSET", "", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise n.error(f"auto_pad '{auto}' is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    return auto or "NOTSET"


def window_params(n: OnnxNode, x: Value, kernel: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """(strides, dilations, pads [begin..., end...]) of a 2-D or 3-D window op, auto_pad resolved."""
    nd = len(kernel)
    if nd not in (2, 3) or x.type.rank != nd + 2:
        raise n.error(f"input {x.type} with kernel {list(kernel)} is not a 1-D, 2-D or 3-D window op "
                      "((N, C, L), (N, C, H, W) or (N, C, D, H, W) with one kernel size per spatial dim); "
                      "partita has 1-D, 2-D and 3-D convolution and pooling")
    strides = list(n.attr("strides", [1] * nd))
    dil = list(n.attr("dilations", [1] * nd))
    auto = auto_pad_mode(n)
    if len(strides) != nd or len(dil) != nd:
        raise n.error(f"strides {strides} and dilations {dil} must have {nd} entries, one per spatial dim")
    if auto == "NOTSET":
        pads = list(n.attr("pads", [0] * (2 * nd)))
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    else:
        begin, end = [], []
        for d in range(nd):
            size = x.type.shape[2 + d]
            out = math.ceil(size / strides[d])
            total = max((out - 1) * strides[d] + (kernel[d] - 1) * dil[d] + 1 - size, 0)
            small, big = total // 2, total - total // 2
            # SAME_UPPER puts the odd extra pad at the end, SAME_LOWER at the beginning.
            begin.append(small if auto == "SAME_UPPER" else big)
            end.append(big if auto == "SAME_UPPER" else small)
        pads = begin + end
    if len(pads) != 2 * nd:
        raise n.error(f"pads {pads} must have {2 * nd} entries (begin and end of each spatial dim)")
    return strides, dil, pads


def pad_symmetric(n: OnnxNode, x: Value, pads: list[int], fill: float,
               kernel: Sequence[int] | None = None) -> tuple[Value, list[int]]:
    """partita's window ops pad both sides equally (and pools at most half the window): pad x
    explicitly with ``fill`` when ONNX's pads are asymmetric or larger."""
    nd = len(pads) // 2
    small = kernel is None or all(pads[d] <= kernel[d] // 2 for d in range(nd))
    if all(pads[d] == pads[nd + d] for d in range(nd)) and small:
        return x, list(pads[:nd])
    pairs = [0, 0, 0, 0] + [p for d in range(nd) for p in (pads[d], pads[nd + d])]
    return n.emit("pad", x, pads=pairs, value=fill), [0] * nd


def lift_1d(convert: Converter) -> Converter:
    """Run a 2-D window converter on a 1-D (N, C, L) node as (N, C, 1, L), then drop the
    added dim: partita's window ops are 2-D and 3-D."""
    @functools.wraps(convert)
    def lifted(n: OnnxNode) -> Sequence[Value | None]:
        if not n.has_input(0) or n.input(0).type.rank != 3:
            return convert(n)
        attrs = dict(n.attrs)
        for key, fill in (("kernel_shape", 1), ("strides", 1), ("dilations", 1), ("output_padding", 0)):
            if key in attrs:
                attrs[key] = [fill] + list(attrs[key])
        if "pads" in attrs:
            p = list(attrs["pads"])
            attrs["pads"] = [0, p[0], 0, p[1]] if len(p) == 2 else p
        if "output_shape" in attrs:
            # Either the spatial size [L] or the whole shape [N, C, L]: the unit height goes
            # before L in both.
            s = list(attrs["output_shape"])
            attrs["output_shape"] = s[:-1] + [1] + s[-1:]
        ins: list[Value | None] = [n.emit("unsqueeze", n.input(0), axes=[2])]
        for i in range(1, len(n.inputs)):
            v = n.inputs[i]
            # The conv weight ((O, I/g, K), or (I, O/g, K) transposed) gets the same unit height.
            ins.append(n.emit("unsqueeze", v, axes=[2]) if (v is not None and i == 1 and v.type.rank == 3) else v)
        outs = convert(OnnxNode(n.proto, n.index, ins, attrs, n.ctx, n.loc))
        return [n.emit("squeeze", v, axes=[2]) if v is not None else None for v in outs]
    return lifted


def axes_operand(n: OnnxNode, i: int, attr_since: int) -> list[int] | None:
    """Axes given as input ``i`` (opset >= attr_since) or as the 'axes' attribute (older)."""
    if n.ctx.opset >= attr_since:
        if "axes" in n.attrs:
            raise n.error(f"'axes' is an input since opset {attr_since}, not an attribute")
        if not n.has_input(i):
            return None
        arr = n.const(i, "axes")
        if arr.ndim > 1:
            raise n.error(f"axes (input {i}) must be a 1-D list of axes, not a tensor of shape {list(arr.shape)}")
        # A 0-d axes constant is one axis, as onnxruntime reads it.
        return [int(a) for a in np.atleast_1d(arr)]
    axes = n.attr("axes")
    return list(axes) if axes is not None else None


def reverse_axis(n: OnnxNode, x: Value, axis: int) -> Value:
    """x with ``axis`` reversed: an index_select of the indices d-1, ..., 0."""
    d = x.type.shape[axis]
    if d <= 1:
        return x
    up = n.emit("iota", shape=[d], dtype=dt.i64)
    return n.emit("index_select", x, n.emit("sub", n.scalar(d - 1, up), up), axis=axis)


def np_for_partita(arr: np.ndarray, what: str) -> np.ndarray:
    """``arr`` itself, checked to have a partita dtype; an error naming ``what`` otherwise."""
    try:
        dt.from_numpy(arr.dtype)
    except KeyError:
        raise OnnxImportError(f"{what}: tensor of NumPy dtype {arr.dtype} has no partita dtype") from None
    return arr


# Largest constant (in elements) the importer also keeps as a NumPy array for later
# constant-operand reads; weight-sized fills stay only in the graph.
SMALL_CONST = 1024
