"""What both executors share: binding inputs and weights to a graph's input values, checking
the values given, and naming the node where a run fails."""

from __future__ import annotations

import sys
from typing import Any, Mapping, Sequence

import numpy as np

from ..ir.diagnostics import ExecutionError, PartitaError
from ..ir.dtypes import from_numpy
from ..ir.graph import Graph, Node, Value, input_name
from ..ops._lazy import from_torch_dtype, torch

INPUTS_ACCEPTED = ("a list or tuple of arrays in the order of the graph's inputs, a dict from input name "
                   "to array, or None")


def bind_inputs(graph: Graph, inputs: Sequence[Any] | Mapping[str, Any] | None,
                weights: Mapping[str, Any] | None) -> list[tuple[Value, Any]]:
    """Pair each graph input with its array.

    ``input``-role values come from ``inputs`` (a sequence in order, or a mapping by name);
    ``param`` and ``state`` values come from ``weights`` (default: ``graph.weights``), or from
    ``inputs`` when given there by name. Containers of other kinds are an ExecutionError that
    says what is accepted (the values themselves are checked by ``host_array``).
    """
    if weights is not None and not isinstance(weights, Mapping):
        raise ExecutionError(f"@{graph.name}: weights must be a mapping from param/state name to array "
                             f"(a dict or partita.Weights), got {describe_value(weights)}; or leave them out "
                             "to use graph.weights")
    weights = graph.weights if weights is None else weights
    data_inputs = [v for v in graph.inputs if v.role == "input"]
    by_name: Mapping[str, Any]
    if inputs is None:
        by_name = {}
    elif isinstance(inputs, Mapping):
        by_name = inputs
        bad_keys = [k for k in inputs if not isinstance(k, str)]
        if bad_keys:
            bad = bad_keys[0]
            raise ExecutionError(f"@{graph.name}: inputs given as a dict need the inputs' names as keys "
                                 f"({', '.join(input_name(v) for v in graph.inputs) or 'it has none'}), got "
                                 f"the key {bad!r} ({type(bad).__name__}); to give inputs by position, "
                                 "pass a list")
        unknown = set(inputs) - {input_name(v) for v in graph.inputs}
        if unknown:
            raise ExecutionError(f"@{graph.name} has no input named {', '.join(sorted(unknown))}; "
                                 f"its inputs are {', '.join(input_name(v) for v in graph.inputs)}")
    elif isinstance(inputs, (str, bytes, bytearray, set, frozenset)) or _is_array(inputs) \
            or not hasattr(inputs, "__iter__"):
        one = " (for one input x, pass [x])" if _is_array(inputs) else ""
        raise ExecutionError(f"@{graph.name}: inputs must be {INPUTS_ACCEPTED}; got "
                             f"{describe_value(inputs)}{one}")
    else:
        seq = list(inputs)
        if len(seq) != len(data_inputs):
            raise ExecutionError(f"@{graph.name} takes {len(data_inputs)} input(s) "
                                 f"({', '.join('%' + input_name(v) for v in data_inputs)}), got {len(seq)}")
        by_name = {input_name(v): a for v, a in zip(data_inputs, seq)}
    out = []
    missing = []
    for v in graph.inputs:
        name = input_name(v)
        if name in by_name:
            out.append((v, by_name[name]))
        elif v.role != "input" and name in weights:
            out.append((v, weights[name]))
        else:
            missing.append(v)
    if missing:
        what = ", ".join(f"%{v.name} ({v.role})" for v in missing)
        hint = " (weights are loaded from the .safetensors file beside the .pir file)" if any(
            v.role != "input" for v in missing) else ""
        raise ExecutionError(f"@{graph.name}: no value given for {what}{hint}")
    return out


def check_array(v: Value, shape: tuple[int, ...], dtype_name: str) -> None:
    t = v.type
    if tuple(shape) != t.shape or dtype_name != t.dtype.name:
        raise ExecutionError(f"input %{v.name} ({v.role}) expects {t}, got {dtype_name}[{','.join(map(str, shape))}]")


def numpy_dtype_name(a: np.ndarray) -> str:
    try:
        return from_numpy(a.dtype).name
    except KeyError:
        return str(a.dtype)


ARRAY_ACCEPTED = "a NumPy array or a torch tensor (or nested lists of numbers)"


def _torch_tensor_type() -> Any:
    torch = sys.modules.get("torch")  # a tensor can only exist once torch is imported
    return getattr(torch, "Tensor", None)


def _is_array(a: Any) -> bool:
    tensor = _torch_tensor_type()
    return isinstance(a, np.ndarray) or (tensor is not None and isinstance(a, tensor))


def describe_value(a: Any) -> str:
    """A few words for a value given where an array or a container was expected."""
    if a is None:
        return "None"
    if isinstance(a, np.ndarray):
        kind = {"O": "Python objects", "U": "strings", "S": "bytes"}.get(a.dtype.kind)
        what = f" of {kind}" if kind else ""
        return f"a NumPy array{what} (dtype {a.dtype}, shape [{','.join(map(str, a.shape))}])"
    name = type(a).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def host_array(v: Value, a: Any) -> np.ndarray:
    """``a``, the value given for graph input ``v``, as a NumPy array (torch tensors included);
    an ExecutionError naming ``v`` for a value that is no array of numbers (None, a string, a
    dict, an array of objects, ragged lists). Its dtype and shape are ``check_array``'s."""
    tensor = _torch_tensor_type()
    if tensor is not None and isinstance(a, tensor):
        try:
            return to_numpy(a)
        except Exception as e:
            raise ExecutionError(f"{_input_label(v)} expects {v.type}; got a torch tensor NumPy cannot hold "
                                 f"({a.dtype}, {a.layout}): {type(e).__name__}: {e}") from None
    if a is None or isinstance(a, (str, bytes, bytearray, Mapping, set, frozenset)):
        raise ExecutionError(f"{_input_label(v)} expects {v.type} as {ARRAY_ACCEPTED}, got {describe_value(a)}")
    try:
        arr = np.asarray(a)
    except Exception as e:
        raise ExecutionError(f"{_input_label(v)} expects {v.type} as {ARRAY_ACCEPTED}, got "
                             f"{describe_value(a)} that is no array: {type(e).__name__}: {e}") from None
    if arr.dtype.kind in "OUS":
        raise ExecutionError(f"{_input_label(v)} expects {v.type} as {ARRAY_ACCEPTED}, got {describe_value(arr)}")
    return arr


def as_numpy(x: Any) -> np.ndarray:
    """``x`` as a NumPy array: an array as it is, a torch tensor through ``to_numpy`` (bf16 and
    float8 included), anything else through ``np.asarray``. No checks: for values partita made
    or was given as arrays."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):
        return to_numpy(x)
    return np.asarray(x)


def to_numpy(t) -> np.ndarray:
    """A NumPy array of a torch tensor (bf16 and float8 as ml_dtypes arrays); NumPy arrays
    (the torch executor's storage-typed outputs) pass through."""
    if isinstance(t, np.ndarray):
        return t
    try:
        return _to_numpy(t)
    except ValueError as e:  # a shape NumPy cannot hold, e.g. [2**63-1, 0] (torch can)
        raise ExecutionError(f"a torch tensor of shape [{','.join(map(str, t.shape))}] ({t.dtype}) cannot be "
                             f"given back as a NumPy array: {e}; give the value a shape NumPy can hold "
                             "(dims whose product, zeros left out, fits in 63 bits)") from None


def _to_numpy(t) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.detach().cpu().view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype.itemsize == 1 and t.dtype.is_floating_point:
        return t.detach().cpu().view(torch.uint8).numpy().view(from_torch_dtype(t.dtype).np)
    return t.detach().cpu().numpy()


def _input_label(v: Value) -> str:
    return f"input %{v.name} ({v.role})"


def describe_node(node: Node) -> str:
    """A node as run-time errors name it: its results, op and place, e.g.
    ``%e = embedding at m.pir:2:8 (from model.py:7)``."""
    res = ", ".join(f"%{r.name}" for r in node.results if r.name is not None)
    text = f"{res} = {node.op}" if res else node.op
    where = node.text_loc or node.loc
    if where:
        text += f" at {where}"
        if node.loc and node.text_loc and str(node.loc) != str(node.text_loc):
            text += f" (from {node.loc})"
    return text


def node_error(node: Node, e: Exception, implementation: str) -> Exception:
    """The error to raise for ``e``, raised while ``node`` ran its ``implementation`` ("reference
    implementation", "torch implementation"): a message that starts with the node.

    A PartitaError of a plain kind (no fields of its own) is rebuilt with the node in front
    of its message, keeping its type; one with fields (a collective's failure, say) already
    names what it needs to and is returned as it is. Other exceptions become an
    ExecutionError that names their type.
    """
    head = describe_node(node)
    if isinstance(e, PartitaError):
        msg = str(e)
        if msg.startswith(head) or type(e).__init__ is not Exception.__init__ or vars(e):
            return e
        return type(e)(f"{head}: {msg}")
    return ExecutionError(f"{head}: the {implementation} failed: {type(e).__name__}: {e}")
