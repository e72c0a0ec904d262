"""A local webhook for notification tests: ``http.server`` on 127.0.0.1 in a thread."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: Decides one request's answer from its body: a status, or (status, headers).
Answer = Callable[[dict[str, Any]], int | tuple[int, dict[str, str]]]


class Webhook:
    """A local webhook: answers ``statuses`` in turn, then ``answer(body)`` (default
    200), and records every request; ``received`` / ``bodies`` hold the delivered ones
    (status 200), parsed and byte for byte."""

    def __init__(self, statuses: list[int] | None = None, answer: Answer | None = None) -> None:
        self.statuses = list(statuses or [])
        self.answer = answer
        self.received: list[dict[str, Any]] = []
        self.bodies: list[bytes] = []
        self.attempts = 0
        self.times: list[float] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                document = json.loads(body)
                headers: dict[str, str] = {}
                with outer.lock:
                    outer.attempts += 1
                    outer.times.append(time.monotonic())
                    if outer.statuses:
                        status = outer.statuses.pop(0)
                    elif outer.answer is not None:
                        answered = outer.answer(document)
                        status, headers = (
                            answered if isinstance(answered, tuple) else (answered, {})
                        )
                    else:
                        status = 200
                    if status == 200:
                        assert self.headers["Content-Type"] == "application/json"
                        outer.received.append(document)
                        outer.bodies.append(body)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"nope")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def event_ids(self) -> list[str]:
        """The loop-event id of each delivered post (a coalesced post: its last event's)."""
        with self.lock:
            return [post["loop_event"]["event_id"] for post in self.received]

    def __enter__(self) -> Webhook:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def critical_loop_events(n: int, tag: str = "s", **fields: Any) -> list[dict[str, Any]]:
    """``n`` critical loop events of ``n`` sessions (none a repeat of another), from the
    fixture's first block; ``fields`` override every one (e.g. one session: a flood)."""
    from tests.support.kafka import fixture_records

    block = next(
        e for e in fixture_records() if e["level"] == "critical" and e["action"] == "block"
    )
    return [
        {
            **block,
            "event_id": f"{tag}-{i:05d}",
            "session_key": f"{tag}:{i}",
            "count": 10 + i,
            "event_ts": block["event_ts"] + i,
            **fields,
        }
        for i in range(n)
    ]
