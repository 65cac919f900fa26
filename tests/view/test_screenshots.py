"""A screenshot of each kind of view page in headless Chromium (skipped without one), after
its self-test ran without a console error. ``PARTITA_VIEW_SHOTS=docs/img`` writes them where
docs/view.md shows them (``view-<name>.png``); otherwise into the test's temporary folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import partita
from partita.view import view

from .browser import page_test, screenshot


def gpt_step(layers: int, hidden: int, heads: int, seq: int, vocab: int, batch: int) -> partita.Graph:
    """A GPT training step with adamw and cross entropy."""
    fwd = partita.models.gpt(layers, hidden, heads, seq, vocab, batch=batch, dtype="f32")
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")


def pages(tmp: Path) -> list[tuple[str, Path, str]]:
    """(picture name, page, self-test) for each kind of view."""
    from partita.cluster import simulate

    out: list[tuple[str, Path, str]] = []
    gpt2 = partita.training_step(partita.models.gpt(12, 768, 12, 1024, 50257, batch=8), loss="cross_entropy")
    g = Path(view(gpt2, tmp / "graph.html"))
    out += [("graph", g, "load"), ("search", g, "search:attention")]
    step4 = gpt_step(4, 64, 4, 16, 128, 8)
    out.append(("collective", Path(view(partita.parallelize(step4, "dp=2,cp=2,tp=2", "dp+megatron+cp"),
                                        tmp / "coll.html")), "collective:0"))
    fwd = partita.models.gpt(2, 64, 4, 16, 128, batch=8, dtype="f32")
    after = partita.optimize(fwd.clone(), "canonicalize,fuse-activations,cse,dce")
    out.append(("diff", Path(view((fwd, after), tmp / "diff.html")), "diff"))
    wide = gpt_step(4, 256, 4, 16, 128, 8)
    out.append(("compare", Path(view(partita.parallelize(wide, "dp=2,tp=2", "dp+megatron+sp"), tmp / "cmp.html")),
                "compare"))
    out.append(("memory", Path(view(partita.parallelize(wide, "pp=4,dp=2", "pp+dp", microbatches=4),
                                    tmp / "mem.html")), "memory"))
    pp = partita.parallelize(step4, "pp=4", "pp", microbatches=8)
    p = Path(view(pp, tmp / "pp.html", sim=simulate(pp, "selene", trace=True)))
    out += [("gantt", p, "gantt"), ("timeline", p, "timeline")]
    return out


def test_a_screenshot_of_each_view(tmp_path):
    where = Path(os.environ.get("PARTITA_VIEW_SHOTS") or tmp_path)
    for name, page, test in pages(tmp_path):
        r = page_test(page, test)
        assert r["errors"] == [], (name, r["errors"])
        if name == "timeline":   # the pipeline's bubbles: the compute stream's waits drawn red
            assert r["waits"] > 0 and r["spans"] > 0 and r["memory"] > 0
        png = screenshot(page, test, where / f"view-{name}.png")
        assert png.stat().st_size > 1000, name
