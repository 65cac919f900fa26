"""The kernel cache on disk, and what happens when code generation cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import partita
from partita.codegen import CompiledProgram, fallbacks, jit
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES

ROOT = Path(__file__).resolve().parents[2]

_CHILD = r"""
import json, sys, torch
import partita
from partita.codegen import CompiledProgram
g = partita.parse(open(sys.argv[1]).read())
p = CompiledProgram(g)
x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
out = p([x])[0]
print(json.dumps({"cache": p.cache, "sum": float(out.sum()), "seconds": p.compile_seconds}))
"""

_GRAPH = """graph @f(%x: f32[4,6]) -> (f32[4,6]) {
  %0 = full() {shape=[], value=SCALE} : f32[]
  %1 = mul(%x, %0) : f32[4,6]
  %2 = tanh(%1) : f32[4,6]
  %3 = add(%2, %x) : f32[4,6]
  return %3
}
"""


def _child(tmp: Path, cache: Path, scale: float) -> dict:
    src = tmp / f"g{scale}.pir"
    src.write_text(_GRAPH.replace("SCALE", repr(scale)))
    env = dict(os.environ, PARTITA_CACHE_DIR=str(cache))
    r = subprocess.run([sys.executable, "-c", _CHILD, str(src)], env=env, capture_output=True, text=True,
                       cwd=str(ROOT), timeout=120)
    assert r.returncode == 0, r.stderr
    return {"warnings": r.stderr, **json.loads(r.stdout.strip().splitlines()[-1])}


def test_a_second_process_reuses_the_kernel(tmp_path):
    cache = tmp_path / "cache"
    first = _child(tmp_path, cache, 0.25)
    second = _child(tmp_path, cache, 0.25)
    assert first["cache"]["compiled"] == 1 and first["cache"]["disk_hits"] == 0
    assert second["cache"]["compiled"] == 0 and second["cache"]["disk_hits"] == 1
    assert first["sum"] == second["sum"]
    assert len(list(cache.rglob("*.o"))) == 1


def test_a_damaged_entry_is_noticed_compiled_again_and_replaced(tmp_path):
    cache = tmp_path / "cache"
    good = _child(tmp_path, cache, 0.5)
    (entry,) = cache.rglob("*.o")
    data = entry.read_bytes()
    entry.write_bytes(data[: len(data) // 2] + b"\x00garbage")
    again = _child(tmp_path, cache, 0.5)
    assert again["cache"]["compiled"] == 1
    assert "damaged" in again["warnings"] and str(entry) in again["warnings"]
    assert again["sum"] == good["sum"]
    third = _child(tmp_path, cache, 0.5)
    assert third["cache"]["disk_hits"] == 1 and "damaged" not in third["warnings"]


def test_an_unwritable_cache_is_reported_once_and_kernels_still_run(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    res = _child(tmp_path, blocker / "kernels", 0.75)
    assert "kernel cache is not usable" in res["warnings"] and "PARTITA_CACHE_DIR" in res["warnings"]
    assert res["cache"]["compiled"] == 1
    ref = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    assert res["sum"] == pytest.approx(float((torch.tanh(ref * 0.75) + ref).sum()), rel=1e-6)


def test_a_body_without_a_kernel_runs_on_aten_and_is_named():
    """A fused node made by hand whose body has f16 (no kernel dtype): ATen runs it, the
    report and fallbacks() say so, and the result is right."""
    b = Builder()
    h = b.input("h", TensorType((3, 5), DTYPES["f16"]))
    body = verify(b.ret(b.tanh(b.add(h, h))))
    text = partita.print_graph(body)
    outer = Builder()
    x = outer.input("x", TensorType((3, 5), DTYPES["f16"]))
    y = outer.emit("fused", x, body=text)
    g = verify(outer.ret(y))
    n0 = len(fallbacks())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        prog = CompiledProgram(g, fuse=False)
    assert any("runs op by op on ATen" in str(m.message) and "f16" in str(m.message) for m in w)
    assert len(fallbacks()) == n0 + 1 and "f16" in fallbacks()[-1].reason
    assert "on ATen" in prog.report()
    xs = torch.randn(3, 5).half()
    assert torch.allclose(prog([xs])[0].float(), torch.tanh(xs + xs).float(), atol=1e-3)


def test_fused_node_with_a_bad_body_is_a_type_error():
    outer = Builder()
    x = outer.input("x", TensorType((3, 5), DTYPES["f32"]))
    with pytest.raises(partita.PartitaError, match="body"):
        outer.emit("fused", x, body="graph @k(%x0: f32[3,4]) -> (f32[3,4]) {\n  return %x0\n}\n")
    with pytest.raises(partita.PartitaError, match="does not parse"):
        outer.emit("fused", x, body="not a graph")


def test_emit_kernels_cli(tmp_path):
    src = tmp_path / "g.pir"
    src.write_text(_GRAPH.replace("SCALE", "0.5"))
    r = subprocess.run([sys.executable, "-m", "partita", "opt", str(src), "--emit=kernels"], capture_output=True,
                       text=True, cwd=str(ROOT), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "; ---- kernel pk_" in r.stdout and "define void @pk_" in r.stdout and ";     %2 = tanh" in r.stdout
    r = subprocess.run([sys.executable, "-m", "partita", "opt", str(src), "--emit=kernels-optimized"],
                       capture_output=True, text=True, cwd=str(ROOT), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "<8 x float>" in r.stdout or "<16 x float>" in r.stdout  # the inner loop is vectorized


def test_jit_key_depends_on_the_ir():
    j = jit()
    assert j.key("a") != j.key("b") and j.key("a") == j.key("a")


def test_without_a_working_compiler_programs_run_on_aten(monkeypatch):
    """LLVM missing or failing: every kernel falls back to ATen with the reason, nothing crashes,
    results are right (the AdamW update keeps its ATen implementation too)."""
    jit_mod = sys.modules["partita.codegen.jit"]

    def broken():
        raise jit_mod.CodegenError("the code generator needs llvmlite, which is not installed (simulated)")

    monkeypatch.setattr(jit_mod, "jit", broken)  # what every caller looks up, _stats included
    b = Builder()
    x = b.input("x", TensorType((4, 5), DTYPES["f32"]))
    g = verify(b.ret(b.tanh(b.mul(x, x))))
    n0 = len(fallbacks())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        prog = CompiledProgram(g)
    assert any("llvmlite" in str(m.message) for m in w)
    assert len(fallbacks()) > n0
    xs = torch.randn(4, 5)
    assert torch.allclose(prog([xs])[0], torch.tanh(xs * xs))
    bb = Builder()
    T = TensorType((6,), DTYPES["f32"])
    p, gr, m, v = (bb.input(n, T) for n in "pgmv")
    s = bb.input("s", TensorType((), DTYPES["f32"]))
    upd = verify(bb.ret(*bb.adamw_update(p, gr, m, v, s)))
    prog2 = CompiledProgram(upd)
    assert prog2.optimizer_kernels == []
    args = [torch.randn(6), torch.randn(6), torch.zeros(6), torch.zeros(6), torch.tensor(1.0)]
    want = partita.run(upd, [a.numpy() for a in args])
    for got, ref in zip(prog2(args), want):
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-6)
