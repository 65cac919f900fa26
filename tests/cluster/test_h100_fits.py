"""The two H100 fits of the simulator, each one figure on one published row (bench/bench_simulate.py
--fit-llama3-gemm, --fit-500w; docs/benchmarks.md): meta-h100-roce's gemm efficiency on Llama 3
Table 4's 8,192-GPU row, and grand-teton-h100-500w's sustained clock on TorchTitan's 8-GPU eager
row. Each fitted file reproduces its row within 2%; the other rows are checks and are reported
(their errors are not asserted: they are what the fit predicts, written in the docs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from partita.cluster import load_cluster

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_simulate.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_simulate_fits", _BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_h100_files_carry_one_fit_each():
    meta = load_cluster("meta-h100-roce")
    for name in ("dgx-h100", "dgx-h200"):                       # the same H100 silicon, carried over
        assert load_cluster(name).efficiency == meta.efficiency
    gt = load_cluster("grand-teton-h100-500w")
    assert gt.efficiency.gemm == meta.efficiency.gemm           # the gemm efficiency carried, the clock fitted
    clock = gt.device.flops("bf16") / 989.4e12
    assert 0.5 < clock < 1                                       # below the SXM datasheet's peak at 500 W
    for dtype, peak in meta.device.peak_flops.items():           # one clock for every dense peak
        assert gt.device.flops(dtype) == pytest.approx(peak * clock, rel=1e-3)


def test_fit_scalar_finds_the_root_and_refuses_a_bracket_without_it():
    bench = _bench()
    x, err, tried = bench.fit_scalar(lambda v: 1 - 0.7 / v, 0.5, 1.0)
    assert x == pytest.approx(0.7, rel=2e-3) and abs(err) <= 0.002 and len(tried) >= 3
    with pytest.raises(ValueError, match=r"bracket \[0.8, 1.0\] does not hold.*widen it"):
        bench.fit_scalar(lambda v: 1 - 0.7 / v, 0.8, 1.0)


def test_meta_h100_roce_reproduces_its_fitted_row():
    bench = _bench()
    rows = bench.llama3_table4([bench.LLAMA3_FIT_ROW])
    assert len(rows) == 1 and rows[0]["fitted"] and rows[0]["published_tflops"] == 430
    assert abs(rows[0]["error"]) <= 0.02, rows[0]["simulated_tflops"]
    checks = [r[0] for r in bench.LLAMA3_T4 if r[0] != bench.LLAMA3_FIT_ROW]
    assert checks == ["16384", "16384-cp16"]                     # the checks stay in the table


def test_the_500w_clock_reproduces_its_fitted_row_and_the_checks_are_reported():
    bench = _bench()
    rows = bench.torchtitan_table([bench.TORCHTITAN_FIT_ROW])
    assert len(rows) == 1 and rows[0]["fitted"] == "eager" and rows[0]["published_tps"] == 5762
    assert abs(rows[0]["eager_error"]) <= 0.02, rows[0]["eager_tps"]
    # The compiled 8-GPU row is the same program priced fused: reported beside it, not fitted.
    assert rows[0]["simulated_tps"] > rows[0]["eager_tps"] and rows[0]["error"] is not None
    h100 = [r[0] for r in bench.TORCHTITAN if r[5] == "grand-teton-h100-500w"]
    assert h100 == ["8b-h100-op", "8b-h100x128-op", "8b-h100-compile", "8b-h100x128-compile"]
    assert all(bench.torchtitan_fitted(name) is None for name in h100[1:])
