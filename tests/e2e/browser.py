"""A real headless browser for the e2e tier: Chromium driven over the DevTools protocol.

`--dump-dom` and `--screenshot` take the page at an instant chosen by Chromium (after its
virtual time budget); a JavaScript application such as TensorBoard fetches its data after the
page has loaded, so that instant often comes before the charts exist (measured here: about
half the time). Driving the browser instead, a test polls the live page for what it expects,
with a deadline in real time, and takes the screenshot of the page it checked."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import websocket  # websocket-client: a dependency of the kubernetes package

BROWSERS: Final = ("chromium", "chromium-browser", "google-chrome")
START_SECONDS: Final = 60.0


def find_browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    raise AssertionError(
        f"no headless browser ({', '.join(BROWSERS)}) on PATH: bash tests/controlplane/"
        "install.sh --node-packages installs Debian's chromium"
    )


class Page:
    """One browser tab, over its DevTools WebSocket."""

    def __init__(self, socket: Any) -> None:
        self._socket = socket
        self._next = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        self._socket.send(json.dumps({"id": self._next, "method": method, "params": params}))
        while True:  # events (no id) may come first
            message = json.loads(self._socket.recv())
            if message.get("id") == self._next:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result") or {}
                return result

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return (result.get("result") or {}).get("value")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))


@contextlib.contextmanager
def headless(profile: Path, width: int = 1400, height: int = 1000) -> Iterator[Page]:
    """Chromium without a display. WebGL is off (`--disable-3d-apis`): pages that draw with it
    (TensorBoard's charts) fall back to SVG, which the DOM shows and a test can read."""
    profile.mkdir(parents=True, exist_ok=True)
    port_file = profile / "DevToolsActivePort"
    port_file.unlink(missing_ok=True)
    process = subprocess.Popen(
        [
            find_browser(),
            "--headless",
            "--no-sandbox",  # root in CI; the page is our own TensorBoard
            "--disable-gpu",
            "--disable-3d-apis",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + START_SECONDS
        while not port_file.exists() or not port_file.read_text().strip():
            if process.poll() is not None:
                raise AssertionError(f"chromium exited with code {process.returncode}")
            if time.monotonic() > deadline:
                raise AssertionError(f"chromium did not open DevTools in {START_SECONDS:.0f}s")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as answer:
            targets = json.load(answer)
        target = next(t for t in targets if t.get("type") == "page")
        socket = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=60)
        try:
            yield Page(socket)
        finally:
            socket.close()
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
