"""``partita cluster`` and ``partita calibrate`` from the command line (in-process through
``partita.cli.main``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from partita.cli import main
from partita.cluster import list_clusters, load_cluster


def test_cluster_lists_the_shipped_ones(capsys):
    assert main(["cluster"]) == 0
    out = capsys.readouterr().out
    for name in list_clusters():
        assert any(line.startswith(name + " ") for line in out.splitlines()), out
    assert "312 TFLOP/s bf16" in out


def test_cluster_shows_a_name_or_a_file(tmp_path: Path, capsys):
    assert main(["cluster", "selene"]) == 0
    assert capsys.readouterr().out.strip() == load_cluster("selene").summary()
    f = tmp_path / "mine.toml"
    f.write_text((Path(load_cluster("dgx-h100").source)).read_text().replace('name = "dgx-h100"', 'name = "mine"'))
    assert main(["cluster", str(f)]) == 0
    assert "cluster mine:" in capsys.readouterr().out


def test_cluster_errors_are_one_message(tmp_path: Path, capsys):
    assert main(["cluster", "selen"]) == 1
    err = capsys.readouterr().err
    assert "no cluster named 'selen'" in err and "did you mean 'selene'" in err and "Traceback" not in err
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 3\n")
    assert main(["cluster", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:1: name must be a non-empty string" in err and "Traceback" not in err


def test_calibrate_refuses_one_rank(capsys):
    assert main(["calibrate", "--nproc", "1"]) == 2
    assert "must be at least 2" in capsys.readouterr().err


# Multi-process: 2 gloo ranks on loopback, bounded in time; no timed assertions.
@pytest.mark.timeout(240)
def test_calibrate_quick_writes_a_cluster_file(tmp_path: Path, capsys):
    out_file = tmp_path / "here.toml"
    assert main(["calibrate", "--quick", "--nproc", "2", "-o", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert "peak f32" in out and "gloo collectives" in out
    assert "figure" in out and "intra_node.latency" in out and "gloo send_recv beta" in out
    assert "wrote" in out
    c = load_cluster(out_file)
    assert c.gpus_per_node == 2 and c.device.flops("f32") > 0 and c.intra_node.bandwidth > 0
    assert main(["cluster", str(out_file)]) == 0
    assert "cluster this-machine" in capsys.readouterr().out


def test_calibrate_checks_its_numbers_and_output_before_measuring(tmp_path: Path, capsys):
    import time

    t0 = time.perf_counter()
    assert main(["calibrate", "--nproc", "100000"]) == 2
    assert "must be at most 256" in capsys.readouterr().err
    assert main(["calibrate", "--threads", "100000"]) == 2
    assert "must be at most 1024" in capsys.readouterr().err
    assert main(["calibrate", "--quick", "-o", str(tmp_path / "no" / "such" / "x.toml")]) == 1
    cap = capsys.readouterr()
    assert "the folder" in cap.err and "does not exist" in cap.err and "peak" not in cap.out
    assert time.perf_counter() - t0 < 30      # nothing measured: a bound against starting work, not a timing
    from partita.cluster.calibrate import CalibrationError, measure

    for kw in ({"nproc": 10 ** 5}, {"threads": 0}, {"nproc": "4"}, {"quick": "yes"}):
        with pytest.raises(CalibrationError, match="calibrate: "):
            measure(**kw)
