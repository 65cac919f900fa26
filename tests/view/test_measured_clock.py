"""The measured schedule on one clock: every pp rank's actions of one step drawn on the
ranks' common clock, each send joined by a line to the recv that waits for it, none
drawn ending before it starts (headless Chromium; skipped without one)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import partita
from partita.runtime.action_times import transfer_pairs
from partita.runtime.parallel_run import launch
from partita.view import page_data, view

from .browser import need_browser, page_test, screenshot


@pytest.fixture(scope="module", params=[("1f1b", 1), ("interleaved", 2)], ids=["1f1b", "interleaved"])
def launched(request):
    schedule, virtual = request.param
    fwd = partita.models.gpt(4 * virtual, 32, 2, 8, 64, batch=4, dtype="f32")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    prog = partita.parallelize(step, "pp=4", "pp", microbatches=4, schedule=schedule, virtual_stages=virtual)
    rng = np.random.default_rng(0)
    weights = {v.name: (rng.standard_normal(v.type.shape) * 0.02).astype(np.float32)
               for v in step.inputs if v.role == "param"}
    data = [{"ids": rng.integers(0, 64, (4, 8)).astype(np.int64),
             "target": rng.integers(0, 64, (4, 8)).astype(np.int64)} for _ in range(3)]
    return prog, launch(prog, 4, data, weights, timeout_s=180)


def test_the_page_data_puts_the_ranks_on_one_clock(launched):
    prog, res = launched
    a = page_data(prog, run=res)["pipeline"]["schedule"]["measured"]["actions"]
    c = a["clock"]
    assert c["after"] == 0.0 and c["pairs"] == len(a["links"]) == len(transfer_pairs(prog.schedule))
    offsets = [row["offset"] for row in a["rows"]]
    assert min(offsets) == 0.0 and all(o >= 0.0 for o in offsets)
    assert c["common_span"] >= max(o + row["step_s"] for o, row in zip(offsets, a["rows"])) - 1e-6
    for p, i, q, j in a["links"]:
        send, recv = a["rows"][p]["bars"][i], a["rows"][q]["bars"][j]
        assert send[0].startswith("send-") and recv[0].startswith("recv-") and q != p
        # rounded to 0.1 us in the page
        assert offsets[q] + recv[4] >= offsets[p] + send[3] - 3e-7, (send, recv)


def test_the_gantt_joins_each_send_to_its_recv(launched, tmp_path):
    need_browser()
    prog, res = launched
    a = page_data(prog, run=res)["pipeline"]["schedule"]["measured"]["actions"]
    page = Path(view(prog, tmp_path / "pp.html", run=res))
    r = page_test(page, "gantt")
    assert r["errors"] == []
    assert r["mlinks"] == len(a["links"]) > 0 and r["mlinksBack"] == 0
    assert r["measuredRows"] == r["rows"]   # still each rank's actions in the schedule's order
    assert screenshot(page, "gantt", tmp_path / f"clock-{prog.schedule.name}.png", size="1300,900").stat().st_size > 1000
