"""The bounded, seeded fuzzing campaign (tests/fuzz/campaign.py): every target a fixed
number of cases, the same cases on every run, under about two minutes in all.

Each test fails listing every violation with its reproducer. ``KNOWN_OPEN`` names defects
the campaign finds that belong to code being reworked elsewhere; they are printed, not
failed on, and matched narrowly (kind, and a pattern of the exception and function, or of
the command and its message), so a new defect of the same area still fails. The long campaign is ``make fuzz`` (tools/fuzz.py); docs/reliability.md
has what each target generates and the counts of the last long run.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import campaign  # noqa: E402

SEED = 0
CASES = {"pir": 400, "onnx": 300, "api": 250, "graphs": 60, "cli": 24,
         "cluster": 400, "simulate": 150, "compile": 50, "pipeline": 150}

# (kind, a regular expression searched in the signature) -> the defect and where it lives.
# Signatures read "kind|Exception@partita/file.py:function" (crashes, unplaced messages),
# "kind|command|exit|first line" (command lines), "kind|what" (the other checks). Issue 35's
# defects in code being reworked elsewhere; remove each entry once its fix lands.
KNOWN_OPEN: dict[tuple[str, str], str] = {
}


def _known(sig: str) -> str | None:
    for (kind, pattern), why in KNOWN_OPEN.items():
        if sig.startswith(kind + "|") and re.search(pattern, sig):
            return why
    return None


def _check(counts: campaign.Counts) -> None:
    new, known = [], []
    for sig, v in counts.violations.items():
        why = _known(sig)
        (known if why else new).append((v, why))
    for v, why in known:
        print(f"known open ({why}):\n{v.render()}\n", file=sys.stderr)
    assert counts.cases > 0
    assert not new, (f"{len(new)} distinct violation(s) in {counts.cases} {counts.target} cases:\n\n"
                     + "\n\n".join(v.render() for v, _ in new))


@pytest.mark.parametrize("target", campaign.TARGETS)
def test_bounded_campaign(target):
    counts = campaign.TARGET_FUNCS[target](seed=SEED, cases=CASES[target])
    assert counts.cases >= CASES[target]
    _check(counts)


def test_campaign_is_deterministic():
    a = campaign.target_pir(seed=3, cases=40)
    b = campaign.target_pir(seed=3, cases=40)
    assert (a.cases, a.accepted, a.clean, sorted(a.violations)) == (b.cases, b.accepted, b.clean, sorted(b.violations))


def test_the_engine_reports_a_planted_crash():
    # The classification itself: a non-PartitaError, a hang and an unplaced message are
    # violations; a placed PartitaError is a clean error.
    c = campaign.Counts("self")

    def boom():
        raise KeyError("k")

    def spin():
        while True:
            pass

    campaign.attempt(c, boom, {"case": "boom"})
    campaign.attempt(c, spin, {"case": "spin"}, timeout=0.2)
    campaign.attempt(c, lambda: (_ for _ in ()).throw(campaign.PartitaError("something is wrong")), {"case": "x"})
    campaign.attempt(c, lambda: (_ for _ in ()).throw(campaign.PartitaError("f.pir:1:2: error: bad")), {"case": "y"})
    kinds = sorted(v.kind for v in c.violations.values())
    assert kinds == ["crash", "hang", "unplaced-message"]
    assert c.clean == 1


def test_a_reproducer_replays():
    # A pir reproducer is the text itself: replaying it gives the same outcome.
    c = campaign.Counts("pir")
    with campaign.ir_test_ops_registered():
        campaign.check_pir_text(c, "graph @g(%x: f32[2]) -> (f32[2]) {\n  %0 = neg(%x) : f32[2]\n  return %0\n}\n")
        campaign.check_pir_text(c, "graph @g(%x: f32[2]) -> (f32[2]) {\n  %0 = neg(%q) : f32[2]\n  return %0\n}\n")
    assert (c.cases, c.accepted, c.clean, c.n_violations) == (2, 1, 1, 0)


def test_cluster_seeds_serialize_and_load():
    # The cluster target writes its mutated data with its own TOML writer: unmutated, every
    # seed must read back as the same data and load as a cluster.
    import tomllib

    from partita.cluster import parse_cluster

    for data in campaign.cluster_seeds():
        text = campaign.to_toml(data)
        assert tomllib.loads(text) == data
        parse_cluster(text, "seed.toml")


def test_calibrate_never_measures_in_the_campaign():
    # The simulate target stops calibrate where it would start measuring, and counts a bad
    # flag that got that far as a violation.
    import partita.cluster.calibrate as cal

    before = cal.measure
    c = campaign.Counts("simulate")
    with campaign._no_measuring(), __import__("tempfile").TemporaryDirectory() as d:
        campaign.check_cli_surface(c, ["calibrate", "--nproc", "2", "-o", "ok.toml"], {}, Path(d), [], 10.0)
        campaign.check_cli_surface(c, ["calibrate", "--nproc", "2", "-o", "x.toml"], {}, Path(d), ["-o"], 10.0)
    assert cal.measure is before
    assert c.notes.get("calibrate reached measure") == 1
    assert [v.kind for v in c.violations.values()] == ["late-rejection"]
