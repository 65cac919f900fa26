"""``partita.view`` and ``partita view``: one self-contained HTML page per graph, parallel
program, pipeline and simulation, checked in headless Chromium (skipped without one)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import partita
from partita.cli import main
from partita.view import ViewError, page_data, view
from partita.view.data import schedule_bars

from .browser import page_test


def small_step() -> partita.Graph:
    fwd = partita.models.gpt(2, 64, 4, 16, 128, batch=8, dtype="f32")
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")


@pytest.fixture(scope="module")
def step() -> partita.Graph:
    return small_step()


def blob(page: Path) -> dict:
    m = re.search(r'<script type="application/json" id="pdata">(.*?)</script>', page.read_text(), re.S)
    assert m
    return json.loads(m.group(1).replace("<\\/", "</"))


def test_graph_page_is_one_offline_file(step, tmp_path):
    out = tmp_path / "g.html"
    assert view(step, out) == str(out)
    text = out.read_text()
    assert "<script src" not in text and "<link" not in text and "@import" not in text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)
    d = blob(out)
    assert d["kind"] == "graph" and d["graph"]["n"] == len(step) and d["graph"]["detail"]
    assert "transformer.h.1.attn" in d["graph"]["scopes"]
    assert list(tmp_path.iterdir()) == [out]


def test_bad_input_says_what_to_do(step, tmp_path):
    with pytest.raises(ViewError, match="cannot show a dict; give a Graph"):
        view({}, tmp_path / "x.html")
    with pytest.raises(ViewError, match="cannot write .*no/such/folder"):
        view(step, tmp_path / "no" / "such" / "folder" / "x.html")
    d = page_data(step, detail_limit=10)
    assert d["graph"]["detail"] is False and "line" not in d["graph"]


def test_the_command_writes_the_page(step, tmp_path, capsys):
    pir = tmp_path / "step.pir"
    partita.save(step, pir)
    assert main(["view", str(pir)]) == 0
    assert (tmp_path / "step.html").exists() and "wrote the view" in capsys.readouterr().out
    assert main(["view", str(pir), "-o", str(tmp_path / "nope" / "x.html")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["view", str(pir), "--strategy", "dp"]) == 1
    assert "--strategy goes with --mesh" in capsys.readouterr().err


def test_open_opens_the_page_when_a_browser_exists(step, tmp_path, capsys, monkeypatch):
    import partita.cli.view as cli_view

    pir, page, opened = tmp_path / "step.pir", tmp_path / "s.html", []
    partita.save(step, pir)
    monkeypatch.setattr(cli_view.webbrowser, "open", lambda url: opened.append(url) or True)
    monkeypatch.setattr(cli_view.shutil, "which", lambda name: "/usr/bin/" + name)
    assert main(["view", str(pir), "-o", str(page), "--open"]) == 0
    assert opened == ["file://" + str(page.resolve())]
    example = Path(partita.__file__).parent / "examples" / "block.pir"
    assert main(["run", str(example), "--html", str(tmp_path / "run.html"), "--open"]) == 0
    assert opened[-1].endswith("run.html")
    monkeypatch.setattr(cli_view.shutil, "which", lambda name: None)
    assert main(["view", str(pir), "-o", str(page), "--open"]) == 0
    assert len(opened) == 2 and "no browser found to open" in capsys.readouterr().out


def test_the_schedule_bars_follow_1f1b():
    prog = partita.parallelize(small_step(), "pp=2,dp=2", "pp+dp", microbatches=4)
    bars = schedule_bars(prog.schedule)
    assert [b["k"] + str(b["mb"]) for b in bars[0]] == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    assert [b["k"] + str(b["mb"]) for b in bars[1]] == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    assert all(a["e"] <= b["s"] for row in bars for a, b in zip(row, row[1:]))


# ---- in a real browser ----

def test_browser_search_finds_a_node_and_shows_its_line(step, tmp_path):
    out = Path(view(step, tmp_path / "g.html"))
    r = page_test(out, "search:attention")
    assert r["errors"] == []
    assert r["hits"] >= 2 and "attention(" in r["line"] and "transformer.h.0.attn" in r["detailText"]
    assert "FLOPs" in r["detailText"] and 'loc("partita/models/gpt.py":1 in "transformer.h.0.attn")' in r["line"]
    r = page_test(out, "expand")
    assert r["errors"] == [] and r["after"] > r["before"] and r["drawn"] > 0


def test_browser_too_large_graph_falls_back_to_layers(step, tmp_path):
    out = Path(view(step, tmp_path / "g.html", detail_limit=10))
    r = page_test(out, "expand")
    assert r["errors"] == [] and r["after"] < len(step)
    r = page_test(out, "load")
    assert r["errors"] == [] and "over the detailed view's limit of 10: showing its layers only" in r["tooLarge"]


def test_browser_collective_shows_why(step, tmp_path):
    prog = partita.parallelize(step, "dp=2,tp=2", "dp+megatron")
    out = Path(view(prog, tmp_path / "p.html"))
    r = page_test(out, "collective:0")
    assert r["errors"] == []
    c = prog.plan.collectives[0]
    assert f"{c['op']} over {c['axis']}" in r["why"] and "needs" in r["why"]
    assert r["ranks"] == 2 * prog.mesh.size   # have and want, each on every rank
    assert r["filtered"] == prog.plan.count(axis=r["axis"])


def test_browser_a_3d_mesh_is_a_grid_of_grids(step, tmp_path):
    prog = partita.parallelize(step, "dp=2,cp=2,tp=2", "dp+megatron+cp")
    c = prog.plan.collectives[0]
    assert "partial(tp)" in c["have"] and "partial" not in c["want"]
    r = page_test(Path(view(prog, tmp_path / "p.html")), "collective:0")
    assert r["errors"] == []
    assert r["grids"] == 2 * 2 and r["ranks"] == 2 * 8   # per placement one 2x2 grid per dp coordinate
    assert r["partial"] == 8                             # the producer's partial sums, on every rank


def test_browser_gantt_and_timeline(step, tmp_path):
    from partita.cluster import simulate

    prog = partita.parallelize(step, "pp=2,dp=2", "pp+dp", microbatches=4)
    res = simulate(prog, "selene", trace=True)
    alone = page_data(res)
    assert alone["kind"] == "sim" and {r["count"] for r in alone["sim"]["ranks"]} == {2}   # alike ranks once
    out = Path(view(prog, tmp_path / "pp.html", sim=res))
    r = page_test(out, "gantt")
    assert r["errors"] == []
    assert r["rows"][0] == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    assert r["rows"][1] == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    assert r["links"] == 8   # each microbatch's activation sent forward and its gradient back
    r = page_test(out, "timeline")
    assert r["errors"] == [] and r["spans"] > 0 and r["rows"] >= 2


def test_the_command_views_a_saved_plan(tmp_path, capsys):
    g = partita.models.gpt(layers=2, hidden=64, heads=4, seq=16, vocab=128, batch=8, dtype="bf16")
    model, plan, page = tmp_path / "gpt.pir", tmp_path / "plan.json", tmp_path / "plan.html"
    partita.save(g, model)
    assert main(["plan", str(model), "--nodes", "1", "--devices", "4", "--price", "2", "-o", str(plan)]) == 0
    assert main(["view", str(model), "--plan", str(plan), "--cluster", "selene", "-o", str(page)]) == 0
    d = blob(page)
    assert d["kind"] in ("parallel", "pipeline") and "sim" in d
    assert main(["view", str(model), "--plan", str(plan), "--mesh", "dp=4"]) == 1
    assert "the plan names the mesh" in capsys.readouterr().err
    r = page_test(page, "load")
    assert r["errors"] == [] and "timeline" in r["views"]


def test_browser_before_and_after_a_pass_marks_the_differences(tmp_path):
    fwd = partita.models.gpt(2, 64, 4, 16, 128, batch=8, dtype="f32")
    after = partita.optimize(fwd.clone(), "canonicalize,fuse-activations,cse,dce")
    d = page_data((fwd, after))["diff"]
    assert d["before"]["n"] - sum(d["before"]["changed"]) == d["after"]["n"] - sum(d["after"]["changed"])
    assert sum(d["before"]["changed"]) > 0 and sum(d["after"]["changed"]) > 0
    assert page_data((fwd, fwd.clone()))["diff"]["after"]["changed"] == [0] * len(fwd)
    with pytest.raises(ViewError, match="too many to compare node by node"):
        view((fwd, after), tmp_path / "x.html", detail_limit=10)
    r = page_test(Path(view((fwd, after), tmp_path / "d.html")), "diff")
    assert r["errors"] == [] and r["markedBoxes"] > 0
    assert f"{sum(d['before']['changed'])} node(s) only before" in r["summary"]


def test_simulate_and_run_write_the_page(tmp_path, capsys):
    page = tmp_path / "sim.html"
    assert main(["simulate", "--gpt", "2,64,4,16,128,8", "--mesh", "pp=2,dp=2", "--microbatches", "2",
                 "--html", str(page)]) == 0
    d = blob(page)
    assert d["kind"] == "pipeline" and d["sim"]["ranks"] and d["sim"]["streams"]
    # the table's peak memory of a pipeline simulated section by section: the reason it is "-", and
    # each stage's peak as the page walked it
    out = capsys.readouterr().out
    assert "(peak memory -: not computed" in out and "--check-memory walks" in out
    for k, c in enumerate(d["memory"]["ranks"]):
        assert f"stage {k:>3} (rank {c['rank']}, {c['count']} alike): " in out
    assert main(["simulate", "--gpt", "2,64,4,16,128,8", "--html", str(tmp_path / "no" / "x.html")]) == 1
    assert "--html" in capsys.readouterr().err
    example = Path(partita.__file__).parent / "examples" / "block.pir"
    assert main(["run", str(example), "--html", str(tmp_path / "run.html")]) == 0
    assert blob(tmp_path / "run.html")["kind"] == "graph"


# ---- the single-device graph beside a rank's program, memory over the step, the measured bubble ----

@pytest.mark.parametrize("mesh,strategy", [("dp=2,tp=2", "dp+megatron+sp"), ("dp=4", "zero3")])
def test_rank_program_beside_the_single_device_graph(step, tmp_path, mesh, strategy):
    from partita.ops.kinds import COLLECTIVE_OPS
    from partita.view.compare import ADDED, REMOVED, RESIZED, compare_json

    prog = partita.parallelize(step, mesh, strategy)
    c = compare_json(prog.graph, prog.local)
    single, local = list(prog.graph.nodes), list(prog.local.nodes)
    # one to one, op for op; every collective of the rank's program was added by the rewrite
    matched = [i for i in c["local_match"] if i >= 0]
    assert len(matched) == len(set(matched))
    assert all(single[i].op == local[j].op for j, i in enumerate(c["local_match"]) if i >= 0)
    assert all(c["local_mark"][j] == ADDED for j, n in enumerate(local) if n.op in COLLECTIVE_OPS)
    shown_in = page_data(prog)["plan"]["local"]["shown_in"]
    assert all(str(j) in shown_in for j, n in enumerate(local) if n.op in COLLECTIVE_OPS and not n.loc)
    assert c["counts"]["added collective"] == sum(n.op in COLLECTIVE_OPS for n in local)
    # the shapes the rank holds are pieces of the global ones; gone nodes have no match
    resized = [j for j, m in enumerate(c["local_mark"]) if m == RESIZED]
    assert resized and all(c["global_mark"][c["local_match"][j]] == RESIZED for j in resized)
    assert all((c["global_match"][i] < 0) == (m == REMOVED) for i, m in enumerate(c["global_mark"]))
    r = page_test(Path(view(prog, tmp_path / "p.html")), "compare")
    assert r["errors"] == []
    assert f"{c['counts']['added collective']} added collective" in r["summary"]
    assert "added by the rewrite (collective)" in r["addedDetail"] and r["addedOp"] in COLLECTIVE_OPS
    # a collective (and the glue around it) is drawn in the layer of the value it moves
    assert r["addedGroup"].startswith("transformer.") and "the module of the value it moves" in r["addedDetail"]
    assert r["noScope"] == 0
    assert r["resizedLeftSel"] and "global shape; this rank" in r["resizedDetail"]
    assert "the rank's piece; global" in r["resizedLeftDetail"] and r["rightSel"]
    assert r["markedLeft"] > 0 and r["markedRight"] > 0


def test_memory_over_the_step_peaks_where_memory_report_does(step, tmp_path, monkeypatch):
    from partita.cluster.memory_report import memory_report
    from partita.view import memory
    from partita.view.memory import memory_curve, program_memory

    prog = partita.parallelize(step, "pp=2,dp=2", "pp+dp", microbatches=4)
    graphs = prog.rank_graphs()
    m = program_memory(prog)
    assert sorted((r["rank"], r["count"]) for r in m["ranks"]) == [(0, 2), (2, 2)]   # alike ranks once
    for r in m["ranks"]:
        rep = memory_report(graphs[r["rank"]])
        assert r["peak"] == rep.peak
        assert r["base"] == {"params": rep.params, "optimizer state": rep.optimizer, "batch": rep.batch}
        # the curve's columns stack to at most the peak, and reach it
        tot = [sum(r["base"].values()) + sum(col[k] for col in r["cols"].values()) for k in range(len(r["x"]))]
        assert max(tot) == rep.peak
    monkeypatch.setattr(memory, "MAX_POINTS", 50)
    thin = memory_curve(step)
    assert len(thin["x"]) == 50 < thin["n"] and thin["peak"] == memory_report(step).peak   # thinned, the peak kept
    monkeypatch.undo()
    out = Path(view(prog, tmp_path / "pp.html"))
    r = page_test(out, "memory")
    assert r["errors"] == [] and r["peakLines"] == 2 and r["areas"] >= 2 * 5
    assert sorted(r["peaks"]) == sorted(memory_report(graphs[x["rank"]]).peak for x in m["ranks"])
    z = partita.parallelize(step, "dp=4", "zero3")
    r = page_test(Path(view(z, tmp_path / "z.html")), "memory")
    assert r["errors"] == [] and r["ranks"] == [[0, 4]] and r["peaks"] == [memory_report(z.local).peak]


def test_the_measured_bubble_beside_the_predicted_one(step, tmp_path):
    import numpy as np

    from partita.runtime.parallel_run import launch

    prog = partita.parallelize(step, "pp=2,dp=2", "pp+dp", microbatches=4)
    rng = np.random.default_rng(0)
    weights = {v.name: (rng.standard_normal(v.type.shape) * 0.02).astype(np.float32)
               for v in step.inputs if v.role == "param"}
    data = [{"ids": rng.integers(0, 128, (8, 16)).astype(np.int64),
             "target": rng.integers(0, 128, (8, 16)).astype(np.int64)} for _ in range(3)]
    res = launch(prog, 4, data, weights, timeout_s=120)
    d = page_data(prog, run=res)["pipeline"]["schedule"]["measured"]
    assert d["bubble"] == pytest.approx(prog.plan.measured_bubble)
    assert [p["ranks"] for p in d["per_rank"]] == [2, 2] and all(p["recv"] < p["step"] for p in d["per_rank"])
    r = page_test(Path(view(prog, tmp_path / "pp.html", run=res)), "gantt")
    assert r["errors"] == [] and r["measured"] == 2 * 2   # per pp rank: busy and waiting
    assert f"measured {d['bubble'] * 100:.1f}%" in r["bubble"] and "predicted bubble 20.0%" in r["bubble"]
    with pytest.raises(ViewError, match="run= takes what partita.launch returns"):
        view(prog, tmp_path / "x.html", run={})


def test_a_pipeline_of_whole_stages_has_a_page(step, tmp_path):
    """A pure "pp" strategy's stages are whole on their rank (no parallel plan inside): the
    page draws the schedule without a stage program."""
    prog = partita.parallelize(step, "pp=2", "pp", microbatches=2)
    d = blob(Path(view(prog, tmp_path / "pp.html")))
    assert d["kind"] == "pipeline" and "stage0" not in d["pipeline"]
    r = page_test(tmp_path / "pp.html", "gantt")
    assert r["errors"] == []
