"""The sizes and load times of ``partita view`` pages that issue 40 names: a GPT-2 (124M)
training step's graph page (target under 2 MB) and the 1T GPT (megatron-1008b) on 3,072 GPUs
(``pp=64,dp=6,tp=8``, 512 microbatches) simulated section by section with its page (target
under 20 MB, interactive in under 3 s in headless Chromium). "ready" is the page's
``performance.now()`` when its self-test starts (navigation to the first view drawn).

``--big``: also a GPT of 1,100 layers (hidden 64): a training step of about 10^5 nodes, its
page loaded and every group expanded (``#test=expand``: ``ms`` the self-test's time).

    .venv/bin/python bench/bench_view.py [--skip-1t] [--big] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import partita  # noqa: E402
from partita.cli import main as cli  # noqa: E402
from tests.view.browser import page_test  # noqa: E402


def ready(page: Path, rounds: int, test: str = "load") -> list[float]:
    """The page's ready time (ms) in headless Chromium, ``rounds`` loads."""
    out = []
    for _ in range(rounds):
        r = page_test(page, test, timeout=300)
        assert r["errors"] == [], r["errors"]
        out.append(float(r["readyMs"]))
    return out


def big_graph(tmp: Path, rounds: int) -> None:
    """The 10^5-node training step's page: size, write time, ready and expand-all times."""
    fwd = partita.models.gpt(1100, 64, 4, 16, 128, batch=8, dtype="f32")
    step = partita.training_step(fwd, loss="cross_entropy")
    t = time.perf_counter()
    p = Path(partita.view(step, tmp / "big.html"))
    written = time.perf_counter() - t
    expand = [page_test(p, "expand", timeout=300) for _ in range(rounds)]
    print(f"GPT of 1,100 layers ({len(step)} nodes): {p.stat().st_size / 1e6:.1f} MB, written in "
          f"{written:.0f} s, ready {ready(p, rounds)} ms, expanding every group "
          f"{[round(r['ms']) for r in expand]} ms ({expand[0]['after']} boxes)", flush=True)


def main() -> None:
    """Write each page, print its size, the time to write it and its ready times."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-1t", action="store_true")
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    step = partita.training_step(partita.models.gpt(12, 768, 12, 1024, 50257, batch=8), loss="cross_entropy")
    t = time.perf_counter()
    p = Path(partita.view(step, tmp / "gpt2.html"))
    print(f"GPT-2 step ({len(step)} nodes): {p.stat().st_size / 1e6:.2f} MB, written in "
          f"{time.perf_counter() - t:.1f} s, ready {ready(p, a.rounds)} ms", flush=True)
    if a.big:
        big_graph(tmp, a.rounds)
    if a.skip_1t:
        return
    p = tmp / "1t.html"
    t = time.perf_counter()
    with open(os.devnull, "w") as null:
        stdout, sys.stdout = sys.stdout, null
        try:
            cli(["simulate", "--model", "megatron-1008b", "--mesh", "pp=64,dp=6,tp=8", "--microbatches", "512",
                 "--html", str(p)])
        finally:
            sys.stdout = stdout
    print(f"1T on 3,072 GPUs: {p.stat().st_size / 1e6:.2f} MB, simulate and page {time.perf_counter() - t:.0f} s, "
          f"ready {ready(p, a.rounds)} ms, memory tab {ready(p, 1, 'memory')} ms", flush=True)


if __name__ == "__main__":
    main()
