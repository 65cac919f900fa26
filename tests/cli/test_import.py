"""``partita import``: ONNX files and PyTorch factories become .pir + .safetensors that
reproduce the original model, and every way of asking wrongly gets a specific message and
exit code 1 (2 for bad flags)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import partita
from partita.cli import main

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-4


def _onnx_mlp(path: Path, batch: str | int = 4) -> dict[str, np.ndarray]:
    """A two-layer MLP (Gemm, Relu, MatMul, Add, Tanh) written with onnx.helper; returns its weights."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w = {"w1": rng.standard_normal((6, 10)).astype(np.float32), "b1": rng.standard_normal(10).astype(np.float32),
         "w2": rng.standard_normal((10, 3)).astype(np.float32), "b2": rng.standard_normal(3).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["m"]),
             helper.make_node("Add", ["m", "b2"], ["a"]),
             helper.make_node("Tanh", ["a"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
                          [numpy_helper.from_array(a, n) for n, a in w.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return w


def test_onnx_mlp_imports_and_matches_onnxruntime(tmp_path, capsys) -> None:
    src, out = tmp_path / "mlp.onnx", tmp_path / "mlp.pir"
    _onnx_mlp(src)
    assert main(["import", str(src), "-o", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert out.exists() and out.with_suffix(".safetensors").exists()
    g = partita.load(out)
    assert line.startswith(f"imported @mlp: {len(g)} nodes, 1 inputs, 4 params, {(60 + 10 + 30 + 3) * 4} bytes "
                           "of weights, ")
    assert {n.op for n in g.nodes} >= {"matmul", "relu", "tanh"}

    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    (ref,) = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for backend in ("numpy", "torch"):
        (got,) = partita.run(g, {"x": x}, backend=backend)
        np.testing.assert_allclose(np.asarray(got), ref, rtol=TOL, atol=TOL)
    # `partita run` takes the written files as they are.
    assert main(["run", str(out)]) == 0
    assert "f32[4,3]" in capsys.readouterr().out


def test_onnx_symbolic_batch_is_fixed_with_input_shape(tmp_path, capsys) -> None:
    src, out = tmp_path / "mlp.onnx", tmp_path / "mlp.pir"
    _onnx_mlp(src, batch="N")
    assert main(["import", str(src), "-o", str(out), "--input-shape", "x=7,6"]) == 0
    g = partita.load(out)
    assert [str(v.type) for v in g.inputs if v.role == "input"] == ["f32[7,6]"]
    assert str(g.outputs[0].type) == "f32[7,3]"


@pytest.mark.parametrize("spec", ["x", "x=8,a", "=8", "x=8;2"])
def test_bad_input_shape_is_named(tmp_path, capsys, spec) -> None:
    src = tmp_path / "mlp.onnx"
    _onnx_mlp(src, batch="N")
    assert main(["import", str(src), "-o", str(tmp_path / "m.pir"), "--input-shape", spec]) == 1
    err = capsys.readouterr().err
    assert f"--input-shape {spec!r}" in err and "NAME=D0,D1" in err


FACTORY = '''\
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.fc = nn.Linear(8, 4)
        self.drop = nn.Dropout(0.5)  # must be off: the command puts the module in eval mode

    def forward(self, ids, scale):
        return torch.relu(self.fc(self.drop(self.emb(ids)))) * scale


def build():
    torch.manual_seed(0)
    return Net()


def not_a_module():
    return 3


def broken():
    raise RuntimeError("no checkpoint here")


VALUE = 1
'''


@pytest.fixture
def factory_pkg(tmp_path, monkeypatch):
    """A package ``mypkg.models`` in a fresh directory that is the current directory."""
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(FACTORY)
    (tmp_path / "raises_on_import.py").write_text("raise ValueError('bad config value')\n")
    (tmp_path / "needs_missing.py").write_text("import surely_not_a_real_module_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.split(".")[0] in ("mypkg", "raises_on_import", "needs_missing")]:
        del sys.modules[name]


def test_torch_factory_imports_and_matches_eager(factory_pkg, capsys) -> None:
    import torch

    out = factory_pkg / "net.pir"
    assert main(["import", "mypkg.models:build", "--example", "i64[2,5]", "--example", "f32[2,5,4]",
                 "-o", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("imported @Net:") and "2 inputs" in line and "3 params" in line
    assert f"{(16 * 8 + 8 * 4 + 4) * 4} bytes of weights" in line

    from mypkg.models import build

    model = build().eval()
    ids = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(3))
    scale = torch.randn(2, 5, 4)
    with torch.no_grad():
        ref = model(ids, scale).numpy()
    g = partita.load(out)
    for backend in ("numpy", "torch"):
        (got,) = partita.run(g, [ids.numpy(), scale.numpy()], backend=backend)
        np.testing.assert_allclose(np.asarray(got), ref, rtol=TOL, atol=TOL)
    assert main(["run", str(out), "--backend", "torch"]) == 0


@pytest.mark.parametrize("argv, expected", [
    (["nosuchpkg.models:build", "--example", "f32[2]"], "cannot find module 'nosuchpkg.models'"),
    (["mypkg.nomodule:build", "--example", "f32[2]"], "cannot find module 'mypkg.nomodule'"),
    (["mypkg.models:biuld", "--example", "f32[2]"], "has no 'biuld' (did you mean 'build'?)"),
    (["mypkg.models:VALUE", "--example", "f32[2]"], "is a int, not a function"),
    (["mypkg.models:not_a_module", "--example", "f32[2]"], "returned a int, not a torch.nn.Module"),
    (["mypkg.models:broken", "--example", "f32[2]"], "calling mypkg.models:broken() failed: RuntimeError: "
                                                     "no checkpoint here"),
    (["raises_on_import:f", "--example", "f32[2]"], "importing raises_on_import failed: ValueError: bad config"),
    (["needs_missing:f", "--example", "f32[2]"], "importing needs_missing failed: ModuleNotFoundError"),
    (["not a path", "--example", "f32[2]"], "neither an .onnx file nor a factory path"),
    (["mypkg.models:build", "--example", "f33[2,5]"], "--example 'f33[2,5]' is not a tensor type"),
    (["mypkg.models:build", "--example", "i64[2,5"], "expected ',' or ']' in the shape"),
    (["mypkg.models:build"], "give the type of each positional input"),
    # Example types torch cannot make, caught before torch is asked (they were internal errors).
    (["mypkg.models:build", "--example", "f32[99999999999999]"], "more than this machine's"),
    (["mypkg.models:build", "--example", "f32[" + ",".join(["1"] * 70) + "]"], "70 dims, more than the 64"),
    (["mypkg.models:build", "--example", "u4[3]"], "u4 is a storage type"),
    # A wrong example type reaches torch.export, whose message comes back as the importer's error.
    (["mypkg.models:build", "--example", "f32[2,5]", "--example", "f32[2,5,4]"], "torch.export failed on Net"),
    (["mypkg.models:build", "--example", "i64[2,5]", "--input-shape", "x=2"], "--input-shape is for ONNX"),
    (["missing.onnx"], "missing.onnx: no such file"),
])
def test_import_errors_name_the_problem(factory_pkg, capsys, argv, expected) -> None:
    assert main(["import", *argv, "-o", "out.pir"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and expected in err, err
    assert "Traceback" not in err
    assert not (factory_pkg / "out.pir").exists()


def test_unsupported_op_lists_the_model_line(factory_pkg, capsys) -> None:
    (factory_pkg / "odd.py").write_text(
        "import torch\n\nclass Odd(torch.nn.Module):\n    def forward(self, x):\n"
        "        return torch.linalg.qr(x)[0]\n\ndef build():\n    return Odd()\n")
    assert main(["import", "odd:build", "--example", "f32[3,3]", "-o", "odd.pir"]) == 1
    err = capsys.readouterr().err
    assert "cannot import Odd" in err and f"{factory_pkg / 'odd.py'}:5" in err
    sys.modules.pop("odd", None)


def test_onnx_flags_and_output_suffix_are_checked(tmp_path, capsys) -> None:
    src = tmp_path / "mlp.onnx"
    _onnx_mlp(src)
    assert main(["import", str(src), "--example", "f32[2]", "-o", str(tmp_path / "m.pir")]) == 1
    assert "--example is for PyTorch factories" in capsys.readouterr().err
    assert main(["import", str(src), "-o", str(tmp_path / "m.txt")]) == 1
    assert "must be a .pir file" in capsys.readouterr().err
    assert main(["import", str(src)]) == 2  # -o is required: a usage error


def test_real_command_imports_a_factory_from_the_current_directory(tmp_path) -> None:
    (tmp_path / "tiny.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(3, 2)\n")
    r = subprocess.run([sys.executable, "-m", "partita", "import", "tiny:build", "--example", "f32[4,3]",
                        "-o", "tiny.pir"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("imported @Linear: ") and (tmp_path / "tiny.safetensors").exists()
    g = partita.load(tmp_path / "tiny.pir")
    assert sorted(v.role for v in g.inputs) == ["input", "param", "param"]


def test_parse_type_reads_one_pir_type_and_nothing_else() -> None:
    from partita.ir.diagnostics import ParseError
    from partita.ir.dtypes import bool_, i64
    from partita.ir.parser import parse_type

    t = parse_type(" i64[2, 16] ")
    assert t.shape == (2, 16) and t.dtype == i64
    assert parse_type("bool[]").dtype == bool_ and parse_type("bool[]").shape == ()
    with pytest.raises(ParseError, match=r"<type>:1:8: error: unexpected 'x' after the type f32\[2\]"):
        parse_type("f32[2] x")
