"""Malformed ONNX files: every one is refused with an OnnxImportError (a PartitaError) that
names the place (file, node, tensor, attribute or input) and says what is wrong, never a
ValueError, KeyError or onnx error from inside the importer. The broken models are built
here with onnx.helper; the last tests run the real `partita import` command on a few."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import AttributeProto, TensorProto, helper, numpy_helper  # noqa: E402

from partita.frontend.onnx import OnnxImportError, import_onnx  # noqa: E402
from partita.ir.diagnostics import PartitaError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
F = TensorProto.FLOAT


def _model(nodes, inits=(), inputs=None, outputs=None, opset: int = 17):
    """A model from parts, never checked (it is meant to be broken)."""
    inputs = [helper.make_tensor_value_info("x", F, [2, 3])] if inputs is None else inputs
    outputs = [helper.make_tensor_value_info("y", F, None)] if outputs is None else outputs
    graph = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _tensor(name: str = "w", data_type: int = F, dims=(2, 3), **fields) -> TensorProto:
    """A TensorProto written field by field, so that it can disagree with itself."""
    t = TensorProto(name=name, data_type=data_type)
    t.dims.extend(dims)
    for key, value in fields.items():
        if key == "raw_data":
            t.raw_data = value
        else:
            getattr(t, key).extend(value)
    return t


def _add_w(*inits: TensorProto):
    """y = x + w, with w the initializer(s) given."""
    return _model([helper.make_node("Add", ["x", "w"], ["y"], name="add0")], inits)


def _refused(model, *fragments: str, **kwargs) -> str:
    with pytest.raises(OnnxImportError) as info:
        import_onnx(model, **kwargs)
    msg = str(info.value)
    assert isinstance(info.value, PartitaError)
    for fragment in fragments:
        assert fragment in msg, msg
    return msg


# --- malformed tensors: initializers, Constant values, ConstantOfShape values ------------

BAD_TENSORS = [
    ("raw_short", dict(raw_data=b"\0" * 8), "raw_data holds 8 bytes, but dims [2, 3] of FLOAT need 24"),
    ("raw_long", dict(raw_data=b"\0" * 40), "raw_data holds 40 bytes, but dims [2, 3] of FLOAT need 24"),
    ("raw_not_whole", dict(raw_data=b"\0" * 7), "raw_data holds 7 bytes"),
    ("float_data_short", dict(float_data=[1.0, 2.0]), "float_data holds 2 values, but dims [2, 3] of FLOAT need 6"),
    ("float_data_long", dict(float_data=[1.0] * 9), "float_data holds 9 values"),
    ("int32_data_short", dict(data_type=TensorProto.INT32, int32_data=[1]),
     "int32_data holds 1 values, but dims [2, 3] of INT32 need 6"),
    ("int64_data_short", dict(data_type=TensorProto.INT64, int64_data=[1, 2]),
     "int64_data holds 2 values, but dims [2, 3] of INT64 need 6"),
    ("f16_in_int32_data_short", dict(data_type=TensorProto.FLOAT16, int32_data=[0] * 5), "int32_data holds 5 values"),
    ("no_data", dict(), "float_data holds 0 values"),
    ("dims_not_the_data", dict(dims=(3, 3), float_data=[1.0] * 6), "dims [3, 3] of FLOAT need 9"),
    ("negative_dims", dict(dims=(-2, -3), float_data=[1.0] * 6), "dims [-2, -3] hold a negative size"),
    ("string", dict(data_type=TensorProto.STRING, dims=(1,), string_data=[b"a"]),
     "element type STRING has no partita dtype"),
    ("undefined", dict(data_type=TensorProto.UNDEFINED, raw_data=b"\0" * 24), "element type UNDEFINED"),
    ("code_999", dict(data_type=999, raw_data=b"\0" * 24), "999 is not an ONNX element-type code"),
]


@pytest.mark.parametrize("case,fields,expected", BAD_TENSORS, ids=[c[0] for c in BAD_TENSORS])
def test_malformed_initializer_names_it_and_its_reader(case, fields, expected):
    _refused(_add_w(_tensor(**fields)), "<onnx>: initializer 'w', read by node 'add0' (Add): ", expected)


@pytest.mark.parametrize("case,fields,expected", BAD_TENSORS, ids=[c[0] for c in BAD_TENSORS])
def test_malformed_constant_value_names_the_node(case, fields, expected):
    const = helper.make_node("Constant", [], ["w"], name="c0", value=_tensor(name="cw", **fields))
    model = _model([const, helper.make_node("Add", ["x", "w"], ["y"], name="add0")])
    _refused(model, "<onnx>:1: node 'c0' (Constant): attribute 'value' (tensor 'cw'): ", expected)


def _constant_of_shape(value: TensorProto):
    shape = helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.array([2, 3], np.int64)))
    fill = helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill", value=value)
    return _model([shape, fill], inputs=[])


@pytest.mark.parametrize("value,expected", [
    (_tensor(dims=(1,), raw_data=b"\0\0"), "raw_data holds 2 bytes, but dims [1] of FLOAT need 4"),
    (_tensor(data_type=999, dims=(1,), raw_data=b"\0" * 4), "999 is not an ONNX element-type code"),
    (_tensor(dims=(0,)), "must hold one element (the fill value); it holds 0"),
    (_tensor(dims=(2,), float_data=[1.0, 2.0]), "must hold one element (the fill value); it holds 2"),
])
def test_malformed_constant_of_shape_value_names_the_node(value, expected):
    _refused(_constant_of_shape(value), "<onnx>:2: node 'fill' (ConstantOfShape): attribute 'value'", expected)


def test_a_well_formed_packed_and_scalar_tensor_still_import():
    """The size checks count 4-bit types two to a byte and rank-0 tensors as one element."""
    i4 = helper.make_tensor("q", TensorProto.INT4, [3], [1, -2, 3])
    scalar = numpy_helper.from_array(np.array(2.5, np.float32), "s")
    model = _model([helper.make_node("Cast", ["q"], ["qf"], to=F), helper.make_node("Mul", ["qf", "s"], ["y"])],
                   [i4, scalar], inputs=[])
    g = import_onnx(model)
    assert g.weights["s"].shape == () and g.weights["q"].shape == (3,)


# --- external data ------------------------------------------------------------------------

def _external(location: str, **keys: str) -> TensorProto:
    t = _tensor()
    t.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, **keys}.items():
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def _save(model, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def test_external_data_is_read_from_the_models_folder_not_the_working_directory(tmp_path, monkeypatch):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").write_bytes(b"\xff" * 8 + w.tobytes())
    src = _save(_add_w(_external("w.bin", offset="8", length="24")), folder / "m.onnx")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    g = import_onnx(str(src))
    np.testing.assert_array_equal(g.weights["w"], w)


def test_missing_external_data_file_is_named(tmp_path):
    src = _save(_add_w(_external("weights.bin")), tmp_path / "m.onnx")
    _refused(str(src), f"{src}: initializer 'w', read by node 'add0' (Add): its external data file 'weights.bin' "
                       f"is missing from {os.path.realpath(tmp_path)}")


@pytest.mark.parametrize("location", ["../secret.bin", "sub/../../secret.bin", "ABSOLUTE", "link.bin"])
def test_external_data_outside_the_models_folder_is_refused(tmp_path, location):
    """Path traversal: the file exists and has the right size, but lies outside the folder."""
    folder = tmp_path / "model"
    folder.mkdir()
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 24)
    (folder / "link.bin").symlink_to(secret)
    location = str(secret) if location == "ABSOLUTE" else location
    src = _save(_add_w(_external(location)), folder / "m.onnx")
    _refused(str(src), "initializer 'w'", f"external data location '{location}' points outside the model's folder")


@pytest.mark.parametrize("keys,expected", [
    (dict(length="40"), "external data at offset 0, length 40 extends past the end of 'w.bin' (24 bytes)"),
    (dict(offset="30"), "extends past the end of 'w.bin' (24 bytes)"),
    (dict(offset="8"), "its external data holds 16 bytes, but dims [2, 3] of FLOAT need 24"),
    (dict(offset="-1"), "external data offset -1 and length None must be non-negative"),
    (dict(length="many"), "must be integers"),
])
def test_external_data_bounds_are_checked(tmp_path, keys, expected):
    (tmp_path / "w.bin").write_bytes(b"\0" * 24)
    src = _save(_add_w(_external("w.bin", **keys)), tmp_path / "m.onnx")
    _refused(str(src), "initializer 'w', read by node 'add0' (Add): ", expected)


def test_external_data_in_an_in_memory_model_says_how_to_load_it():
    _refused(_add_w(_external("w.bin")), "initializer 'w'", "its data is in an external file ('w.bin')",
             "onnx.load(path)")


# --- element-type codes in attributes and value types -------------------------------------

def test_cast_to_an_unknown_code_names_the_node_and_the_code():
    model = _model([helper.make_node("Cast", ["x"], ["y"], name="cast0", to=12345)])
    _refused(model, "<onnx>:1: node 'cast0' (Cast): attribute 'to': 12345 is not an ONNX element-type code")


def test_cast_to_a_type_partita_lacks_names_the_type():
    model = _model([helper.make_node("Cast", ["x"], ["y"], name="cast0", to=TensorProto.STRING)])
    _refused(model, "node 'cast0' (Cast): attribute 'to': element type STRING has no partita dtype")


def test_sequence_empty_with_an_unknown_dtype_code_is_refused():
    model = _model([helper.make_node("SequenceEmpty", [], ["s"], name="se", dtype=999),
                    helper.make_node("SequenceLength", ["s"], ["y"])],
                   inputs=[], outputs=[helper.make_tensor_value_info("y", TensorProto.INT64, [])])
    _refused(model, "node 'se' (SequenceEmpty): attribute 'dtype': 999 is not an ONNX element-type code")


def test_graph_input_of_an_unknown_element_type_is_named():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], inputs=[helper.make_tensor_value_info("x", 999, [2])])
    _refused(model, "<onnx>: graph input 'x': 999 is not an ONNX element-type code")


def test_graph_input_with_a_negative_dim_is_refused():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], inputs=[helper.make_tensor_value_info("x", F, [-2, 3])])
    _refused(model, "graph input 'x' has a negative dim -2")


# --- input_shapes ---------------------------------------------------------------------------

def _two_inputs():
    return _model([helper.make_node("Add", ["x", "mask"], ["s"]), helper.make_node("Add", ["s", "w"], ["y"])],
                  [numpy_helper.from_array(np.ones((2, 3), np.float32), "w")],
                  inputs=[helper.make_tensor_value_info("x", F, ["N", 3]),
                          helper.make_tensor_value_info("mask", F, ["N", 3])])


def test_input_shape_for_a_name_that_is_not_an_input_lists_the_inputs():
    _refused(_two_inputs(), "a shape is given for 'images', which is not an input of the model; its inputs are: "
                            "'x', 'mask'", input_shapes={"x": [2, 3], "images": [2, 3]})


def test_input_shape_for_an_initializer_says_so():
    _refused(_two_inputs(), "a shape is given for 'w', which is not an input of the model (it is an initializer",
             input_shapes={"w": [2, 3]})


@pytest.mark.parametrize("shape,expected", [
    ([2, -3], "the shape given for input 'x', [2, -3], must be a list of non-negative integer sizes"),
    (["two", 3], "must be a list of non-negative integer sizes"),
    ([2, 3, 1], "graph input 'x' has rank 2 (['N', 3]); the shape given for it, [2, 3, 1], has rank 3"),
])
def test_input_shape_values_are_checked(shape, expected):
    _refused(_two_inputs(), expected, input_shapes={"x": shape, "mask": [2, 3]})


# --- files that are not ONNX models -----------------------------------------------------------

@pytest.mark.parametrize("content,expected", [
    (np.random.default_rng(0).bytes(64) + b"\xff" * 64, "not a valid ONNX model (the protobuf does not parse"),
    (b"", "the file is empty, not an ONNX model"),
    ("TRUNCATED", "the file is corrupt or truncated"),
    (onnx.ModelProto(ir_version=8, opset_import=[helper.make_opsetid("", 17)]).SerializeToString(),
     "not a valid ONNX model (no graph or no opset_import)"),
    (b"ir_version: 8\n", "not a valid ONNX model"),
], ids=["random_bytes", "empty", "truncated", "no_graph", "text_format"])
def test_a_file_that_is_not_a_model_is_refused(tmp_path, content, expected):
    if content == "TRUNCATED":
        content = _add_w(numpy_helper.from_array(np.ones((2, 3), np.float32), "w")).SerializeToString()[:40]
    src = tmp_path / "m.onnx"
    src.write_bytes(content)
    _refused(str(src), f"{src}: ", expected)


def test_a_directory_or_a_missing_path_is_refused(tmp_path):
    _refused(str(tmp_path), f"{tmp_path}: cannot read the ONNX file: Is a directory")
    _refused(tmp_path / "none.onnx", f"{tmp_path / 'none.onnx'}: cannot read the ONNX file: No such file")


def test_a_model_proto_without_a_graph_or_a_non_model_is_refused():
    _refused(onnx.ModelProto(ir_version=8, opset_import=[helper.make_opsetid("", 17)]), "the ModelProto has no graph")
    _refused(123, "import_onnx takes a path or an onnx.ModelProto, not int")


# --- opsets -----------------------------------------------------------------------------------

def _relu(opset: int = 17):
    return _model([helper.make_node("Relu", ["x"], ["y"], name="r")], opset=opset)


def test_opset_imports_are_checked():
    m = _relu()
    del m.opset_import[:]
    _refused(m, "the model imports no default-domain (ai.onnx) opset")
    m = _relu()
    m.opset_import[0].domain = "com.example"
    _refused(m, "the model imports no default-domain (ai.onnx) opset")
    m = _relu()
    m.opset_import.append(helper.make_opsetid("ai.onnx", 15))
    _refused(m, "imports the default domain (ai.onnx) at several opsets [15, 17]")
    _refused(_relu(999), "the model uses opset 999, newer than the newest the installed onnx package knows",
             "export the model at opset")


def test_a_node_of_an_unknown_domain_is_named():
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="r", domain="com.example")])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    _refused(m, "unsupported ONNX op type(s): com.example::Relu (nodes: r)")
    # Without an opset import for its domain, ONNX's own shape inference refuses it.
    del m.opset_import[1]
    _refused(m, "ONNX shape inference rejects the model", "No opset import for domain com.example")


# --- graph structure --------------------------------------------------------------------------

def test_duplicate_value_names_are_refused():
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    _refused(_add_w(w, w), "<onnx>: initializer 'w' is defined twice; ONNX value names must be unique")
    two_x = [helper.make_tensor_value_info("x", F, [2, 3])] * 2
    _refused(_model([helper.make_node("Relu", ["x"], ["y"])], inputs=two_x), "graph input 'x' is declared twice")
    twice = [helper.make_node("Relu", ["x"], ["y"], name="r0"), helper.make_node("Tanh", ["x"], ["y"], name="r1")]
    _refused(_model(twice), "<onnx>:2: node 'r1' (Tanh): output 'y' is already defined by node 'r0' (Relu, node 1)")
    shadow = [helper.make_node("Relu", ["x"], ["x"], name="r0"), helper.make_node("Relu", ["x"], ["y"])]
    _refused(_model(shadow), "<onnx>:1: node 'r0' (Relu): output 'x' is already defined by a graph input")
    over_w = [helper.make_node("Relu", ["x"], ["w"], name="r0"), helper.make_node("Add", ["x", "w"], ["y"])]
    _refused(_model(over_w, [w]), "node 'r0' (Relu): output 'w' is already defined by an initializer")


def test_a_node_reading_an_undefined_value_is_named():
    _refused(_model([helper.make_node("Add", ["x", "nowhere"], ["y"], name="add0")]),
             "<onnx>:1: node 'add0' (Add) reads 'nowhere', which no earlier node, input or initializer defines")


def test_nameless_values_and_an_empty_graph_are_refused():
    _refused(_add_w(numpy_helper.from_array(np.ones(1, np.float32), "")), "initializer #1 has no name")
    _refused(_model([], inputs=[], outputs=[]), "the graph declares no outputs")
    _refused(_model([]), "graph output 'y' is produced by no node")


# --- attributes -------------------------------------------------------------------------------

def test_attributes_of_the_wrong_type_or_missing_are_named():
    _refused(_model([helper.make_node("Softmax", ["x"], ["y"], name="sm", axis="last")]),
             "node 'sm' (Softmax): attribute 'axis' is of type STRING, but Softmax (opset 17) takes INT")
    _refused(_model([helper.make_node("Constant", [], ["y"], name="c", value=1.5)], inputs=[]),
             "node 'c' (Constant): attribute 'value' is of type FLOAT, but Constant (opset 17) takes TENSOR")
    x4 = [helper.make_tensor_value_info("x", F, [1, 1, 4, 4])]
    _refused(_model([helper.make_node("MaxPool", ["x"], ["y"], name="mp")], inputs=x4),
             "node 'mp' (MaxPool): the required attribute(s) 'kernel_shape' are missing")
    _refused(_model([helper.make_node("Cast", ["x"], ["y"], name="cast0")]),
             "node 'cast0' (Cast): the required attribute(s) 'to' are missing")


def test_untyped_and_function_reference_attributes_are_refused():
    node = helper.make_node("Relu", ["x"], ["y"], name="r")
    node.attribute.add().name = "junk"
    _refused(_model([node]), "node 'r' (Relu): attribute 'junk' has no type (UNDEFINED)")
    node = helper.make_node("Relu", ["x"], ["y"], name="r")
    attr = node.attribute.add()
    attr.name, attr.type, attr.ref_attr_name = "junk", AttributeProto.INT, "outer"
    _refused(_model([node]), "attribute 'junk' refers to 'outer', an attribute of an enclosing function")


# --- the real command -------------------------------------------------------------------------

def _cli_cases(tmp_path: Path) -> dict[str, tuple[Path, list[str], str]]:
    cases = {
        "short_raw_data": (_add_w(_tensor(raw_data=b"\0" * 8)), [], "initializer 'w', read by node 'add0' (Add): "
                                                                  "raw_data holds 8 bytes"),
        "cast_to_12345": (_model([helper.make_node("Cast", ["x"], ["y"], name="cast0", to=12345)]), [],
                          "node 'cast0' (Cast): attribute 'to': 12345 is not an ONNX element-type code"),
        "traversal": (_add_w(_external("../secret.bin")), [], "points outside the model's folder"),
        "unknown_input_shape": (_relu(), ["--input-shape", "images=2,3"],
                                "a shape is given for 'images', which is not an input of the model; its inputs "
                                "are: 'x'"),
    }
    out = {}
    for name, (model, flags, expected) in cases.items():
        out[name] = (_save(model, tmp_path / "models" / f"{name}.onnx"), flags, expected)
    garbage = tmp_path / "models" / "garbage.onnx"
    garbage.write_bytes(b"\x08\x08\x12\xff\xff\xff\xff\x0f")
    out["garbage"] = (garbage, [], "not a valid ONNX model")
    return out


def test_partita_import_reports_each_malformed_file_in_one_line(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 24)  # what the traversal case points at
    (tmp_path / "models").mkdir()
    for name, (src, flags, expected) in _cli_cases(tmp_path).items():
        r = subprocess.run([sys.executable, "-m", "partita", "import", str(src), *flags, "-o", "out.pir"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert r.returncode == 1, (name, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {src}"), (name, r.stderr)
        assert expected in lines[0], (name, lines[0])
        assert "Traceback" not in r.stderr and r.stdout == ""
        assert not (tmp_path / "out.pir").exists()


# --- names that are not text, operands of the wrong rank or missing -----------------------

def _with_bytes(model, old: bytes, new: bytes):
    """``model`` with a name replaced by bytes of the same length (protobuf then gives bytes
    for a string field that is not valid UTF-8)."""
    data = model.SerializeToString()
    assert data.count(old) == 1
    return onnx.load_from_string(data.replace(old, new))


@pytest.mark.parametrize("where, fragments", [
    ("graph", ("the graph name",)),
    ("value", ("node 'n0' (Relu)", "input 0", "not valid UTF-8")),
    ("node", ("node 'bad\\xec' (Relu)", "not valid UTF-8")),
])
def test_a_name_that_is_not_utf8_is_refused(where, fragments):
    x = helper.make_tensor_value_info("x", F, [2, 3])
    if where == "graph":
        model = _with_bytes(_model([helper.make_node("Relu", ["x"], ["y"], name="n0")]), b"\x12\x01m", b"\x12\x01\xec")
    elif where == "value":
        model = _model([helper.make_node("Relu", ["xval"], ["y"], name="n0")],
                       inputs=[x, helper.make_tensor_value_info("xvaL", F, [2, 3])])
        data = model.SerializeToString().replace(b"xval", b"xv\xecl").replace(b"xvaL", b"xval")
        model = onnx.load_from_string(data)
    else:
        model = _with_bytes(_model([helper.make_node("Relu", ["x"], ["y"], name="badX")]), b"badX", b"bad\xec")
    _refused(model, *fragments)


def test_an_axes_operand_of_rank_two_names_the_node():
    axes = numpy_helper.from_array(np.array([[0], [1]], dtype=np.int64), "axes")
    model = _model([helper.make_node("Unsqueeze", ["x", "axes"], ["y"], name="u")], inits=[axes])
    _refused(model, "node 'u' (Unsqueeze)", "axes (input 1) must be a 1-D list", "[2, 1]")


def test_a_constant_operand_that_is_missing_names_the_node():
    # Slice needs starts and ends (inputs 1 and 2); only the data is given.
    model = _model([helper.make_node("Slice", ["x"], ["y"], name="s")])
    _refused(model, "node 's' (Slice)", "missing")
