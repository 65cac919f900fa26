"""A small DevTools-protocol client for the view's browser tests, standard library only.

Headless Chromium is started with ``--remote-debugging-pipe``: it reads commands on its fd 3
and writes replies and events on its fd 4, each message one JSON object ended by a NUL byte.
The tests act from outside as a user does: they click an element's centre with
``Input.dispatchMouseEvent``, type with ``Input.insertText``, read the DOM with
``Runtime.evaluate`` and save ``Page.captureScreenshot``. Every console error
(``Runtime.consoleAPICalled`` of type error), uncaught exception (``Runtime.exceptionThrown``)
and browser log error (``Log.entryAdded``: a refused request, a CSP violation) is collected.
Every wait has a timeout (a hung browser fails the test in seconds) and the browser's process
group is always killed on close."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .browser import need_browser

STEP_S = 20.0   # the longest any single command or wait may take


class CDPError(AssertionError):
    """The browser refused a command, died, or did not answer in time."""


class Browser:
    """Headless Chromium driven through the DevTools protocol over a pipe."""

    def __init__(self, width: int = 1300, height: int = 850, start_s: float = 30.0) -> None:
        exe = need_browser()
        self.profile = tempfile.TemporaryDirectory(prefix="partita-cdp-")
        self.stderr = tempfile.TemporaryFile()
        cmd_r, cmd_w = os.pipe()   # we write commands, chromium reads them on its fd 3
        rep_r, rep_w = os.pipe()   # chromium writes replies on its fd 4, we read them
        # the child's ends at fds >= 10 so that moving them onto 3 and 4 clobbers nothing
        child_r, child_w = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(rep_w, fcntl.F_DUPFD, 10)
        for fd in (cmd_r, rep_w):
            os.close(fd)

        def onto_3_and_4() -> None:
            os.dup2(child_r, 3)
            os.dup2(child_w, 4)

        args = [exe, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                "--hide-scrollbars", "--mute-audio", f"--user-data-dir={self.profile.name}",
                f"--window-size={width},{height}", "about:blank"]
        try:
            # close_fds=False: only fds 3 and 4 (inheritable after dup2) and stdio reach chromium;
            # the pipes' other ends are not inheritable. A new session: close kills the whole group.
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=self.stderr, close_fds=False, preexec_fn=onto_3_and_4,
                                         start_new_session=True)
        finally:
            os.close(child_r)
            os.close(child_w)
        self.out, self.inp = cmd_w, rep_r
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []
        self.replies: dict[int, dict] = {}
        self.width, self.height = width, height
        try:
            self.call("Browser.getVersion", timeout=start_s)
        except BaseException:
            self.close()
            raise

    # ---- the wire ----
    def stderr_tail(self) -> str:
        """The end of chromium's stderr, for error messages."""
        self.stderr.seek(0)
        return self.stderr.read()[-1500:].decode(errors="replace")

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        """Send one command; its id."""
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        try:
            os.write(self.out, json.dumps(msg).encode() + b"\0")
        except OSError as e:
            raise CDPError(f"chromium is gone ({e}) when sending {method}: {self.stderr_tail()}") from e
        return self.next_id

    def pump(self, deadline: float, what: str) -> None:
        """Read what chromium wrote (waiting at most until ``deadline``) into replies and events."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise CDPError(f"no answer from chromium in time while waiting for {what} (a hung page or browser)")
        ready, _, _ = select.select([self.inp], [], [], left)
        if not ready:
            raise CDPError(f"no answer from chromium in time while waiting for {what} (a hung page or browser)")
        chunk = os.read(self.inp, 1 << 20)
        if not chunk:
            raise CDPError(f"chromium closed its pipe (exit {self.proc.poll()}) while waiting for {what}: "
                           f"{self.stderr_tail()}")
        self.buf += chunk
        *msgs, self.buf = self.buf.split(b"\0")
        for m in msgs:
            d = json.loads(m)
            if "id" in d:
                self.replies[d["id"]] = d
            else:
                self.events.append(d)

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = STEP_S) -> dict:
        """Send a command and wait for its result."""
        i = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while i not in self.replies:
            self.pump(deadline, method)
        d = self.replies.pop(i)
        if "error" in d:
            raise CDPError(f"{method} failed: {d['error'].get('message')} ({d['error'].get('data', '')})")
        return d.get("result", {})

    def wait_event(self, match: Callable[[dict], bool], what: str, timeout: float = STEP_S) -> dict:
        """The first event (already received or coming) that ``match`` accepts; taken off the list."""
        deadline = time.monotonic() + timeout
        while True:
            for k, e in enumerate(self.events):
                if match(e):
                    return self.events.pop(k)
            self.pump(deadline, what)

    def new_page(self) -> "Page":
        """A new tab, attached with a flat session."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        return Page(self, target, sid)

    def close(self) -> None:
        """Kill chromium's process group and free the pipes and the profile."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self.out, self.inp):
            try:
                os.close(fd)
            except OSError:
                pass
        self.stderr.close()
        self.profile.cleanup()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page:
    """One tab: load a page, act on it as a user does, read it back; its console errors."""

    def __init__(self, browser: Browser, target: str, session: str) -> None:
        self.b, self.target, self.sid = browser, target, session
        for domain in ("Page", "Runtime", "Log"):
            self.call(domain + ".enable")
        self.call("Emulation.setDeviceMetricsOverride", {"width": browser.width, "height": browser.height,
                                                           "deviceScaleFactor": 1, "mobile": False})

    def call(self, method: str, params: dict | None = None, timeout: float = STEP_S) -> dict:
        """A command to this tab."""
        return self.b.call(method, params, self.sid, timeout)

    def errors(self) -> list[str]:
        """Every console error, uncaught exception and browser log error of this tab so far."""
        self.b.call("Runtime.evaluate", {"expression": "0"}, self.sid)   # let pending events arrive
        out = []
        for e in self.b.events:
            if e.get("sessionId") != self.sid:
                continue
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
            elif m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append("exception: " + d.get("exception", {}).get("description", d.get("text", "")))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(f"log ({p['entry'].get('source')}): {p['entry'].get('text')}")
        return out

    def goto(self, url: str, timeout: float = 60.0) -> None:
        """Navigate and wait for the load event and the page's script to have drawn (``window.PARTITA``)."""
        r = self.call("Page.navigate", {"url": url}, timeout)
        if r.get("errorText"):
            raise CDPError(f"cannot load {url}: {r['errorText']}")
        self.b.wait_event(lambda e: e.get("method") == "Page.loadEventFired" and e.get("sessionId") == self.sid,
                          f"the load event of {url}", timeout)
        self.wait_for("!!window.PARTITA || document.getElementById('errors').textContent !== ''",
                      "the page's script to start", timeout)

    def open(self, page: Path, timeout: float = 60.0) -> None:
        """Load a local HTML file."""
        self.goto(page.resolve().as_uri(), timeout)

    def evaluate(self, js: str, timeout: float = STEP_S) -> Any:
        """The value of a JavaScript expression in the page (promises awaited, returned by value)."""
        r = self.call("Runtime.evaluate", {"expression": js, "returnByValue": True, "awaitPromise": True,
                                           "timeout": int(timeout * 1000)}, timeout + 2)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise CDPError(f"{js[:200]!r} threw: {d.get('exception', {}).get('description', d.get('text'))}")
        return r["result"].get("value")

    def wait_for(self, js: str, what: str, timeout: float = STEP_S) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.evaluate(js, max(1.0, deadline - time.monotonic()))
            if v:
                return v
            if time.monotonic() > deadline:
                raise CDPError(f"waited {timeout:.0f} s for {what} ({js[:200]!r} stayed false)")
            time.sleep(0.05)

    def centre(self, selector: str) -> tuple[float, float]:
        """The centre of the element ``selector`` names, scrolled into view; it must be the one a click there hits."""
        js = f"""(() => {{
          const e = document.querySelector({json.dumps(selector)});
          if (!e) return null;
          e.scrollIntoView({{block: "center", inline: "center"}});
          const r = e.getBoundingClientRect(), x = r.left + r.width / 2, y = r.top + r.height / 2;
          const hit = document.elementFromPoint(x, y);
          return [x, y, r.width, r.height, !!hit && (hit === e || e.contains(hit))];
        }})()"""
        v = self.evaluate(js)
        if v is None:
            raise CDPError(f"no element {selector!r} on the page to click")
        x, y, w, h, on_top = v
        if w <= 0 or h <= 0 or not on_top:
            raise CDPError(f"{selector!r} is not visible where a user would click it ({w}x{h} at {x:.0f},{y:.0f}, "
                           f"{'covered' if not on_top else 'empty'})")
        return x, y

    def click(self, selector: str) -> None:
        """Click the element's centre with the mouse, as a user does."""
        self.mouse(*self.centre(selector))

    def click_at(self, selector: str, dx: float, dy: float) -> None:
        """Click at (dx, dy) from the element's top left corner (a point on a canvas)."""
        x, y = self.centre(selector)
        w, h = self.evaluate(f"(r => [r.width, r.height])(document.querySelector({json.dumps(selector)})"
                             ".getBoundingClientRect())")
        if not (0 <= dx <= w and 0 <= dy <= h):
            raise CDPError(f"({dx}, {dy}) is outside {selector!r} ({w}x{h})")
        self.mouse(x - w / 2 + dx, y - h / 2 + dy)

    def mouse(self, x: float, y: float) -> None:
        """Move the mouse to (x, y) in the viewport and click the left button there."""
        self.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        for t in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": t, "x": x, "y": y, "button": "left", "clickCount": 1})

    KEYS = {"ArrowDown": 40, "ArrowUp": 38, "Enter": 13, "Escape": 27, "Tab": 9}

    def press(self, key: str) -> None:
        """Press and release a named key (``ArrowDown``, ``Enter``, ...) where the focus is."""
        code = self.KEYS[key]
        down = {"type": "rawKeyDown", "key": key, "code": key, "windowsVirtualKeyCode": code,
                "nativeVirtualKeyCode": code}
        if key == "Enter":
            down.update(type="keyDown", text="\r")
        self.call("Input.dispatchKeyEvent", down)
        self.call("Input.dispatchKeyEvent", {"type": "keyUp", "key": key, "code": key, "windowsVirtualKeyCode": code,
                                             "nativeVirtualKeyCode": code})

    def type(self, selector: str, text: str, replace: bool = True) -> None:
        """Click into a text field and type ``text`` (an ``input`` event as a keyboard would give);
        ``replace``: over what the field held (selected first, as a triple click would)."""
        self.click(selector)
        q = f"document.querySelector({json.dumps(selector)})"
        if not self.evaluate(f"document.activeElement === {q}"):
            raise CDPError(f"clicking {selector!r} did not focus it, so typing would go elsewhere")
        if replace:
            self.evaluate(f"{q}.select()")
        self.call("Input.insertText", {"text": text})

    def text(self, selector: str) -> str:
        """The text of the element ``selector`` names ("" when there is none)."""
        return self.evaluate(f"(document.querySelector({json.dumps(selector)}) || {{}}).textContent || ''")

    def screenshot(self, png: Path) -> Path:
        """Save what the tab shows as a PNG."""
        data = self.call("Page.captureScreenshot", {"format": "png"}, 60)["data"]
        png.write_bytes(base64.b64decode(data))
        return png

    def close(self) -> None:
        """Close the tab."""
        self.b.call("Target.closeTarget", {"targetId": self.target})
