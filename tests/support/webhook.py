"""A local webhook for notification tests: ``http.server`` on 127.0.0.1 in a thread."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Webhook:
    """A local webhook: answers ``statuses`` in turn (then 200), records every request."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.received: list[dict[str, Any]] = []
        self.attempts = 0
        self.times: list[float] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.attempts += 1
                outer.times.append(time.monotonic())
                status = outer.statuses.pop(0) if outer.statuses else 200
                if status == 200:
                    assert self.headers["Content-Type"] == "application/json"
                    outer.received.append(json.loads(body))
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"nope")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Webhook:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
