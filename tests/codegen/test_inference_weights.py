"""Weights made under torch.inference_mode have no version counter: no packed copy of them can
be kept, so a program given them runs its unpacked kernels at every call. It still computes the
right answer, and says once why it is slow and what to do."""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn as nn

import partita
from partita.codegen import CompiledProgram, library


def test_inference_weights_warn_once_and_stay_right(monkeypatch):
    monkeypatch.setattr(library, "_INFERENCE_WEIGHT_WARNED", [False])
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1)).eval()
    x = torch.randn(2, 8, 12, 12)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fuse-library,fuse-kernels,cse,dce")
    prog = CompiledProgram(g)
    with torch.inference_mode():
        weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
        want = m(x)
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            for _ in range(4):
                torch.testing.assert_close(prog([x], weights)[0], want, rtol=1e-4, atol=1e-5)
    said = [w for w in got if "inference tensor" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in got]
    assert "outside torch.inference_mode" in str(said[0].message)
