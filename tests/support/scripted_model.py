"""A scripted model on loopback: an OpenAI-compatible chat-completions server whose every
answer comes from a script, and which records every request it was sent.

It stands in for the LLM, and only for it, when a real gateway (OpenClaw, Hermes) runs
its own agent loop in a test: the gateway calls tools, the plugin publishes to Kafka,
the worker judges, and the model's next request shows what the gateway let through.

    python -m tests.support.scripted_model --script SCRIPT.json --log REQUESTS.jsonl

prints ``scripted-model: listening on http://127.0.0.1:PORT/v1`` as its first line.
A script is JSON: ``{"steps": [STEP, ...], "then": "repeat" | "stop"}`` where a STEP
is ``{"tool_calls": [{"name": N, "arguments": {...}}, ...]}`` or ``{"text": T}``. Turn
*n* (from 0) answers with ``steps[n]``; past the end, ``"repeat"`` answers with the last
step again, ``"stop"`` with the text ``"done"``. A request that offers no tools (a
gateway's summary or compaction call, not a turn of the agent loop) is answered with
the text ``"summary of the earlier turns"`` and uses no step. With ``"when_seen":
{"text": T, "step": STEP}``, every turn from the first request whose messages hold the
text T on answers with STEP (e.g. a loop that starts right after a compaction). Answers stream (SSE)
when the request asks for ``stream``. Each request is appended to the log as one JSON line:
``{"turn": n, "messages": [...], "tools": [names]}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

MODEL = "scripted"


class Script:
    """The answers, turn by turn, and the log of what the model was sent."""

    def __init__(self, script: dict[str, Any], log: Path | None) -> None:
        self.steps: list[dict[str, Any]] = list(script.get("steps") or [{"text": "done"}])
        self.then = str(script.get("then", "repeat"))
        self.when_seen: dict[str, Any] | None = script.get("when_seen")
        self.seen = False
        self.log = log
        self.turn = 0
        self.requests: list[dict[str, Any]] = []

    def next_step(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if not body.get("tools"):
            turn = -1  # not a turn of the agent loop
        else:
            turn = self.turn
            self.turn += 1
        record = {
            "turn": turn,
            "messages": body.get("messages", []),
            "tools": [t.get("function", {}).get("name") for t in body.get("tools") or []],
        }
        self.requests.append(record)
        if self.log is not None:
            with self.log.open("a", encoding="utf-8") as out:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
        if turn < 0:
            return turn, {"text": "summary of the earlier turns"}
        if self.when_seen is not None:
            marker = str(self.when_seen["text"])
            self.seen = self.seen or any(
                marker in json.dumps(m, ensure_ascii=False) for m in record["messages"]
            )
            if self.seen:
                return turn, self.when_seen["step"]
        if turn < len(self.steps):
            return turn, self.steps[turn]
        return turn, self.steps[-1] if self.then == "repeat" else {"text": "done"}


def _tool_calls(turn: int, step: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "id": f"call_{turn}_{index}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))},
        }
        for index, call in enumerate(step.get("tool_calls", []))
    ]


def _usage(body: dict[str, Any]) -> dict[str, int]:
    """Token counts as a provider would report them (about 4 characters a token): a
    gateway that compacts by reported usage sees its context fill up."""
    prompt = len(json.dumps(body.get("messages", []))) // 4
    return {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}


def _completion(turn: int, step: dict[str, Any], usage: dict[str, int]) -> dict[str, Any]:
    calls = _tool_calls(turn, step)
    message: dict[str, Any] = {"role": "assistant", "content": step.get("text")}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-{turn}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": usage,
    }


def _chunks(turn: int, step: dict[str, Any], usage: dict[str, int]) -> list[dict[str, Any]]:
    base = {
        "id": f"chatcmpl-{turn}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": MODEL,
    }
    calls = _tool_calls(turn, step)
    delta: dict[str, Any] = {"role": "assistant", "content": step.get("text") or ""}
    if calls:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
    return [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {
            **base,
            "choices": [
                {"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls else "stop"}
            ],
            "usage": usage,
        },
    ]


def build_app(script: Script) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        turn, step = script.next_step(body)
        if not body.get("stream"):
            return web.json_response(_completion(turn, step, _usage(body)))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in _chunks(turn, step, _usage(body)):
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"id": MODEL, "object": "model", "created": 0, "owned_by": "loopfuse-tests"}
                ],
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/chat/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/models", models)
    return app


async def serve(script: Script, port: int) -> None:
    runner = web.AppRunner(build_app(script), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"scripted-model: listening on http://127.0.0.1:{bound}/v1", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", type=Path, required=True)
    parser.add_argument("--log", type=Path)
    parser.add_argument("--port", type=int, default=0)
    opts = parser.parse_args(argv)
    script = Script(json.loads(opts.script.read_text()), opts.log)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(script, opts.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
