"""The ``chromium`` (session) fixture: Debian's headless Chromium, driven over the DevTools protocol.

Started once per session by pid with a fresh profile and no network features (no QUIC, no
background networking, no component updates, no sync), stopped by pid at the end; SKIPPED with the
reason when the `chromium` executable is missing or does not start (scripts/setup.sh installs it
where it runs as root). `chromium.open(path)` loads a local file in a new tab and returns what the
page did: console messages and exceptions, text, values of elements, element boxes and a screenshot.
The DevTools websocket is spoken with aiohttp (already installed for s3fs).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio", "--remote-debugging-port=0",
         "--remote-allow-origins=*"]


@dataclass
class PageResult:
    """What a page did when loaded: console errors, exceptions, and whatever `evaluate` asked for."""

    console: list[dict[str, Any]] = field(default_factory=list)  # every console message / log entry
    exceptions: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)  # expression -> its JSON value
    screenshot: bytes = b""  # PNG of the whole page

    @property
    def errors(self) -> list[str]:
        """Console and log entries of level error, and uncaught exceptions."""
        return [str(m.get("text")) for m in self.console if m.get("level") == "error"] + self.exceptions


class Chromium:
    """A running headless Chromium: `open(path, expressions)` loads a file and reports (PageResult)."""

    def __init__(self, executable: str, workdir: Path) -> None:
        self.executable, self.workdir = executable, workdir
        self.profile = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=workdir))
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self, timeout: float = 60) -> None:
        self.proc = subprocess.Popen([self.executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=open(self.workdir / "chromium.log", "wb"),
                                     start_new_session=True)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not port_file.exists() or not port_file.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start: {self.log()[-2000:]}")
            time.sleep(0.1)
        self.port = int(port_file.read_text().split()[0])

    def log(self) -> str:
        path = self.workdir / "chromium.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the renderers go with it
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def _new_tab(self) -> dict[str, Any]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/json/new?about:blank", method="PUT")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def _close_tab(self, tab: dict[str, Any]) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/close/{tab['id']}", timeout=30):
            pass

    def open(self, path: Path, expressions: tuple[str, ...] = (), *, width: int = 1200,
             settle_s: float = 0.5) -> PageResult:
        """Load `path` (file://), wait for its load event, evaluate `expressions`, screenshot the page."""
        tab = self._new_tab()
        try:
            return asyncio.run(self._drive(tab["webSocketDebuggerUrl"], path.resolve().as_uri(), expressions,
                                           width, settle_s))
        finally:
            self._close_tab(tab)

    async def _drive(self, ws_url: str, url: str, expressions: tuple[str, ...], width: int,
                     settle_s: float) -> PageResult:
        import aiohttp

        result = PageResult()
        async with aiohttp.ClientSession() as session, session.ws_connect(ws_url, max_msg_size=0) as ws:
            ids = iter(range(1, 1_000_000))
            pending: dict[int, asyncio.Future] = {}
            loaded = asyncio.get_running_loop().create_future()

            async def reader() -> None:
                async for message in ws:
                    data = json.loads(message.data)
                    if "id" in data and data["id"] in pending:
                        pending.pop(data["id"]).set_result(data)
                    method, params = data.get("method"), data.get("params", {})
                    if method == "Runtime.consoleAPICalled":
                        text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                        result.console.append({"level": "error" if params.get("type") in ("error", "assert")
                                               else params.get("type"), "text": text})
                    elif method == "Log.entryAdded":
                        entry = params.get("entry", {})
                        result.console.append({"level": entry.get("level"), "text": entry.get("text")})
                    elif method == "Runtime.exceptionThrown":
                        result.exceptions.append(json.dumps(params.get("exceptionDetails", {}))[:2000])
                    elif method == "Page.loadEventFired" and not loaded.done():
                        loaded.set_result(True)

            async def call(method: str, **params: Any) -> dict[str, Any]:
                key = next(ids)
                pending[key] = asyncio.get_running_loop().create_future()
                await ws.send_str(json.dumps({"id": key, "method": method, "params": params}))
                answer = await asyncio.wait_for(pending[key], 60)
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

            task = asyncio.create_task(reader())
            try:
                for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
                    await call(domain)
                await call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1,
                           mobile=False)
                await call("Page.navigate", url=url)
                await asyncio.wait_for(loaded, 60)
                await asyncio.sleep(settle_s)
                for expression in expressions:
                    answer = await call("Runtime.evaluate", expression=expression, returnByValue=True)
                    result.values[expression] = answer.get("result", {}).get("value")
                shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                result.screenshot = base64.b64decode(shot["data"])
            finally:
                task.cancel()
        return result


@pytest.fixture(scope="session")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; scripts/setup.sh does it as root)")
    browser = Chromium(executable, tmp_path_factory.mktemp("chromium"))
    try:
        browser.start()
    except (RuntimeError, OSError) as exc:
        browser.stop()
        pytest.skip(f"chromium did not start: {exc}")
    try:
        yield browser
    finally:
        browser.stop()
