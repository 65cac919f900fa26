"""Headless Chromium for the view tests: load a page with an in-page self-test selected by
the URL fragment (``#test=search:attn``) and read its result back from the DOM
(``--dump-dom``); screenshots with ``--screenshot``. No Python package beyond the standard
library. ``tests/view/cdp.py`` drives the same browser from outside through the DevTools
protocol (clicks, typing, screenshots between them) and uses ``need_browser`` from here."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_browser() -> str | None:
    """The path of a Chromium on this machine, or None."""
    for b in BROWSERS:
        p = shutil.which(b)
        if p:
            return p
    return None


def need_browser() -> str:
    """The browser, or skip the test saying how to get one."""
    b = find_browser()
    if b is None:
        pytest.skip("no chromium found: install Debian's chromium (apt-get install -y chromium) to run the "
                    "browser tests (.ci/run installs it)")
    return b


def _flags(profile: str) -> list[str]:
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--hide-scrollbars", f"--user-data-dir={profile}", "--window-size=1300,850"]


def page_test(page: Path, test: str, timeout: float = 120) -> dict:
    """Load ``page#test=...`` in headless Chromium; the self-test's result (a dict with
    ``errors``: every console error and uncaught exception of the page)."""
    b = need_browser()
    with tempfile.TemporaryDirectory() as prof:
        url = page.resolve().as_uri() + "#test=" + test
        out = subprocess.run([b, *_flags(prof), "--dump-dom", url], capture_output=True, text=True,
                             timeout=timeout)
    m = re.search(r'<pre id="test-result">(.*?)</pre>', out.stdout, re.S)
    assert m, f"no self-test result in the page's DOM (chromium exit {out.returncode}): {out.stderr[-2000:]}"
    text = html.unescape(m.group(1))
    assert text, f"the page's self-test wrote nothing: {out.stderr[-2000:]}"
    return json.loads(text)


def screenshot(page: Path, test: str, png: Path, size: str = "1300,850", timeout: float = 120) -> Path:
    """A PNG of ``page#test=...`` after its self-test ran."""
    b = need_browser()
    with tempfile.TemporaryDirectory() as prof:
        flags = [f for f in _flags(prof) if not f.startswith("--window-size")] + [f"--window-size={size}"]
        subprocess.run([b, *flags, f"--screenshot={png}", page.resolve().as_uri() + "#test=" + test],
                       capture_output=True, timeout=timeout, cwd=png.parent)
    assert png.exists() and png.stat().st_size > 1000, "no screenshot written"
    return png
