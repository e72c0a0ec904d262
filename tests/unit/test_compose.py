"""Static checks of the container deployment: docker-compose.yml, Dockerfile, infra/.

No Docker engine needed: the files are parsed and compared with the code they
configure (``loopfuse.streams.settings.Settings``, the topic and changelog names of
``loopfuse.streams.worker.app``, ``loopfuse.schemas.config.load_config``), so a renamed setting, a topic
list that drifts from the workers' settings or a public port fails here rather
than at ``docker compose up``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from loopfuse.schemas.config import load_config, parse_config
from loopfuse.streams.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PREFIX = "LOOPFUSE_"
WORKERS = ("worker-1", "worker-2")


# -- helpers --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))  # resolves anchors and <<
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def env_of(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as strings (compose accepts a mapping or KEY=VALUE list)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends in a line continuation"
    out = []
    for line in logical:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in dockerfile_instructions():
        if word == "ENV":
            for token in shlex.split(rest):
                key, sep, value = token.partition("=")
                assert sep, f"use ENV KEY=VALUE form: {rest!r}"
                env[key] = value
    return env


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """``Settings()`` as the container builds it: only from these LOOPFUSE_* variables."""
    for key in list(os.environ):
        if key.upper().startswith(PREFIX):
            monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith(PREFIX):
            monkeypatch.setenv(key, value)
    return Settings()


def worker_env(services: dict[str, dict[str, Any]], name: str) -> dict[str, str]:
    """What the worker process sees: the image's ENV overlaid by the service's."""
    return {**dockerfile_env(), **env_of(services[name])}


def host_path(mount: str) -> tuple[Path, str, list[str]]:
    source, target, *options = mount.split(":")
    return (ROOT / source).resolve(), target, options


def bind_mounts(service: dict[str, Any]) -> list[tuple[Path, str, list[str]]]:
    return [host_path(v) for v in service.get("volumes") or [] if str(v).startswith("./")]


# -- services -------------------------------------------------------------------------


def test_services_exist(services: dict[str, dict[str, Any]]) -> None:
    assert {"kafka", "create-topics", *WORKERS, "prometheus", "simulator"} <= set(services)
    assert services["simulator"].get("profiles") == ["simulator"]
    for name in ("kafka", "create-topics", *WORKERS, "prometheus"):
        assert not services[name].get("profiles"), f"{name} must start by default"


def test_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        image = service.get("image")
        assert image, f"{name}: give every service an image (built ones get a local tag)"
        repo, _, tag = image.rpartition(":")
        assert repo and "/" not in tag, f"{name}: image {image!r} has no tag"
        assert tag != "latest", f"{name}: image {image!r} is not pinned"
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert re.fullmatch(r"apache/kafka:[34]\.\d+\.\d+", services["kafka"]["image"])
    assert services["create-topics"]["image"] == services["kafka"]["image"]
    assert re.fullmatch(r"prom/prometheus:v\d+\.\d+\.\d+", services["prometheus"]["image"])
    for name in (*WORKERS, "simulator"):
        assert services[name]["build"]["context"] == "."
        assert services[name]["image"] == services["worker-1"]["image"]


def test_kafka_is_single_node_kraft_with_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    kafka = services["kafka"]
    env = env_of(kafka)
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "ZOOKEEPER" not in " ".join(env)
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    for key in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_DEFAULT_REPLICATION_FACTOR"):
        assert env[key] == "1"
    assert kafka["healthcheck"]["test"]
    # the data dir is a named volume
    log_dir = env["KAFKA_LOG_DIRS"]
    assert any(
        str(v).endswith(f":{log_dir}") and not str(v).startswith(".") for v in kafka["volumes"]
    )


def test_startup_order(services: dict[str, dict[str, Any]]) -> None:
    assert services["create-topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    for name in (*WORKERS, "simulator"):
        depends = services[name]["depends_on"]
        assert depends["create-topics"]["condition"] == "service_completed_successfully", name


# -- LOOPFUSE_* settings --------------------------------------------------------------


def _loopfuse_vars(node: Any, where: str) -> list[tuple[str, str]]:
    """Every LOOPFUSE_* key of an environment mapping/list anywhere in the document."""
    found: list[tuple[str, str]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and key.startswith(PREFIX):
                found.append((key, where))
            found += _loopfuse_vars(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            if isinstance(item, str) and re.match(rf"{PREFIX}[A-Z0-9_]+=", item):
                found.append((item.split("=", 1)[0], where))
            found += _loopfuse_vars(item, f"{where}[{i}]")
    return found


def test_every_loopfuse_variable_is_a_setting(compose: dict[str, Any]) -> None:
    # pydantic-settings silently ignores unknown LOOPFUSE_* variables: catch typos here.
    fields = set(Settings.model_fields)
    names = _loopfuse_vars(compose, "compose") + [(k, "Dockerfile ENV") for k in dockerfile_env()]
    # also the commented-out examples, so they stay copy-pasteable
    names += [
        (m, "docker-compose.yml comment")
        for m in re.findall(r"#\s*(LOOPFUSE_[A-Z0-9_]+)\s*:", COMPOSE.read_text(encoding="utf-8"))
    ]
    assert names
    unknown = [
        (name, where)
        for name, where in names
        if name.startswith(PREFIX) and name[len(PREFIX) :].lower() not in fields
    ]
    assert not unknown, f"not fields of loopfuse.streams.settings.Settings: {unknown}"


@pytest.mark.parametrize("name", [*WORKERS, "simulator"])
def test_settings_validate(
    services: dict[str, dict[str, Any]], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings_from(worker_env(services, name), monkeypatch)  # raises on a bad value


def test_workers_share_group_and_layout(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = (settings_from(worker_env(services, n), monkeypatch) for n in WORKERS)
    assert one.app_id == two.app_id, "same LOOPFUSE_APP_ID: one consumer group"
    assert one.partitions == two.partitions
    assert one.input_topics == two.input_topics and one.output_topics == two.output_topics
    for settings in (one, two):
        assert settings.bootstrap_servers == "kafka:9092"
        assert settings.store == "rocksdb://"
        assert settings.web_host == "0.0.0.0"  # scraped across the compose network
        assert settings.config_file is not None


def test_workers_keep_state_on_their_own_named_volumes(
    services: dict[str, dict[str, Any]], compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = set()
    for name in WORKERS:
        data_dir = str(settings_from(worker_env(services, name), monkeypatch).data_dir)
        volumes = [str(v) for v in services[name]["volumes"]]
        named = [v.split(":")[0] for v in volumes if v.split(":")[1] == data_dir]
        assert len(named) == 1 and not named[0].startswith("."), f"{name}: {volumes}"
        assert named[0] in compose["volumes"]
        seen.add(named[0])
    assert len(seen) == len(WORKERS), "each worker needs its own rocksdb volume"


def test_simulator_matches_the_topic_layout(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = settings_from(worker_env(services, "worker-1"), monkeypatch)
    sim_service = services["simulator"]
    sim = settings_from(worker_env(services, "simulator"), monkeypatch)
    # The demo's own worker inherits this env and checks the existing topics' size.
    assert sim.partitions == worker.partitions
    # The demo and the gateway client use the default topic names (Settings.model_construct()).
    defaults = Settings.model_construct()
    assert worker.input_topics == defaults.input_topics
    assert worker.output_topics == defaults.output_topics
    command = sim_service["command"]
    assert command[0] == "demo" and "--no-tui" in command
    assert command[command.index("--bootstrap") + 1] == worker.bootstrap_servers


# -- topics ---------------------------------------------------------------------------


def test_create_topics_matches_worker_settings(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopfuse.streams.worker.topics import changelog_topic

    settings = settings_from(worker_env(services, "worker-1"), monkeypatch)
    env = env_of(services["create-topics"])
    topics = env["TOPICS"].split()
    assert len(topics) == len(set(topics)) == 6
    assert set(topics) == {*settings.input_topics, *settings.output_topics}
    assert env["COMPACTED_TOPICS"].split() == [changelog_topic(settings)]
    assert int(env["PARTITIONS"]) == settings.partitions
    assert int(env["REPLICATION_FACTOR"]) == settings.replication_factor
    assert tuple(env["REPLY_TOPICS"].split()) == settings.reply_topic_names
    assert int(env["REPLY_PARTITIONS"]) == settings.reply_partitions
    assert env["BOOTSTRAP_SERVER"] == settings.bootstrap_servers
    # the script it runs is the one in the repo
    entrypoint = services["create-topics"]["entrypoint"]
    ((script, target, options),) = bind_mounts(services["create-topics"])
    assert script == ROOT / "infra" / "create-topics.sh" and script.is_file()
    assert target in entrypoint and "ro" in options


def _fake_kafka_topics(tmp_path: Path, count: int) -> Path:
    fake = tmp_path / "kafka-topics.sh"
    fake.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            echo "$*" >> "{tmp_path}/calls"
            case "$*" in
              *--describe*)
                topic=$(echo "$*" | sed 's/.*--topic \\([^ ]*\\).*/\\1/')
                printf 'Topic: %s\\tTopicId: x\\tPartitionCount: {count}\\tReplicationFactor: 1\\tConfigs: \\n' "$topic"
                printf '\\tTopic: %s\\tPartition: 0\\tLeader: 1\\tReplicas: 1\\tIsr: 1\\n' "$topic" ;;
            esac
            """
        )
    )
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize("count", [8, 4])
def test_create_topics_script(
    services: dict[str, dict[str, Any]], tmp_path: Path, count: int
) -> None:
    env = env_of(services["create-topics"])
    fake = _fake_kafka_topics(tmp_path, count)
    run = subprocess.run(
        ["sh", str(ROOT / "infra" / "create-topics.sh")],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env, "KAFKA_TOPICS": str(fake)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    calls = (tmp_path / "calls").read_text().splitlines()
    creates = [c for c in calls if "--create" in c]
    replies = env["REPLY_TOPICS"].split()
    topics = env["TOPICS"].split() + env["COMPACTED_TOPICS"].split() + replies
    assert len(creates) == len(topics)
    for topic, call in zip(topics, creates, strict=True):
        args = call.split()
        assert args[args.index("--topic") + 1] == topic
        assert "--if-not-exists" in args
        partitions = env["REPLY_PARTITIONS"] if topic in replies else env["PARTITIONS"]
        assert args[args.index("--partitions") + 1] == partitions
        assert args[args.index("--bootstrap-server") + 1] == env["BOOTSTRAP_SERVER"]
        compacted = topic in env["COMPACTED_TOPICS"].split()
        assert ("cleanup.policy=compact" in args) == compacted
        assert ("retention.ms=3600000" in args) == (topic in replies)
    if str(count) == env["PARTITIONS"]:
        assert run.returncode == 0, run.stderr
    else:
        assert run.returncode == 1
        assert f"has {count} partitions, expected {env['PARTITIONS']}" in run.stderr


# -- config file ----------------------------------------------------------------------


def test_mounted_config_exists_and_loads(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in WORKERS:
        settings = settings_from(worker_env(services, name), monkeypatch)
        mounts = {target: (src, opts) for src, target, opts in bind_mounts(services[name])}
        assert str(settings.config_file) in mounts, f"{name}: LOOPFUSE_CONFIG_FILE is not mounted"
        source, options = mounts[str(settings.config_file)]
        assert source == ROOT / "infra" / "loop-detection.json5" and source.is_file()
        assert "ro" in options, f"{name}: mount the config read-only"
        load_config(source)  # raises ConfigError naming the key path


def test_config_agrees_with_the_simulator() -> None:
    """The simulator expects the demo config's verdicts; the compose workers answer too."""
    from loopfuse.streams.engine.config import ConfigResolver
    from loopfuse.streams.local.simulator import DEMO_CONFIG, KINDS

    ours = ConfigResolver(load_config(ROOT / "infra" / "loop-detection.json5"))
    demo = ConfigResolver(parse_config(DEMO_CONFIG))
    assert (ours.enforce, ours.send_tools) == (demo.enforce, demo.send_tools)
    for kind in KINDS:
        agent = f"agent-{kind}"  # streams/local/simulator.py names its agents so
        assert ours.resolve(agent) == demo.resolve(agent), agent


# -- prometheus -----------------------------------------------------------------------


def test_prometheus_scrapes_both_workers(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    mounts = {target: src for src, target, _ in bind_mounts(services["prometheus"])}
    config_path = mounts["/etc/prometheus/prometheus.yml"]
    assert config_path == ROOT / "infra" / "prometheus.yml"
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    targets = {
        (job.get("metrics_path", "/metrics"), target)
        for job in config["scrape_configs"]
        for group in job.get("static_configs", [])
        for target in group["targets"]
    }
    for name in WORKERS:
        port = settings_from(worker_env(services, name), monkeypatch).web_port
        assert ("/metrics", f"{name}:{port}") in targets
    for rule_file in config.get("rule_files", []):
        assert rule_file in mounts, f"rule file {rule_file} is not mounted"
        rules = yaml.safe_load(mounts[rule_file].read_text(encoding="utf-8"))
        assert all(rule["expr"] for group in rules["groups"] for rule in group["rules"])


# -- network exposure -----------------------------------------------------------------


def test_host_ports_are_loopback_only(services: dict[str, dict[str, Any]]) -> None:
    published = 0
    for name, service in services.items():
        for port in service.get("ports") or []:
            published += 1
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
            else:
                assert str(port).startswith("127.0.0.1:"), f"{name}: {port!r}"
    assert published
    assert "ports" in services["prometheus"]


def test_worker_healthcheck_uses_ready(services: dict[str, dict[str, Any]]) -> None:
    for name in WORKERS:
        test = services[name]["healthcheck"]["test"]
        assert "/ready" in " ".join(test) and "LOOPFUSE_WEB_PORT" in " ".join(test)


# -- Dockerfile -----------------------------------------------------------------------


def test_dockerfile_runs_loopfuse_with_rocksdb() -> None:
    instructions = dockerfile_instructions()
    by_word: dict[str, list[str]] = {}
    for word, rest in instructions:
        by_word.setdefault(word, []).append(rest)
    assert all(f.split()[0].startswith("python:3.11-slim") for f in by_word["FROM"])
    assert json.loads(by_word["ENTRYPOINT"][-1]) == ["loopfuse"]
    assert json.loads(by_word["CMD"][-1]) == ["worker"]
    installs = [r for r in by_word["RUN"] if re.search(r"\bpip (install|wheel)\b", r)]
    assert installs and all("--no-cache-dir" in r for r in installs)
    assert any("[worker]" in r for r in installs)
    assert not any(re.search(r"\[[^\]]*\b(test|embedded)\b", r) for r in installs)
    user = by_word["USER"][-1]
    assert user not in {"root", "0"} and not user.startswith("0:")
    data_dir = dockerfile_env()["LOOPFUSE_DATA_DIR"]
    assert data_dir in " ".join(by_word["VOLUME"])
    # the image keeps the loopback default; only the compose file opens it up
    assert "LOOPFUSE_WEB_HOST" not in dockerfile_env()


def test_dockerfile_builds_the_native_judge_beside_its_engine() -> None:
    """The image carries the native judge: its wheel built in the build stage from the
    crate and the engine modules it mirrors (its build.rs stamps their digest, and the
    worker takes the wheel only beside those very modules), and installed with the
    loopfuse wheel of the same context. (No Docker engine runs here: the build itself
    is not run by the tests.)"""
    from loopfuse.streams.engine.native import MIRRORED

    instructions = dockerfile_instructions()
    stages = [i for i, (word, _) in enumerate(instructions) if word == "FROM"]
    assert len(stages) == 2
    build, final = instructions[: stages[1]], instructions[stages[1] :]
    wheel = next(i for i, (word, rest) in enumerate(build) if word == "RUN" and "pip wheel" in rest)
    copied = {rest.split()[0] for word, rest in build[:wheel] if word == "COPY"}
    assert "native" in copied
    for module in MIRRORED:  # what build.rs reads, at the paths it reads them from
        assert any(module == source or module.startswith(source + "/") for source in copied), module
    assert "./native" in build[wheel][1].split()
    assert any(word == "RUN" and "rustup" in rest for word, rest in build)
    installs = [rest for word, rest in final if word == "RUN" and "pip install" in rest]
    assert any("loopfuse-native" in rest.split() for rest in installs)
    ignored = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    assert "native/target" in ignored  # the crate's build folder stays out of the context


def test_dockerignore_keeps_what_the_build_copies() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert {".git", ".venv"} <= set(patterns)
    for word, rest in dockerfile_instructions():
        if word != "COPY" or "--from=" in rest:
            continue
        for source in rest.split()[:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repo"
            assert not any(fnmatch.fnmatch(source, p) for p in patterns), (
                f"COPY {source} is excluded by .dockerignore"
            )


# -- grafana --------------------------------------------------------------------------

GRAFANA = ROOT / "infra" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "loopfuse.json"


_SUFFIXES = {
    "Counter": ("_total",),
    "Gauge": ("",),
    "Histogram": ("_bucket", "_sum", "_count"),
    "Summary": ("_sum", "_count"),
}


def exported_metrics() -> dict[str, frozenset[str]]:
    """Series name -> label names of every Prometheus metric defined under streams/."""
    import ast

    found: dict[str, frozenset[str]] = {}
    for path in (ROOT / "streams").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            kind = getattr(node.func, "id", getattr(node.func, "attr", None))
            if kind not in _SUFFIXES or not node.args:
                continue
            name = node.args[0]
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                continue
            labels_node = (
                node.args[2]
                if len(node.args) > 2
                else next((k.value for k in node.keywords if k.arg == "labelnames"), None)
            )
            labels = frozenset(
                e.value for e in getattr(labels_node, "elts", []) if isinstance(e, ast.Constant)
            )
            base = name.value.removesuffix("_total")
            for suffix in _SUFFIXES[kind]:
                found[base + suffix] = labels
    return found


def promql_uses(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, labels it is filtered or grouped by) for each loopfuse_* selector in expr."""
    uses = []
    for match in re.finditer(r"(loopfuse_[a-z_]+)(\{[^}]*\})?", expr):
        labels = set(re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=)", match.group(2) or ""))
        uses.append((match.group(1), labels))
    grouped = {
        label.strip()
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
        for label in group.split(",")
        if label.strip()
    }
    # "by (...)" applies to the aggregated selectors; "instance" and "job" come from the scrape
    grouped -= {"instance", "job"}
    return [(metric, labels | grouped) for metric, labels in uses]


def dashboard_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def test_grafana_is_provisioned_with_the_dashboard(
    services: dict[str, dict[str, Any]], compose: dict[str, Any]
) -> None:
    grafana = services["grafana"]
    assert re.fullmatch(r"grafana/grafana:\d+\.\d+\.\d+", grafana["image"])
    assert grafana["ports"] == ["127.0.0.1:3000:3000"]
    mounts = {target: (source, options) for source, target, options in bind_mounts(grafana)}
    provisioning, options = mounts["/etc/grafana/provisioning"]
    assert provisioning == GRAFANA / "provisioning" and "ro" in options
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    assert "127.0.0.1:9090:9090" in services["prometheus"]["ports"]  # the port it listens on
    providers = yaml.safe_load((provisioning / "dashboards" / "loopfuse.yml").read_text())
    (provider,) = providers["providers"]
    dashboards_dir, options = mounts[provider["options"]["path"]]
    assert dashboards_dir == DASHBOARD.parent and "ro" in options and DASHBOARD.is_file()
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
        assert panel["targets"], panel["title"]
    assert "grafana-data" in compose["volumes"]


def test_dashboard_queries_only_metrics_the_workers_export() -> None:
    exported = exported_metrics()
    assert "loopfuse_events_total" in exported  # the scan finds the worker's metrics
    problems = []
    for title, expr in dashboard_exprs():
        uses = promql_uses(expr)
        if not uses:
            problems.append(f"{title}: no loopfuse metric in {expr!r}")
        for metric, labels in uses:
            if metric not in exported:
                problems.append(f"{title}: {metric} is not exported")
            elif not labels <= exported[metric]:
                problems.append(
                    f"{title}: {metric} has no label {sorted(labels - exported[metric])}"
                )
    assert not problems, problems


def test_dashboard_covers_the_operations_view() -> None:
    used = {
        (metric, frozenset(labels))
        for _, e in dashboard_exprs()
        for metric, labels in promql_uses(e)
    }
    metrics = {metric for metric, _ in used}
    assert {
        "loopfuse_events_total",
        "loopfuse_verdicts_total",
        "loopfuse_loop_events_total",
        "loopfuse_dead_letters_total",
        "loopfuse_consumer_lag",
        "loopfuse_input_behind_seconds",
    } <= metrics
    assert ("loopfuse_verdicts_total", frozenset({"action"})) in used
    assert ("loopfuse_loop_events_total", frozenset({"detector"})) in used


def test_alert_rules_query_only_exported_metrics() -> None:
    exported = exported_metrics()
    rules = yaml.safe_load((ROOT / "infra" / "prometheus-rules.yml").read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            for metric, labels in promql_uses(rule["expr"]):
                assert metric in exported, (rule["alert"], metric)
                assert labels <= exported[metric], (rule["alert"], metric, labels)
