"""The measured schedule under the predicted one: each pp rank's F, B and W as a real launch
ran them, the recvs' waits marked (headless Chromium; skipped without one)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import partita
from partita.runtime.parallel_run import launch
from partita.view import page_data, view

from .browser import need_browser, page_test


@pytest.fixture(scope="module")
def launched():
    fwd = partita.models.gpt(2, 64, 4, 16, 128, batch=8, dtype="f32")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    prog = partita.parallelize(step, "pp=2,dp=2", "pp+dp", microbatches=4)
    rng = np.random.default_rng(0)
    weights = {v.name: (rng.standard_normal(v.type.shape) * 0.02).astype(np.float32)
               for v in step.inputs if v.role == "param"}
    data = [{"ids": rng.integers(0, 128, (8, 16)).astype(np.int64),
             "target": rng.integers(0, 128, (8, 16)).astype(np.int64)} for _ in range(3)]
    return prog, launch(prog, 4, data, weights, timeout_s=120)


def test_the_page_data_holds_each_stages_actions_of_one_step(launched):
    prog, res = launched
    m = page_data(prog, run=res)["pipeline"]["schedule"]["measured"]
    a = m["actions"]
    assert a["step"] in (1, 2) and a["span"] == res.run.step_seconds()[a["step"]]
    assert [row["rank"] for row in a["rows"]] == [0, 2]   # the first rank of each stage
    for p, row in enumerate(a["rows"]):
        got = [tuple(b[:5]) for b in row["bars"]]
        want = [(k, mb, c, round(s, 7), round(e, 7)) for k, mb, c, s, e in res.run.action_times[row["rank"]][a["step"]]]
        assert got == want
        assert [b[0] + str(b[1]) for b in row["bars"] if b[0] in "FBW"] == \
            [x.kind + str(x.mb) for x in prog.schedule.actions[p]]


def test_the_measured_bars_come_in_the_schedules_order_on_each_rank(launched, tmp_path):
    need_browser()
    prog, res = launched
    assert prog.schedule.name == "1f1b"
    d = page_data(prog, run=res)["pipeline"]["schedule"]["measured"]["actions"]
    r = page_test(Path(view(prog, tmp_path / "pp.html", run=res)), "gantt")
    assert r["errors"] == []
    # one measured bar per action, drawn in the order the schedule runs them on each rank
    assert r["measuredRows"] == r["rows"]
    assert r["actions"] == sum(len(row["bars"]) for row in d["rows"])
    assert r["waits"] == sum(b[0].startswith("recv") for row in d["rows"] for b in row["bars"]) > 0
    assert r["measured"] == 2 * 2   # the per-rank busy and waiting bars are still there
