"""Headless Chromium driven over the DevTools protocol, and a WSGI app served on a real port, for tests
that need what a page does in a browser: its scripts run, the keyboard, the layout at a phone's width,
the Content-Security-Policy enforced, axe-core's accessibility rules.

The protocol travels over a pipe (`--remote-debugging-pipe`: Chromium reads commands on its fd 3 and
writes answers and events on its fd 4, each one JSON message ended by a NUL), so no websocket client
and no port is needed. One browser serves many pages (tabs); each `Page` is attached with a flat
session and records what a page must not do: console errors, uncaught exceptions, CSP violations (the
`securitypolicyviolation` event, reported through a binding, and Chromium's own console line) and
JavaScript dialogs (accepted at once, so that a page that opens one cannot hang the test).

Chromium comes from Debian (`scripts/test.sh` installs it as root); without it the tests fail and say
why, unless COCAQ_SKIP_SCREENSHOTS=1 asks to skip them (as tests/test_report_screens.py does).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

CHROMIUM = os.environ.get("COCAQ_CHROMIUM", "/usr/bin/chromium")
TIMEOUT = 30.0  # seconds for one protocol command or one page to load


def chromium() -> str:
    """Chromium's path; fails the test (skips it with COCAQ_SKIP_SCREENSHOTS=1) when there is none."""
    import pytest

    if os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    reason = (
        f"Chromium not found ({CHROMIUM}): scripts/test.sh installs Debian's chromium when run as root "
        "(apt-get install chromium); set COCAQ_SKIP_SCREENSHOTS=1 to skip these tests on a machine without it"
    )
    if os.environ.get("COCAQ_SKIP_SCREENSHOTS") == "1":
        pytest.skip(reason)
    pytest.fail(reason)


class ProtocolError(AssertionError):
    """A DevTools command Chromium refused, or one it did not answer in time."""


class Browser:
    """One headless Chromium and its DevTools pipe. `page()` opens a tab."""

    def __init__(self, exe: str | None = None) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="cocaq-chromium-")
        to_child, self._out = os.pipe()  # we write commands, Chromium reads them on its fd 3
        self._in, from_child = os.pipe()  # Chromium writes on its fd 4
        # above any number the redirections below name, so that `3<&R 4>&W` cannot clobber R or W (bash:
        # dash takes no fd over 9)
        r, w = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_child, from_child))
        os.close(to_child)
        os.close(from_child)
        args = [
            exe or chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-dev-shm-usage",
            "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe",
            # only the test's own server answers: nothing a page tried to fetch elsewhere would load
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            f"--user-data-dir={self._profile.name}", "about:blank",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", f'exec "$@" 3<&{r} 4>&{w} {r}<&- {w}>&-', "bash", *args],
            pass_fds=(r, w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        os.close(r)
        os.close(w)
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self._pages: dict[str, Page] = {}
        self._stderr: list[bytes] = []
        self._alive = True
        threading.Thread(target=self._read, name="chromium-devtools", daemon=True).start()
        threading.Thread(target=self._drain, name="chromium-stderr", daemon=True).start()
        self.version = self.send("Browser.getVersion")["product"]

    # --- the pipe ---------------------------------------------------------------------------------------

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._in, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for raw in messages:
                self._dispatch(json.loads(raw))
        self._alive = False
        with self._lock:
            for event, box in self._waiting.values():
                box.append({"error": {"message": "Chromium closed its DevTools pipe"}})
                event.set()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr = [*self._stderr[-40:], line]

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if "id" in msg:
            with self._lock:
                waiting = self._waiting.pop(msg["id"], None)
            if waiting:
                waiting[1].append(msg)
                waiting[0].set()
            return
        page = self._pages.get(msg.get("sessionId", ""))
        if page is not None:
            page._event(msg["method"], msg.get("params", {}))

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
        timeout: float = TIMEOUT,
    ) -> dict[str, Any]:  # fmt: skip
        """One command; its result, or ProtocolError."""
        event = threading.Event()
        box: list[dict[str, Any]] = []  # the answer, put there by the thread that reads the pipe
        with self._lock:
            self._next += 1
            msg_id = self._next
            self._waiting[msg_id] = (event, box)
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        if not self._alive:
            raise ProtocolError(f"{method}: Chromium is gone: {self.stderr()}")
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        if not event.wait(timeout):
            with self._lock:
                self._waiting.pop(msg_id, None)
            raise ProtocolError(f"{method}: no answer in {timeout:.0f} s")
        answer = box[0]
        if "error" in answer:
            raise ProtocolError(
                f"{method}: {answer['error'].get('message')} {answer['error'].get('data', '')}"
            )
        result: dict[str, Any] = answer.get("result", {})
        return result

    def stderr(self) -> str:
        return b"".join(self._stderr).decode("utf-8", "replace")[-3000:]

    # --- tabs -------------------------------------------------------------------------------------------

    def page(self, width: int = 1280, height: int = 900) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, target, session)
        self._pages[session] = page
        page._start(width, height)
        return page

    def close(self) -> None:
        try:
            if self._alive:
                self.send("Browser.close", timeout=10)
        except ProtocolError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for fd in (self._out, self._in):
            with suppress(OSError):
                os.close(fd)
        self._profile.cleanup()


# Run in each document before its own scripts: every CSP violation goes to the test through a binding
# (Runtime.addBinding: a function the protocol gives the page, whose calls come back as events). A page
# could call it too, which would only fail the test.
_WATCH = """
document.addEventListener("securitypolicyviolation", function (e) {
  window.__cocaqReport(JSON.stringify({directive: e.violatedDirective, blocked: e.blockedURI,
    source: e.sourceFile, line: e.lineNumber, sample: e.sample}));
});
"""


@dataclass
class Problems:
    """What a page did that it must not: console errors, exceptions, CSP violations, dialogs."""

    console: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    csp: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def any(self) -> bool:
        return bool(self.console or self.exceptions or self.csp or self.dialogs)

    def __str__(self) -> str:
        parts = [f"{k}: {v}" for k, v in vars(self).items() if v]
        return "; ".join(parts) or "none"


class Page:
    """One tab, attached by its own session."""

    def __init__(self, browser: Browser, target: str, session: str) -> None:
        self.browser, self.target, self.session = browser, target, session
        self.problems = Problems()
        self._cond = threading.Condition()
        self._loads = 0
        self.width = 0

    def send(
        self, method: str, params: dict[str, Any] | None = None, timeout: float = TIMEOUT
    ) -> dict[str, Any]:
        return self.browser.send(method, params, self.session, timeout)

    def _start(self, width: int, height: int) -> None:
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send("Runtime.addBinding", {"name": "__cocaqReport"})
        self.send("Page.addScriptToEvaluateOnNewDocument", {"source": _WATCH})
        self.send("Emulation.setFocusEmulationEnabled", {"enabled": True})
        self.resize(width, height)

    def _event(self, method: str, p: dict[str, Any]) -> None:
        if method == "Page.loadEventFired":
            with self._cond:
                self._loads += 1
                self._cond.notify_all()
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.problems.console.append(" ".join(_remote_text(a) for a in p.get("args", [])))
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            e = p["entry"]
            where = f" ({e.get('url')})" if e.get("url") else ""
            self.problems.console.append(f"[{e.get('source')}] {e.get('text')}{where}")
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            self.problems.exceptions.append(str(d.get("exception", {}).get("description") or d.get("text")))
        elif method == "Runtime.bindingCalled" and p.get("name") == "__cocaqReport":
            self.problems.csp.append(p.get("payload", ""))
        elif method == "Page.javascriptDialogOpening":
            self.problems.dialogs.append(f"{p.get('type')}: {p.get('message')}")
            # answered from another thread: this one reads the pipe, which the answer needs
            threading.Thread(
                target=self.send, args=("Page.handleJavaScriptDialog", {"accept": True}), daemon=True
            ).start()

    def resize(self, width: int, height: int = 900) -> None:
        """The layout viewport `width` CSS px wide, as a phone (375) or a desktop (1280) lays the page out:
        headless Chromium's window is wider than a phone's, the emulated screen is not."""
        self.width = width
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
        )

    def goto(self, url: str, *, charts: bool = True, timeout: float = TIMEOUT) -> None:
        """Open `url` and wait for its load event and, with `charts`, for Plotly to have drawn every
        `[data-figure]` of it (an SVG `.main-svg` inside each)."""
        with self._cond:
            loads = self._loads
        got = self.send("Page.navigate", {"url": url})
        if got.get("errorText"):
            raise ProtocolError(f"{url}: {got['errorText']}")
        self._wait_load(loads, url, timeout)
        if charts:
            self.wait_for(
                "Array.from(document.querySelectorAll('[data-figure]'))"
                ".every(el => el.querySelector('.main-svg'))",
                f"Plotly's charts on {url}",
                timeout,
            )

    def _wait_load(self, before: int, what: str, timeout: float) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._loads > before, timeout):
                raise ProtocolError(f"{what}: no load event in {timeout:.0f} s")

    @contextmanager
    def navigation(self, timeout: float = TIMEOUT) -> Iterator[None]:
        """Wait, after the block, for the page load it caused (a click, a key on a link)."""
        with self._cond:
            loads = self._loads
        yield
        self._wait_load(loads, "the navigation", timeout)

    def eval(self, expression: str, *, await_promise: bool = False, timeout: float = TIMEOUT) -> Any:
        """`expression`'s value in the page (as JSON). DevTools' own evaluation: the page's CSP does not
        apply to it, only to what it makes the page do."""
        got = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": await_promise},
            timeout,
        )
        if "exceptionDetails" in got:
            d = got["exceptionDetails"]
            raise ProtocolError(f"{expression[:80]!r}: {d.get('exception', {}).get('description') or d}")
        return got["result"].get("value")

    def wait_for(self, expression: str, what: str, timeout: float = TIMEOUT) -> Any:
        end = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > end:
                raise ProtocolError(f"{what}: not there after {timeout:.0f} s")
            time.sleep(0.05)

    def until(self, done: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
        """Wait for something the page reports by an event (a violation, a dialog)."""
        end = time.monotonic() + timeout
        while not done():
            if time.monotonic() > end:
                raise ProtocolError(f"{what}: not seen in {timeout:.0f} s")
            time.sleep(0.05)

    def press(self, key: str) -> None:
        """A key as the keyboard sends it: Tab, Enter (its text, which activates a link), Shift+Tab."""
        codes = {"Tab": 9, "Enter": 13}
        shift = key.startswith("Shift+")
        name = key.removeprefix("Shift+")
        down: dict[str, Any] = {"type": "keyDown", "key": name, "code": name,
                                "windowsVirtualKeyCode": codes[name], "modifiers": 8 if shift else 0}  # fmt: skip
        if name == "Enter":
            down["text"] = "\r"
        self.send("Input.dispatchKeyEvent", down)
        self.send("Input.dispatchKeyEvent", {**down, "type": "keyUp", "text": ""})

    def screenshot(self, png: Path, max_height: int = 12_000) -> Path:
        """The whole page (up to `max_height` px) as it lays out now."""
        size = self.send("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": self.width, "height": min(size["height"], max_height), "scale": 1}
        got = self.send(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True, "clip": clip},
            timeout=60,
        )
        png.write_bytes(base64.b64decode(got["data"]))
        return png

    def close(self) -> None:
        self.browser._pages.pop(self.session, None)
        self.browser.send("Target.closeTarget", {"targetId": self.target})


def not_blank(png: Path) -> float:
    """The share of the most common colour; fails when the screenshot is (nearly) one colour."""
    from PIL import Image

    with Image.open(png) as img:
        small = img.convert("RGB").resize((max(1, img.width // 4), max(1, img.height // 4)))
    colours = small.getcolors(1 << 24) or []
    top = max(n for n, _ in colours) / (small.width * small.height)
    assert top < 0.97 and len(colours) > 50, (
        f"{png.name}: blank ({top:.1%} one colour, {len(colours)} colours)"
    )
    return top


def _remote_text(obj: dict[str, Any]) -> str:
    if "value" in obj:
        return str(obj["value"])
    return str(obj.get("description") or obj.get("type"))


# --- the app on a port ---------------------------------------------------------------------------------


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Served:
    """A WSGI app on 127.0.0.1; `user` is who the proxy in front of it says each request comes from."""

    base: str
    user: str | None

    def url(self, path: str) -> str:
        return self.base + path


@contextmanager
def serve(app: Callable[..., Iterable[bytes]], user: str | None = None) -> Iterator[Served]:
    """`app` behind a stand-in for the authenticating reverse proxy (it sets REMOTE_USER to
    `served.user`, as `cocaq web --trust-proxy-user` expects), on a free port, in a thread."""
    served = Served("", user)

    def proxy(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        environ.pop("REMOTE_USER", None)
        if served.user:
            environ["REMOTE_USER"] = served.user
        return app(environ, start_response)

    server = make_server("127.0.0.1", 0, proxy, server_class=_Server, handler_class=_Quiet)
    served.base = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, name="wsgi", daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
