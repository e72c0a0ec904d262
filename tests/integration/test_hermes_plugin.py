"""The Hermes Agent plugin inside the real hermes-agent, in front of a real worker.

Hermes' own plugin manager loads the plugin from its entry point, with its settings
in Hermes' config.yaml; tool calls go through Hermes' own dispatcher
(``model_tools.handle_function_call``, what the agent loop calls, minus the LLM) to
test tools registered in Hermes' registry. What the agent sees must follow exactly
the verdicts ``Engine.replay`` gives for the events the plugin published.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from loopfuse.schemas import load_config, validate_event
from loopfuse.streams.engine import Engine, Verdict
from loopfuse.streams.gateway.client import TIMEOUT_MESSAGE
from loopfuse.streams.local.worker_process import WorkerProcess, topic_settings, unique_topics
from tests.support.harness import unique, worker_settings

pytestmark = pytest.mark.timeout(180)

CONFIG = Path(__file__).resolve().parents[1] / "fixtures" / "small.json5"  # warning 3, critical 5
STUCK = json.dumps({"output": "error: still broken", "exit_code": 1})


class Tools:
    """Test tools in Hermes' registry; counts how often each really ran."""

    def __init__(self) -> None:
        from tools.registry import registry

        self.runs: dict[str, int] = {}
        self._lock = threading.Lock()
        for name, handler in (("lf_exec", self._exec), ("lf_read", self._read)):
            registry.register(
                name=name,
                toolset="loopfuse_test",
                schema={
                    "name": name,
                    "description": f"loopfuse test tool {name}",
                    "parameters": {"type": "object", "properties": {}},
                },
                handler=handler,
            )

    def _count(self, name: str) -> None:
        with self._lock:
            self.runs[name] = self.runs.get(name, 0) + 1

    def _exec(self, args: dict[str, Any], **_: Any) -> str:
        self._count("lf_exec")
        return STUCK

    def _read(self, args: dict[str, Any], **_: Any) -> str:
        self._count("lf_read")
        return json.dumps({"content": f"contents of {args.get('path')}"})


class Hermes:
    """Hermes with the loopfuse plugin enabled, as an agent process would run it."""

    def __init__(self, home: Path, entry: dict[str, Any]) -> None:
        from hermes_cli.plugins import discover_plugins, get_plugin_manager

        import loopfuse.integrations.hermes

        config = {"plugins": {"enabled": ["loopfuse"], "entries": {"loopfuse": entry}}}
        (home / "config.yaml").write_text(yaml.safe_dump(config))
        discover_plugins(force=True)
        (loaded,) = [p for p in get_plugin_manager().list_plugins() if p["key"] == "loopfuse"]
        assert loaded["enabled"] and loaded["source"] == "entrypoint", loaded["error"]
        assert loaded["hooks"] == len(loopfuse.integrations.hermes.HOOKS)
        plugin = loopfuse.integrations.hermes.active()
        assert plugin is not None
        self.plugin = plugin
        self.events: list[dict[str, Any]] = []
        plugin.observer = self.events.append

    def call(self, tool: str, args: dict[str, Any], *, session: str, task: str) -> str:
        """One tool call the model made, through Hermes' dispatcher: what the model sees."""
        from model_tools import handle_function_call

        result = handle_function_call(
            tool,
            dict(args),
            task_id=task,
            session_id=session,
            tool_call_id=f"call_{uuid.uuid4().hex[:10]}",
        )
        assert isinstance(result, str)
        return result

    def hook(self, name: str, **kwargs: Any) -> None:
        """A lifecycle hook, fired the way Hermes' agent loop fires it."""
        from hermes_cli.plugins import invoke_hook

        invoke_hook(name, **kwargs)

    def wait_events(
        self, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 10
    ) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.events):
            assert time.monotonic() < deadline, f"published so far: {self.events[-3:]}"
            time.sleep(0.02)

    def replayed_verdicts(self) -> list[Verdict]:
        """What ``loopfuse replay`` decides for the events this Hermes published."""
        events = [validate_event(e) for e in self.events]
        return [o for o in Engine(load_config(CONFIG)).replay(events) if isinstance(o, Verdict)]


@pytest.fixture(scope="module")
def hermes_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("hermes-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HERMES_HOME", str(home))
        yield home


@pytest.fixture(scope="module")
def tools(hermes_home: Path) -> Tools:
    return Tools()


@pytest.fixture(scope="module")
def worker(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """One worker for the module, on topics of its own; yields the topic settings."""
    roles = unique_topics("hermes")
    topics = topic_settings(roles)
    tmp = tmp_path_factory.mktemp("hermes-worker")
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        roles,
        unique("hermes-test"),
        tmp / "data",
        config_file=CONFIG,
    )
    process = WorkerProcess(settings, log_path=tmp / "worker.log").start()
    try:
        process.wait_ready(90)
        yield topics
    finally:
        process.stop()


@pytest.fixture
def hermes(
    request: pytest.FixtureRequest,
    hermes_home: Path,
    tools: Tools,
    kafka_bootstrap: str,
    worker: dict[str, str],
) -> Iterator[Hermes]:
    """Hermes with the plugin in front of the module's worker (param: hash_locally)."""
    entry = {
        "bootstrap_servers": kafka_bootstrap,
        "gateway_timeout": 30,
        **worker,
        "hash_locally": getattr(request, "param", False),
    }
    agent = Hermes(hermes_home, entry)
    yield agent
    agent.plugin.close()


@pytest.mark.parametrize("hermes", [False, True], ids=["raw", "hashed"], indirect=True)
def test_a_looping_agent_is_warned_then_blocked_as_replay_judges_it(
    hermes: Hermes, tools: Tools
) -> None:
    session, task = f"sess-{uuid.uuid4().hex[:8]}", "task-1"
    args = {"command": "make build"}
    before = tools.runs.get("lf_exec", 0)
    seen = [hermes.call("lf_exec", args, session=session, task=task) for _ in range(7)]
    # 7 calls and 7 results: the 7th call is answered from the sticky-block cache (no
    # wait for a verdict) but still published, so loopfuse records the attempt; its
    # blocked result is published too, like every vetoed call's.
    hermes.wait_events(lambda events: len(events) >= 14)
    assert [e["type"] for e in hermes.events].count("tool_call") == 7

    verdicts = hermes.replayed_verdicts()
    assert [v.action for v in verdicts] == [
        "allow",
        "allow",
        "allow",
        "warn",
        "warn",
        "block",
        "block",
    ]
    assert seen[:3] == [STUCK] * 3  # allowed: untouched
    for shown, verdict in zip(seen[3:5], verdicts[3:5], strict=True):  # warned: ran, and told
        assert json.loads(shown) == {**json.loads(STUCK), "loopfuse_warning": verdict.message}
    block = verdicts[5].message
    assert block is not None and block.startswith("CRITICAL: Called lf_exec with identical")
    assert [json.loads(s) for s in seen[5:]] == [{"error": block}] * 2  # blocked: not run
    assert tools.runs["lf_exec"] - before == 5
    # The vetoed call's result is loopfuse's blocked shape, so the block stays in force
    # (hashed: a result with nothing to record, what that shape hashes to).
    last = hermes.events[-1]
    assert last["type"] == "tool_result" and "error" not in last
    if hermes.plugin.settings.hash_locally:
        assert "args_hash" in last and last["result"] is None
    else:
        assert last["result"]["details"]["status"] == "blocked"


def test_a_healthy_agent_is_untouched(hermes: Hermes, tools: Tools) -> None:
    session = f"sess-{uuid.uuid4().hex[:8]}"
    seen = [
        hermes.call("lf_read", {"path": f"/src/file{i}.py"}, session=session, task="t")
        for i in range(8)
    ]
    assert seen == [json.dumps({"content": f"contents of /src/file{i}.py"}) for i in range(8)]
    hermes.wait_events(lambda events: len(events) == 16)
    assert {v.action for v in hermes.replayed_verdicts()} == {"allow"}


def test_parallel_tool_calls_of_a_turn_are_each_judged(hermes: Hermes, tools: Tools) -> None:
    # Hermes runs a turn's independent tool calls on worker threads.
    session = f"sess-{uuid.uuid4().hex[:8]}"
    paths = [f"/src/mod{i}.py" for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        seen = list(
            pool.map(
                lambda path: hermes.call("lf_read", {"path": path}, session=session, task="t"),
                paths,
            )
        )
    assert seen == [json.dumps({"content": f"contents of {path}"}) for path in paths]
    hermes.wait_events(lambda events: len(events) == 12)
    assert sorted(e["seq"] for e in hermes.events) == list(range(12))
    assert [v.action for v in hermes.replayed_verdicts()] == ["allow"] * 6


def test_a_loop_after_compaction_aborts_the_run_until_it_ends(hermes: Hermes, tools: Tools) -> None:
    session, task = f"sess-{uuid.uuid4().hex[:8]}", "task-1"
    args = {"command": "cargo test"}
    history = [{"role": "user", "content": "fix the tests"}] + [{"role": "tool"}] * 6

    def model_request(messages: list[dict[str, Any]], session_id: str = session) -> None:
        hermes.hook(
            "pre_api_request", task_id=task, session_id=session_id, conversation_history=messages
        )

    model_request(history)
    hermes.call("lf_read", {"path": "/src/lib.rs"}, session=session, task=task)
    # Hermes compacts and continues in a child session (the id rotates mid-run).
    child = f"{session}-child"
    model_request(history[:2], session_id=child)
    seen = [hermes.call("lf_exec", args, session=child, task=task) for _ in range(3)]
    assert seen == [STUCK] * 3
    hermes.wait_events(lambda events: any(e["type"] == "compaction" for e in events))
    assert all(e["session_key"] == session for e in hermes.events)  # one loopfuse session

    deadline = time.monotonic() + 30
    while (
        blocked := hermes.call("lf_read", {"path": "/x"}, session=child, task=task)
    ) and "error" not in json.loads(blocked):
        assert time.monotonic() < deadline, "no abort"
        time.sleep(0.1)
    message = json.loads(blocked)["error"]
    assert "after auto-compaction" in message
    assert json.loads(hermes.call("lf_exec", args, session=child, task=task)) == {"error": message}

    hermes.hook("on_session_end", session_id=child, task_id=task, completed=True)
    hermes.wait_events(lambda events: events[-1]["type"] == "run_ended")
    assert hermes.call("lf_read", {"path": "/y"}, session=child, task="task-2") != blocked


def test_an_in_place_compaction_is_seen_at_the_next_model_request(hermes: Hermes) -> None:
    session = f"sess-{uuid.uuid4().hex[:8]}"
    history: list[dict[str, Any]] = [{"role": "user", "content": "go"}, {"role": "tool"}] * 4
    for messages in (history, [*history, {"role": "tool"}], history[:3]):  # grows, then shrinks
        hermes.hook(
            "pre_api_request", task_id="t", session_id=session, conversation_history=messages
        )
        hermes.call("lf_read", {"path": f"/{len(messages)}"}, session=session, task="t")
    hermes.wait_events(lambda events: len(events) == 7)
    assert [e["type"] for e in hermes.events].count("compaction") == 1
    assert hermes.events[4]["type"] == "compaction"  # after two calls and their results


def test_hermes_in_place_compaction_is_seen_though_the_history_grows(hermes: Hermes) -> None:
    """Hermes 0.19 compacts in place: same session id, the middle turns replaced by a
    ``[CONTEXT COMPACTION — REFERENCE ONLY]`` message, and the history may come back
    longer than before (kept head + summary + tail + the new turn)."""
    session = f"sess-{uuid.uuid4().hex[:8]}"
    head = [{"role": "system", "content": "you are hermes"}, {"role": "user", "content": "go"}]
    turns = [
        {"role": "assistant", "content": None, "tool_call_id": None},
        {"role": "tool", "content": "out 1", "tool_call_id": "c1"},
        {"role": "tool", "content": "out 2", "tool_call_id": "c2"},
    ]
    compacted = [
        *head,
        {
            "role": "user",
            "content": "[CONTEXT COMPACTION — REFERENCE ONLY] Earlier turns were compacted ...",
        },
        *turns[1:],
        *turns,
    ]
    for messages in (
        [*head, *turns],
        [*head, *turns, turns[1]],
        compacted,
        [*compacted, turns[2]],
    ):  # grows, compacts longer, grows again
        hermes.hook(
            "pre_api_request",
            task_id="t",
            session_id=session,
            conversation_history=[dict(m, api_content="stamp") for m in messages],
        )
        hermes.call("lf_read", {"path": f"/{len(messages)}"}, session=session, task="t")
    hermes.wait_events(lambda events: len(events) == 9)
    types = [e["type"] for e in hermes.events]
    assert types.count("compaction") == 1 and types[4] == "compaction"


@pytest.mark.parametrize(("policy", "runs"), [("open", True), ("closed", False)])
def test_without_a_worker_the_fail_policy_decides_within_the_timeout(
    hermes_home: Path, tools: Tools, kafka_bootstrap: str, policy: str, runs: bool
) -> None:
    # The topics exist (a worker made them once) but no worker reads them now.
    topics = topic_settings(unique_topics("hermes-down"))
    _create_topics(kafka_bootstrap, [topics["topic_tool_calls"], topics["topic_verdicts"]])
    timeout = 1.0
    agent = Hermes(
        hermes_home,
        {
            "bootstrap_servers": kafka_bootstrap,
            "gateway_timeout": timeout,
            "fail_policy": policy,
            **topics,
        },
    )
    try:
        agent.call("lf_read", {"path": "/warm-up"}, session="down", task="t")  # client start
        before = tools.runs.get("lf_read", 0)
        started = time.monotonic()
        seen = agent.call("lf_read", {"path": "/etc/hosts"}, session="down", task="t")
        elapsed = time.monotonic() - started
    finally:
        agent.plugin.close()
    assert timeout * 0.9 < elapsed < timeout + 1.0
    if runs:
        assert seen == json.dumps({"content": "contents of /etc/hosts"})
        assert tools.runs["lf_read"] == before + 1
    else:
        message = TIMEOUT_MESSAGE.format(what="blocked", policy="closed")
        assert json.loads(seen) == {"error": message}
        assert tools.runs.get("lf_read", 0) == before


def test_an_unreachable_broker_is_a_fail_closed_block_not_a_crash(
    hermes_home: Path, tools: Tools
) -> None:
    agent = Hermes(
        hermes_home,
        {"bootstrap_servers": "127.0.0.1:1", "gateway_timeout": 1.0, "fail_policy": "closed"},
    )
    try:
        started = time.monotonic()
        seen = agent.call("lf_read", {"path": "/a"}, session="nobroker", task="t")
        assert time.monotonic() - started < 1.5
    finally:
        agent.plugin.close()
    assert json.loads(seen) == {"error": TIMEOUT_MESSAGE.format(what="blocked", policy="closed")}


def _create_topics(bootstrap: str, names: list[str]) -> None:
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, 1, 1) for name in names])
        finally:
            await admin.close()

    asyncio.run(create())


@pytest.fixture(scope="module")
def secured_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """A secured Apache Kafka node (TLS, SASL_SSL with SCRAM-SHA-512, ACLs per role, as
    ``loopfuse broker --kafka --secure`` makes it) and a worker on it as user ``worker``."""
    from loopfuse.streams.local.kafka_broker import ApacheKafka

    tmp = tmp_path_factory.mktemp("hermes-secured")
    with ApacheKafka(secure=True, data_dir=tmp / "kafka", log_path=tmp / "kafka.log") as kafka:
        security = kafka.security
        assert security is not None
        security.grant_roles(kafka.bootstrap)
        variables = {
            key.removeprefix("LOOPFUSE_").lower(): value
            for key, value in security.client_env("worker").items()
        }
        settings = worker_settings(
            kafka.bootstrap, "kafka", {}, "loopfuse", tmp / "data", config_file=CONFIG, **variables
        )
        process = WorkerProcess(settings, log_path=tmp / "worker.log").start()
        try:
            process.wait_ready(120)
            yield kafka.bootstrap, security
        finally:
            process.stop()


def test_over_sasl_ssl_as_a_gateway_a_loop_is_blocked_and_a_wrong_password_named_once(
    hermes_home: Path,
    tools: Tools,
    secured_worker: tuple[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The plugin's Kafka settings in Hermes' config (as the gateway user, with only a
    gateway's ACLs): a loop is warned then blocked over SASL_SSL. With a wrong password
    every call gets the fail policy and the log says once which variable to fix, never
    the password."""
    bootstrap, security = secured_worker
    kafka = {
        key.removeprefix("LOOPFUSE_").lower(): value
        for key, value in security.client_env("gateway").items()
    }
    entry = {"bootstrap_servers": bootstrap, "gateway_timeout": 20, **kafka}
    agent = Hermes(hermes_home, entry)
    before = tools.runs.get("lf_exec", 0)
    session = f"secure-{uuid.uuid4().hex[:8]}"
    try:
        seen = [
            agent.call("lf_exec", {"command": "make"}, session=session, task="t") for _ in range(7)
        ]
    finally:
        agent.plugin.close()
    assert seen[:3] == [STUCK] * 3
    assert all("loopfuse_warning" in json.loads(s) for s in seen[3:5])
    assert all(json.loads(s)["error"].startswith("CRITICAL: Called lf_exec") for s in seen[5:])
    assert tools.runs["lf_exec"] - before == 5

    wrong = f"hunter2-{uuid.uuid4().hex}"
    agent = Hermes(hermes_home, {**entry, "sasl_password": wrong, "gateway_timeout": 5})
    try:
        with caplog.at_level("ERROR"):
            seen = [
                agent.call("lf_exec", {"command": "make"}, session=f"{session}-2", task="t")
                for _ in range(3)
            ]
    finally:
        agent.plugin.close()
    assert seen == [STUCK] * 3  # fail policy "open": the tool ran each time
    said = [r.getMessage() for r in caplog.records if "SASL credentials" in r.getMessage()]
    assert said == [
        "loopfuse gateway client: the broker refused the SASL credentials of user 'gateway' "
        "(LOOPFUSE_SASL_USERNAME / LOOPFUSE_SASL_PASSWORD); calls get the fail policy until "
        "it is fixed"
    ]
    assert wrong not in caplog.text
