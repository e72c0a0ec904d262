"""A real headless Chromium (Debian's ``chromium``), driven over the DevTools protocol.

For tests of pages loopfuse writes (the audit report): open a file, collect console
errors, uncaught exceptions and every network request, evaluate JavaScript in the
page, take a screenshot. No Selenium or Playwright: a websocket (aiohttp, already a
dependency through Faust) and a dozen protocol methods.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)


def find_chromium() -> str | None:
    """The chromium binary: $LOOPFUSE_CHROMIUM, /usr/bin/chromium, or on PATH."""
    for candidate in (os.environ.get("LOOPFUSE_CHROMIUM"), "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Page:
    """One browser tab and what it reported."""

    ws: aiohttp.ClientWebSocketResponse
    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    _next_id: int = 0
    _replies: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    _loaded: asyncio.Event = field(default_factory=asyncio.Event)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[self._next_id] = reply
        await self.ws.send_json({"id": self._next_id, "method": method, "params": params})
        message = await asyncio.wait_for(reply, 30)
        if "error" in message:
            raise RuntimeError(f"{method}: {message['error']}")
        return dict(message.get("result", {}))

    def _on(self, message: dict[str, Any]) -> None:
        if "id" in message:
            reply = self._replies.pop(message["id"], None)
            if reply is not None and not reply.done():
                reply.set_result(message)
            return
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.console_errors.append(
                " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            )
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.exceptions.append(
                str(details.get("exception", {}).get("description") or details.get("text"))
            )
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            self.console_errors.append(str(params["entry"].get("text")))
        elif method == "Network.requestWillBeSent":
            self.requests.append(str(params["request"]["url"]))
        elif method == "Page.loadEventFired":
            self._loaded.set()

    async def open(self, url: str) -> None:
        self._loaded.clear()
        await self.send("Page.navigate", url=url)
        await asyncio.wait_for(self._loaded.wait(), 30)

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, path: Path) -> Path:
        shot = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


@contextlib.asynccontextmanager
async def chromium_page(width: int = 1280, height: int = 1600) -> AsyncIterator[Page]:
    """A fresh headless Chromium with one page; stopped (by its pid) afterwards."""
    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError(
            "chromium not found: install Debian's chromium package (.ci/run does), "
            "or set LOOPFUSE_CHROMIUM"
        )
    profile = Path(tempfile.mkdtemp(prefix="loopfuse-chromium-"))
    log = open(profile / "chromium.log", "wb")  # noqa: SIM115 - closed in the finally below
    process = subprocess.Popen(
        [
            binary,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and port_file.read_text().count("\n") >= 1:
                break
            if process.poll() is not None:
                raise RuntimeError(f"chromium exited: {(profile / 'chromium.log').read_text()}")
            await asyncio.sleep(0.1)
        else:
            raise TimeoutError("chromium did not open its DevTools port in 30 s")
        port = int(port_file.read_text().splitlines()[0])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as answer:
                targets = await answer.json()
            target = next(t for t in targets if t["type"] == "page")
            async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                reader = asyncio.create_task(_read(ws, page))
                try:
                    for domain in ("Runtime", "Log", "Page", "Network"):
                        await page.send(f"{domain}.enable")
                    yield page
                finally:
                    reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await reader
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()
        shutil.rmtree(profile, ignore_errors=True)


async def _read(ws: aiohttp.ClientWebSocketResponse, page: Page) -> None:
    async for message in ws:
        if message.type == aiohttp.WSMsgType.TEXT:
            page._on(message.json())
