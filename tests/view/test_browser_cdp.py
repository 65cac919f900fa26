"""The view pages driven from outside as a user drives them: headless Chromium through the
DevTools protocol (tests/view/cdp.py), typing into the search box, clicking a collective, a
tab, a search hit with the mouse, reading the Gantt bars' drawn positions, with no console
error, uncaught exception or refused request on any kind of page, and a screenshot after a
click. Skipped without a chromium."""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Iterator

import pytest

import partita
from partita.view import view

from .browser import need_browser
from .cdp import Browser, CDPError, Page


def small_step() -> partita.Graph:
    """A 2-layer GPT training step with adamw."""
    fwd = partita.models.gpt(2, 64, 4, 16, 128, batch=8, dtype="f32")
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    need_browser()
    with Browser() as b:
        yield b


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    p = browser.new_page()
    yield p
    p.close()


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One page of each kind: graph, graph over the detail limit, parallel, diff, pipeline with
    its simulation."""
    from partita.cluster import simulate

    tmp = tmp_path_factory.mktemp("cdp")
    step = small_step()
    fwd = partita.models.gpt(2, 64, 4, 16, 128, batch=8, dtype="f32")
    after = partita.optimize(fwd.clone(), "canonicalize,fuse-activations,cse,dce")
    pp = partita.parallelize(step, "pp=2,dp=2", "pp+dp", microbatches=4)
    return {
        "graph": Path(view(step, tmp / "graph.html")),
        "layers": Path(view(step, tmp / "layers.html", detail_limit=10)),
        "parallel": Path(view(partita.parallelize(step, "dp=2,tp=2", "dp+megatron"), tmp / "par.html")),
        "diff": Path(view((fwd, after), tmp / "diff.html")),
        "pipeline": Path(view(pp, tmp / "pp.html", sim=simulate(pp, "selene", trace=True))),
        "mesh3d": Path(view(partita.parallelize(step, "dp=2,cp=2,tp=2", "dp+megatron+cp"), tmp / "m3.html")),
    }


def test_typing_a_name_in_the_search_box_finds_and_shows_the_node(page, pages):
    page.open(pages["graph"])
    page.type("input.gsearch", "attention")
    assert page.text(".gresults .count") == "2 matches"
    hits = page.evaluate("[...document.querySelectorAll('.gresults a.hit')].map(a => a.textContent)")
    assert hits == ["%19 attention  transformer.h.0.attn", "%52 attention  transformer.h.1.attn"]
    page.click(".gresults a.hit:nth-of-type(2)")
    line = page.text(".gdetail pre.pirline")
    assert line.startswith("%52, %53 = attention(") and 'in "transformer.h.1.attn"' in line
    assert "FLOPs" in page.text(".gdetail table.kv")
    # the node is drawn, selected, and scrolled into the part of the graph the user sees
    shown = page.evaluate("""(() => {
      const n = document.querySelector('g.node.sel'), s = document.querySelector('.gscroll');
      if (!n) return null;
      const a = n.getBoundingClientRect(), b = s.getBoundingClientRect();
      return [n.textContent, a.top >= b.top && a.bottom <= b.bottom && a.left >= b.left && a.right <= b.right];
    })()""")
    assert shown and shown[0].startswith("%52 = attention") and shown[1], shown
    # a value's own name finds exactly its node
    page.type("input.gsearch", "%52")
    hits = page.evaluate("[...document.querySelectorAll('.gresults a.hit')].map(a => a.textContent)")
    assert hits[0] == "%52 attention  transformer.h.1.attn" and all("52" in h for h in hits), hits
    assert page.errors() == []


def test_clicking_a_collective_shows_why_it_exists(page, pages):
    page.open(pages["parallel"])
    n = page.evaluate("document.querySelectorAll('.clist a.coll').length")
    assert n > 20
    assert page.text("#why") == "click a collective for why it exists"
    last = f'.clist a.coll[data-i="{n - 1}"]'   # below the list's fold: the click scrolls to it first
    page.click(last)
    head = page.text("#why .whyhead")
    label = page.text(last)
    op, axis = label.split(" over ")[0], label.split(" over ")[1].split(" ")[0]
    assert head.startswith(f"{op} over {axis}: %") and " is placed " in head and " needs " in head
    rows = dict(page.evaluate("[...document.querySelectorAll('#why table.kv tr')].map(r => "
                              "[r.cells[0].textContent, r.cells[1].textContent])"))
    assert rows["op"] == op and rows["axis"] == axis and rows["consumer"] in head
    assert int(rows["bytes"]) > 0 and rows["have"] in head and rows["want"] in head
    assert "producer's placement (have)" in page.text("#why") and "consumer's placement (want)" in page.text("#why")
    assert page.evaluate("document.querySelectorAll('#why td.rank').length") == 2 * 4   # have and want, 4 ranks
    # the first one next: the why follows the click
    page.click('.clist a.coll[data-i="0"]')
    assert page.text("#why .whyhead").startswith("all_reduce over tp: %0 is placed [dp, -, -] partial(tp)")
    assert page.evaluate("document.querySelectorAll('#why td.partial').length") == 4
    assert page.errors() == []


def bar_rows(page: Page) -> list[list[tuple[str, float, float]]]:
    """The Gantt bars as drawn: per row from top to bottom, (label, left, right) from left to right."""
    bars = page.evaluate("""[...document.querySelectorAll('#gantt g.bar')].map(g => {
      const r = g.querySelector('rect').getBoundingClientRect();
      return [g.dataset.k + g.dataset.mb, r.left, r.right, r.top];
    })""")
    tops = sorted({round(b[3]) for b in bars})
    return [sorted(((k, x0, x1) for k, x0, x1, y in bars if round(y) == t), key=lambda b: b[1]) for t in tops]


def test_the_1f1b_gantt_bars_are_drawn_in_order(page, pages):
    page.open(pages["pipeline"])
    page.click('#tabs button[data-view="schedule"]')
    rows = bar_rows(page)
    assert [[k for k, _, _ in r] for r in rows] == [["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"],
                                                    ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]]
    for r in rows:   # one rank runs one thing at a time
        assert all(a[2] <= b[1] + 0.5 for a, b in zip(r, r[1:]))
    at = [{k: (x0, x1) for k, x0, x1 in r} for r in rows]
    for mb in range(4):   # an activation goes forward before the next stage uses it, its gradient back
        assert at[0][f"F{mb}"][1] <= at[1][f"F{mb}"][0] + 0.5
        assert at[1][f"B{mb}"][1] <= at[0][f"B{mb}"][0] + 0.5
    assert page.evaluate("document.querySelectorAll('#gantt .links line').length") == 8
    assert page.errors() == []


TABS_JS = "[...document.querySelectorAll('#tabs button')].map(b => b.dataset.view)"
SHOWN_JS = """(() => { const v = [...document.querySelectorAll('section.view')].filter(s => s.style.display !== 'none');
  return v.map(s => [s.id, s.getBoundingClientRect().height, s.querySelectorAll('svg, canvas, table').length]); })()"""


@pytest.mark.parametrize("kind,tabs", [
    ("graph", ["graph"]), ("layers", ["graph"]), ("parallel", ["parallel", "memory"]), ("diff", ["before / after"]),
    ("pipeline", ["schedule", "stage 0", "memory", "timeline"]), ("mesh3d", ["parallel", "memory"])])
def test_every_view_of_each_kind_of_page_opens_without_a_console_error(page, pages, kind, tabs):
    page.open(pages[kind])
    assert page.evaluate(TABS_JS) == tabs
    for t in reversed(tabs):   # every tab, each drawn when first clicked
        page.click(f'#tabs button[data-view="{t}"]')
        shown = page.evaluate(SHOWN_JS)
        assert len(shown) == 1 and shown[0][0] == "view-" + t and shown[0][1] > 100 and shown[0][2] > 0, (t, shown)
        assert page.evaluate("document.querySelector('#tabs button.on').dataset.view") == t
    if kind == "layers":
        assert "showing its layers only" in page.text("#too-large")
    assert page.text("#errors") == ""
    assert page.errors() == []


def png_size(png: Path) -> tuple[int, int]:
    """A PNG's width and height, from its header."""
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
    w, h = struct.unpack(">II", head[16:24])
    return w, h


def test_a_screenshot_after_a_click(page, pages, tmp_path):
    page.open(pages["pipeline"])
    before = page.screenshot(tmp_path / "schedule.png")
    page.click('#tabs button[data-view="timeline"]')
    after = page.screenshot(tmp_path / "timeline-after-click.png")
    assert png_size(before) == png_size(after) == (1300, 850)
    assert before.read_bytes() != after.read_bytes() and after.stat().st_size > 5000
    assert page.evaluate("document.querySelectorAll('#view-timeline svg rect').length") > 0
    assert page.errors() == []


def test_the_client_sees_errors_and_never_hangs(browser, tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><p id=x>x</p><script>console.error('said so'); "
                   "setTimeout(() => { throw new Error('thrown later'); }, 0);</script></body></html>")
    p = browser.new_page()
    p.call("Page.navigate", {"url": bad.as_uri()})
    p.wait_for("document.readyState === 'complete'", "the page to load")
    time.sleep(0.2)
    errs = p.errors()
    assert any("said so" in e for e in errs) and any("thrown later" in e for e in errs), errs
    with pytest.raises(CDPError, match="no element '#nope' on the page"):
        p.click("#nope")
    p.close()
    with Browser() as hung:   # a page that never answers fails in the time given, and is killed
        q = hung.new_page()
        t0 = time.monotonic()
        with pytest.raises(CDPError, match="no answer from chromium in time"):
            q.call("Runtime.evaluate", {"expression": "while (true) {}"}, timeout=2)
        assert time.monotonic() - t0 < 10
    assert hung.proc.poll() is not None


def test_the_axis_filter_by_keyboard_and_a_rank_programs_collective_by_search(page, pages):
    page.open(pages["parallel"])
    assert page.evaluate("[...document.querySelectorAll('#axis-filter option')].map(o => o.value)") == ["", "tp", "dp"]
    every = page.evaluate("document.querySelectorAll('.clist a.coll').length")
    page.click("#axis-filter")   # the first axis chosen with the keyboard, as a user picks it
    page.press("ArrowDown")
    page.press("Enter")
    assert page.evaluate("document.querySelector('#axis-filter').value") == "tp"
    tp = page.evaluate("[...document.querySelectorAll('.clist a.coll')].map(a => a.textContent)")
    assert 0 < len(tp) < every and all(" over tp of " in t for t in tp)
    # the rank's program (right): its collectives found by op, each added by the rewrite
    page.type(".side:last-child input.gsearch", "all_reduce")
    assert page.text(".side:last-child .gresults .count").endswith(" matches")
    page.click(".side:last-child .gresults a.hit")
    assert page.text(".side:last-child .gdetail pre.pirline").split(" = ")[1].startswith("all_reduce(")
    assert "added by the rewrite (collective)" in page.text(".side:last-child .gdetail")
    assert page.errors() == []


def test_a_pass_s_changes_found_by_clicking_the_marked_boxes(page, pages):
    page.open(pages["diff"])
    assert "node(s) only before" in page.text("#diff-summary")
    for side in ("first", "last"):   # open a marked layer, then click a marked node in it
        sel = f".side:{side}-child"
        for _ in range(6):   # layers inside layers: open marked ones until a marked node shows
            if page.evaluate(f"!!document.querySelector('{sel} g.node.changed')"):
                break
            page.click(f"{sel} g.group.changed")
        page.click(f"{sel} g.node.changed")
        assert page.evaluate(f"document.querySelector('{sel} g.node.changed.sel') !== null")
        assert " = " in page.text(f"{sel} .gdetail pre.pirline")
    assert page.errors() == []


def test_clicking_a_span_of_the_timeline_says_what_ran(page, pages):
    page.open(pages["pipeline"])
    page.click('#tabs button[data-view="timeline"]')
    assert page.text("#span-info") == "click a span"
    T = page.evaluate("(D => ({step: D.sim.step, ranks: D.sim.ranks.map(r => r.rank), "
                      "streams: Object.keys(D.sim.streams), c0: D.sim.streams['0|compute']}))(PARTITA.D)")
    # where the timeline draws it (its layout: rows of 18 px every 22 px from y=10, spans from x=150 to 1100):
    # rank 0's longest compute span
    rows = [(r, s) for r in T["ranks"] for s in sorted(k.split("|")[1] for k in T["streams"] if int(k.split("|")[0]) == r)]
    row = rows.index((0, "compute"))
    s, e, name = max(T["c0"], key=lambda q: q[1] - q[0])[:3]
    scale = (1100 - 150) / T["step"]
    page.click_at("#timeline", 150 + (s + e) / 2 * scale, 10 + row * 22 + 9)
    assert page.text("#span-info").startswith(f"rank 0 compute: {name} ")
    assert page.text("#span-info").endswith(f"{s * 1e3:.3f}-{e * 1e3:.3f} ms")
    assert page.errors() == []


def test_a_3d_mesh_collective_clicked_draws_a_grid_of_grids(page, pages):
    page.open(pages["mesh3d"])
    page.click('.clist a.coll[data-i="0"]')
    assert " partial(tp) where " in page.text("#why .whyhead")
    count = "document.querySelectorAll('#why {}').length"
    assert page.evaluate(count.format(".pgrid")) == 2 * 2        # have and want: one 2x2 grid per dp coordinate
    assert page.evaluate(count.format("td.rank")) == 2 * 8
    assert page.evaluate(count.format("td.partial")) == 8        # the producer's partial sums, on every rank
    assert page.errors() == []


def test_the_memory_curves_peak_line_stands_where_the_stack_is_highest(page, pages):
    page.open(pages["pipeline"])
    page.click('#tabs button[data-view="memory"]')
    curves = page.evaluate("""[...document.querySelectorAll('#view-memory .mcurve')].map(c => {
      const areas = [...c.querySelectorAll('polygon.marea')], top = areas[areas.length - 1];
      const pts = top.getAttribute('points').split(' ').map(p => p.split(',').map(Number));
      const upper = pts.slice(0, pts.length / 2), y = Math.min(...upper.map(p => p[1]));
      const line = c.querySelector('line.mpeak');
      return [c.dataset.rank, areas.length, upper.filter(p => p[1] === y).map(p => p[0]), +line.getAttribute('x1'),
              c.querySelector('b').textContent];
    })""")
    assert [c[0] for c in curves] == ["0", "2"]   # alike ranks once: one curve per stage
    for rank, areas, highest, x, head in curves:
        assert areas >= 5 and head.startswith(f"rank {rank} \u00d72: peak ")
        assert any(abs(h - x) <= 1.5 for h in highest), (rank, highest, x)
    assert page.errors() == []
