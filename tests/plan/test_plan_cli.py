"""``partita plan``: a .pir model planned on one node, the plan written as JSON; bad input is one message."""

from __future__ import annotations

import partita
from partita.cli import main


def test_plan_command_writes_the_plan(tmp_path, capsys):
    g = partita.models.gpt(layers=2, hidden=64, heads=4, seq=16, vocab=128, batch=8, dtype="bf16")
    model = tmp_path / "gpt.pir"
    partita.save(g, model)
    out = tmp_path / "plan.json"
    assert main(["plan", str(model), "--nodes", "1", "--devices", "4", "--price", "2", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "chosen: " in text and "wrote" in text
    p = partita.Plan.from_json(out.read_text())
    assert p.devices == 4 and p.step_time > 0


def test_plan_command_says_what_would_fit(tmp_path, capsys):
    g = partita.models.gpt(layers=2, hidden=64, heads=4, seq=16, vocab=128, batch=8, dtype="bf16")
    model = tmp_path / "gpt.pir"
    partita.save(g, model)
    assert main(["plan", str(model), "--nodes", "1", "--devices", "1", "--memory", "1MiB"]) == 1
    err = capsys.readouterr().err
    assert "no plan of @gpt fits" in err and "Traceback" not in err
    assert main(["plan"]) == 1
    assert "give one model" in capsys.readouterr().err
