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
