"""A scripted model on loopback: a server speaking the model APIs the tested agents call,
whose every answer comes from a script, and which records every request it was sent.

It stands in for the LLM, and only for it, when a real gateway or coding agent (OpenClaw,
Hermes, Claude Code, Codex CLI, Gemini CLI) runs its own agent loop in a test: the agent
calls tools, the loopfuse side publishes to Kafka, the worker judges, and the model's next
request shows what the agent let through. The APIs, all streamed when asked:

- OpenAI chat completions (``POST /v1/chat/completions``: OpenClaw, Hermes);
- Anthropic Messages (``POST /v1/messages``: Claude Code, ``ANTHROPIC_BASE_URL``);
- OpenAI Responses (``POST /v1/responses``: Codex CLI's ``wire_api = "responses"``);
- Gemini ``generateContent`` / ``streamGenerateContent?alt=sse`` (``POST
  /v1beta/models/M:ACTION``: Gemini CLI, ``GOOGLE_GEMINI_BASE_URL``).

    python -m tests.support.scripted_model --script SCRIPT.json --log REQUESTS.jsonl

prints ``scripted-model: listening on http://127.0.0.1:PORT/v1`` as its first line.
A script is JSON: ``{"steps": [STEP, ...], "then": "repeat" | "stop"}`` where a STEP
is ``{"tool_calls": [{"name": N, "arguments": {...}}, ...]}`` or ``{"text": T}``. Turn
*n* (from 0) answers with ``steps[n]``; past the end, ``"repeat"`` answers with the last
step again, ``"stop"`` with the text ``"done"``. A request that offers no tools (a
gateway's summary or compaction call, an agent's title or routing call: not a turn of the
agent loop) uses no step: it is answered with the text ``"summary of the earlier turns"``,
or, when it asks for JSON of a schema (Gemini CLI's model router and next-speaker check),
with the first value the schema allows. With ``"when_seen": {"text": T, "step": STEP}``,
every turn from the first request whose messages hold the text T on answers with STEP
(e.g. a loop that starts right after a compaction). A step with ``"wait_for": PATH`` is
answered once that file exists (a test restarts a service between two turns), one with
``"delay": S`` after S seconds (a real model's think time).

Each request is appended to the log as one JSON line: ``{"turn": n, "api": A, "at":
UNIX_TIME, "messages": [...], "tools": [names], "results": [...]}``, where ``messages``
is the API's own conversation (chat and Messages ``messages``, Responses ``input``,
Gemini ``contents``); ``results`` holds the tool results the request carries after the
model's newest answer, as ``{"id": CALL_ID or null, "name": TOOL or null, "output": TEXT,
"error": bool}`` in the API's order (what the model received from the tools), and
``notes`` the other texts there (what an agent added beside the results: a hook's
message, a reminder). The first request has neither.
Requests to any other path are logged with ``"turn": -1`` and answered 404.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

MODEL = "scripted"
SUMMARY = "summary of the earlier turns"

Json = dict[str, Any]


class Script:
    """The answers, turn by turn, and the log of what the model was sent."""

    def __init__(self, script: Json, log: Path | None) -> None:
        self.steps: list[Json] = list(script.get("steps") or [{"text": "done"}])
        self.then = str(script.get("then", "repeat"))
        self.when_seen: Json | None = script.get("when_seen")
        self.seen = False
        self.log = log
        self.turn = 0
        self.requests: list[Json] = []

    def record(self, record: Json) -> None:
        self.requests.append(record)
        if self.log is not None:
            with self.log.open("a", encoding="utf-8") as out:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")

    def next_step(
        self,
        api: str,
        messages: list[Any],
        tools: list[str],
        results: list[Json] | None = None,
        notes: list[str] | None = None,
    ) -> tuple[int, Json | None]:
        """The turn number (-1: not a turn of the agent loop) and its step (None then)."""
        turn = -1
        if tools:
            turn = self.turn
            self.turn += 1
        self.record(
            {
                "turn": turn,
                "api": api,
                "at": time.time(),
                "messages": messages,
                "tools": tools,
                "results": results or [],
                "notes": notes or [],
            }
        )
        if turn < 0:
            return turn, None
        if self.when_seen is not None:
            marker = str(self.when_seen["text"])
            self.seen = self.seen or any(
                marker in json.dumps(m, ensure_ascii=False) for m in messages
            )
            if self.seen:
                return turn, self.when_seen["step"]
        if turn < len(self.steps):
            return turn, self.steps[turn]
        return turn, self.steps[-1] if self.then == "repeat" else {"text": "done"}


async def _held(step: Json | None) -> None:
    """A step with ``"delay": S`` is answered after S seconds (a model's think time); one
    with ``"wait_for": PATH`` once that file exists (at most 120 s): a test does something
    between two turns of the agent's loop."""
    await asyncio.sleep(float((step or {}).get("delay", 0)))
    path = (step or {}).get("wait_for")
    if path is None:
        return
    for _ in range(1200):
        if Path(path).exists():
            return
        await asyncio.sleep(0.1)


def _calls(step: Json | None) -> list[Json]:
    return list((step or {}).get("tool_calls", []))


def _text(step: Json | None) -> str:
    if step is None:
        return SUMMARY
    return str(step.get("text") or "")


def _text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text_of(part.get("text", part.get("content", ""))) for part in content)
    return "" if content is None else json.dumps(content)


def _after_last(messages: list[Any], is_model: Callable[[Json], bool]) -> list[Json]:
    """The messages after the model's newest one (all of them when it has none yet)."""
    tail: list[Json] = []
    for message in reversed(messages):
        if not isinstance(message, dict) or is_model(message):
            break
        tail.append(message)
    return tail[::-1] if len(tail) < len(messages) else []


async def _stream(request: web.Request, frames: list[bytes]) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for frame in frames:
        await response.write(frame)
    await response.write_eof()
    return response


# -- OpenAI chat completions ------------------------------------------------------------


def _chat_tool_calls(turn: int, step: Json | None) -> list[Json]:
    return [
        {
            "id": f"call_{turn}_{index}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))},
        }
        for index, call in enumerate(_calls(step))
    ]


def _chat_usage(body: Json) -> dict[str, int]:
    """Token counts as a provider would report them (about 4 characters a token): a
    gateway that compacts by reported usage sees its context fill up."""
    prompt = len(json.dumps(body.get("messages", []))) // 4
    return {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}


def _chat_results(messages: list[Json]) -> tuple[list[Json], list[str]]:
    after = _after_last(messages, lambda m: m.get("role") == "assistant")
    results = [
        {
            "id": m.get("tool_call_id"),
            "name": m.get("name"),
            "output": _text_of(m.get("content")),
            "error": False,
        }
        for m in after
        if m.get("role") == "tool"
    ]
    return results, [_text_of(m.get("content")) for m in after if m.get("role") != "tool"]


async def _chat(script: Script, request: web.Request) -> web.StreamResponse:
    body = await request.json()
    messages = body.get("messages", [])
    tools = [t.get("function", {}).get("name") for t in body.get("tools") or []]
    turn, step = script.next_step("chat", messages, tools, *_chat_results(messages))
    await _held(step)
    calls = _chat_tool_calls(turn, step)
    finish = "tool_calls" if calls else "stop"
    usage = _chat_usage(body)
    base = {"id": f"chatcmpl-{turn}", "created": int(time.time()), "model": MODEL}
    if not body.get("stream"):
        message: Json = {"role": "assistant", "content": _text(step) if not calls else None}
        if calls:
            message["tool_calls"] = calls
        choice = {"index": 0, "message": message, "finish_reason": finish}
        return web.json_response(
            {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
        )
    base["object"] = "chat.completion.chunk"
    delta: Json = {"role": "assistant", "content": "" if calls else _text(step)}
    if calls:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
    last = {"index": 0, "delta": {}, "finish_reason": finish}
    chunks = [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**base, "choices": [last], "usage": usage},
    ]
    return await _stream(
        request, [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
    )


# -- Anthropic Messages -----------------------------------------------------------------


def _anthropic_results(messages: list[Json]) -> tuple[list[Json], list[str]]:
    results: list[Json] = []
    notes: list[str] = []
    for message in _after_last(messages, lambda m: m.get("role") == "assistant"):
        content = message.get("content")
        for part in content if isinstance(content, list) else [{"text": content}]:
            if isinstance(part, dict) and part.get("type") == "tool_result":
                results.append(
                    {
                        "id": part.get("tool_use_id"),
                        "name": None,
                        "output": _text_of(part.get("content")),
                        "error": bool(part.get("is_error")),
                    }
                )
            elif isinstance(part, dict) and part.get("text"):
                notes.append(str(part["text"]))
    return results, notes


def _anthropic_blocks(turn: int, step: Json | None) -> list[Json]:
    calls = _calls(step)
    if not calls:
        return [{"type": "text", "text": _text(step)}]
    return [
        {
            "type": "tool_use",
            "id": f"toolu_{turn}_{index}",
            "name": call["name"],
            "input": call.get("arguments", {}),
        }
        for index, call in enumerate(calls)
    ]


async def _anthropic(script: Script, request: web.Request) -> web.StreamResponse:
    body = await request.json()
    messages = body.get("messages", [])
    tools = [str(t.get("name")) for t in body.get("tools") or []]
    turn, step = script.next_step("anthropic", messages, tools, *_anthropic_results(messages))
    await _held(step)
    blocks = _anthropic_blocks(turn, step)
    stop = "tool_use" if blocks[0]["type"] == "tool_use" else "end_turn"
    usage = {"input_tokens": len(json.dumps(messages)) // 4, "output_tokens": 5}
    message = {
        "id": f"msg_{turn}_{len(script.requests)}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", MODEL),
        "stop_sequence": None,
    }
    if not body.get("stream"):
        return web.json_response(
            {**message, "content": blocks, "stop_reason": stop, "usage": usage}
        )
    frames = [
        _sse_event(
            "message_start",
            {"message": {**message, "content": [], "stop_reason": None, "usage": usage}},
        )
    ]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        frames += [
            _sse_event("content_block_start", {"index": index, "content_block": start}),
            _sse_event("content_block_delta", {"index": index, "delta": delta}),
            _sse_event("content_block_stop", {"index": index}),
        ]
    frames += [
        _sse_event(
            "message_delta",
            {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 5}},
        ),
        _sse_event("message_stop", {}),
    ]
    return await _stream(request, frames)


def _sse_event(kind: str, data: Json) -> bytes:
    """An SSE frame whose event name is also the payload's ``type``."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


# -- OpenAI Responses -------------------------------------------------------------------


def _responses_results(items: list[Json]) -> tuple[list[Json], list[str]]:
    results: list[Json] = []
    notes: list[str] = []
    for item in _after_last(items, lambda i: i.get("type") in _RESPONSES_CALLS):
        if item.get("type") not in ("function_call_output", "custom_tool_call_output"):
            notes.append(_text_of(item.get("content")))
            continue
        output = item.get("output")
        failed = False
        if isinstance(output, dict):  # {"content": ..., "success": bool}
            failed = output.get("success") is False
            output = output.get("content")
        results.append(
            {"id": item.get("call_id"), "name": None, "output": _text_of(output), "error": failed}
        )
    return results, notes


_RESPONSES_CALLS = ("function_call", "custom_tool_call", "local_shell_call")


def _responses_items(turn: int, step: Json | None) -> list[Json]:
    calls = _calls(step)
    if not calls:
        text = {"type": "output_text", "text": _text(step), "annotations": []}
        return [
            {
                "type": "message",
                "id": f"msg_{turn}",
                "role": "assistant",
                "status": "completed",
                "content": [text],
            }
        ]
    return [
        {
            "type": "function_call",
            "id": f"fc_{turn}_{index}",
            "call_id": f"call_{turn}_{index}",
            "name": call["name"],
            "arguments": json.dumps(call.get("arguments", {})),
            "status": "completed",
        }
        for index, call in enumerate(calls)
    ]


def _responses_tool_name(tool: Json) -> str:
    return str(tool.get("name") or tool.get("type"))


async def _responses(script: Script, request: web.Request) -> web.StreamResponse:
    body = await request.json()
    items = body.get("input", [])
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    tools = [_responses_tool_name(t) for t in body.get("tools") or []]
    turn, step = script.next_step("responses", items, tools, *_responses_results(items))
    await _held(step)
    output = _responses_items(turn, step)
    tokens = len(json.dumps(items)) // 4
    usage = {
        "input_tokens": tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": tokens + 5,
    }
    response = {
        "id": f"resp_{turn}_{len(script.requests)}",
        "object": "response",
        "created_at": int(time.time()),
        "model": body.get("model", MODEL),
        "status": "completed",
        "output": output,
        "usage": usage,
    }
    if not body.get("stream"):
        return web.json_response(response)
    frames = [
        _sse_event(
            "response.created", {"response": {**response, "status": "in_progress", "output": []}}
        )
    ]
    for index, item in enumerate(output):
        added = {**item, "status": "in_progress"}
        if item["type"] == "function_call":
            added["arguments"] = ""
        frames.append(
            _sse_event("response.output_item.added", {"output_index": index, "item": added})
        )
        if item["type"] == "function_call":
            frames.append(
                _sse_event(
                    "response.function_call_arguments.delta",
                    {"output_index": index, "item_id": item["id"], "delta": item["arguments"]},
                )
            )
        else:
            frames.append(
                _sse_event(
                    "response.output_text.delta",
                    {
                        "output_index": index,
                        "item_id": item["id"],
                        "content_index": 0,
                        "delta": item["content"][0]["text"],
                    },
                )
            )
        frames.append(
            _sse_event("response.output_item.done", {"output_index": index, "item": item})
        )
    frames.append(_sse_event("response.completed", {"response": response}))
    return await _stream(request, frames)


# -- Gemini -----------------------------------------------------------------------------


def _gemini_results(contents: list[Json]) -> tuple[list[Json], list[str]]:
    results: list[Json] = []
    notes: list[str] = []
    for content in _after_last(contents, lambda c: c.get("role") == "model"):
        for part in content.get("parts") or []:
            answer = part.get("functionResponse") if isinstance(part, dict) else None
            if answer is None:
                if isinstance(part, dict) and part.get("text"):
                    notes.append(str(part["text"]))
                continue
            response = answer.get("response") or {}
            error = "error" in response and "output" not in response
            output = response.get("output", response.get("error", response))
            results.append(
                {
                    "id": answer.get("id"),
                    "name": answer.get("name"),
                    "output": output if isinstance(output, str) else json.dumps(output),
                    "error": error,
                }
            )
    return results, notes


def _schema_value(schema: Json) -> Any:
    """The first value a JSON schema (OpenAPI-style types too) allows."""
    if schema.get("enum"):
        return schema["enum"][0]
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        return {name: _schema_value(sub) for name, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        return []
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    return MODEL


def _gemini_answer(body: Json, step: Json | None) -> Json:
    config = body.get("generationConfig") or {}
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    calls = _calls(step)
    if calls:
        parts: list[Json] = [
            {"functionCall": {"name": call["name"], "args": call.get("arguments", {})}}
            for call in calls
        ]
    elif step is None and schema:
        parts = [{"text": json.dumps(_schema_value(schema))}]
    else:
        parts = [{"text": _text(step)}]
    tokens = len(json.dumps(body.get("contents", []))) // 4
    return {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": {
            "promptTokenCount": tokens,
            "candidatesTokenCount": 5,
            "totalTokenCount": tokens + 5,
        },
        "modelVersion": MODEL,
    }


async def _gemini(script: Script, request: web.Request) -> web.StreamResponse:
    action = request.match_info["call"].rsplit(":", 1)[-1]
    body = await request.json()
    contents = body.get("contents", [])
    if action == "countTokens":
        return web.json_response({"totalTokens": len(json.dumps(contents)) // 4})
    tools = [
        str(declaration.get("name"))
        for tool in body.get("tools") or []
        for declaration in tool.get("functionDeclarations") or []
    ]
    _, step = script.next_step("gemini", contents, tools, *_gemini_results(contents))
    await _held(step)
    answer = _gemini_answer(body, step)
    if action == "streamGenerateContent":
        return await _stream(request, [f"data: {json.dumps(answer)}\n\n".encode()])
    return web.json_response(answer)


# -- the server -------------------------------------------------------------------------


def build_app(script: Script) -> web.Application:
    def bound(
        handler: Callable[[Script, web.Request], Any],
    ) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await handler(script, request)  # type: ignore[no-any-return]

        return handle

    async def models(_: web.Request) -> web.Response:
        model = {"id": MODEL, "object": "model", "created": 0, "owned_by": "loopfuse-tests"}
        return web.json_response({"object": "list", "data": [model], "models": [model]})

    async def unknown(request: web.Request) -> web.Response:
        script.record(
            {
                "turn": -1,
                "api": "unknown",
                "at": time.time(),
                "path": f"{request.method} {request.path_qs}",
                "messages": [],
                "tools": [],
                "results": [],
                "notes": [],
            }
        )
        return web.json_response({"error": {"message": "not scripted"}}, status=404)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    for prefix in ("/v1", ""):
        app.router.add_post(f"{prefix}/chat/completions", bound(_chat))
        app.router.add_post(f"{prefix}/messages", bound(_anthropic))
        app.router.add_post(f"{prefix}/responses", bound(_responses))
        app.router.add_get(f"{prefix}/models", models)
    app.router.add_post("/{version}/models/{call}", bound(_gemini))
    app.router.add_route("*", "/{tail:.*}", unknown)
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
