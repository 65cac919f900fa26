"""Planning's imports: what a plan never uses is not loaded (docs/plan.md, "Planning in seconds")."""

import subprocess
import sys


def test_import_leaves_ml_dtypes_and_torch_unloaded():
    """`import partita` and the planner leave ml_dtypes (half a second) and torch unloaded; bf16's NumPy
    dtype still comes from ml_dtypes at its first use."""
    code = ("import sys, partita, partita.planning, partita.cli.plan; "
            "print('ml_dtypes' in sys.modules, 'torch' in sys.modules); "
            "from partita.ir.dtypes import bf16, from_numpy; import numpy as np, ml_dtypes; "
            "print(bf16.np == np.dtype(ml_dtypes.bfloat16), from_numpy(ml_dtypes.bfloat16) is bf16)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "True", "True"], out.stdout


def test_from_numpy_loads_ml_dtypes_by_name():
    """A storage type asked by its NumPy name before any array of it was made."""
    code = ("from partita.ir.dtypes import from_numpy, f8e4m3fn; print(from_numpy('float8_e4m3fn') is f8e4m3fn)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_command_line_plan_equals_in_process_plan(tmp_path):
    """`python -m partita plan` (which leaves its garbage to the exit, uncollected) writes the plan that
    `main([...])` in a process that goes on writes, and leaves the caller's collector as it was."""
    import gc
    import json

    import partita
    from partita.cli import main

    g = partita.models.gpt(layers=2, hidden=64, heads=4, seq=16, vocab=128, batch=8, dtype="bf16")
    model = tmp_path / "gpt.pir"
    partita.save(g, model)
    args = ["plan", str(model), "--nodes", "1", "--devices", "4", "--price", "2"]
    was = gc.isenabled()
    assert main(args + ["-o", str(tmp_path / "in.json")]) == 0
    assert gc.isenabled() == was
    out = subprocess.run([sys.executable, "-m", "partita"] + args + ["-o", str(tmp_path / "cmd.json")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr

    def plan_fields(name: str) -> dict:
        data = json.loads((tmp_path / name).read_text())
        data["report"].pop("seconds")
        return data

    assert plan_fields("cmd.json") == plan_fields("in.json")


def test_bf16_limits_written_out_match_ml_dtypes():
    """The bf16 finfo the fill-value check uses without ml_dtypes is ml_dtypes' own."""
    import ml_dtypes

    from partita.ops.shape import BF16_FINFO

    fi = ml_dtypes.finfo(ml_dtypes.bfloat16)
    assert (BF16_FINFO.max, BF16_FINFO.tiny, BF16_FINFO.nmant) == (float(fi.max), float(fi.tiny), fi.nmant)
