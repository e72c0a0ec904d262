"""The Apache Kafka component's files agree with each other: one version pin (the Maven
descriptor) and one set of broker settings (infra/kafka/broker.properties) for the
launcher the suites run on and for docker-compose.yml's kafka service."""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from loopfuse.streams.local.kafka_broker import (
    INFRA,
    broker_settings,
    kafka_version,
    new_cluster_id,
)

ROOT = Path(__file__).resolve().parents[2]
POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


@pytest.fixture(scope="module")
def compose_services() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text("utf-8"))
    services: dict[str, Any] = data["services"]
    return services


def test_the_pom_pins_one_kafka_version_that_its_dependency_uses() -> None:
    pom = ET.parse(INFRA / "pom.xml").getroot()
    pinned = pom.findtext("m:properties/m:kafka.version", namespaces=POM_NS)
    assert pinned == kafka_version()
    kafka = [
        d
        for d in pom.iterfind("m:dependencies/m:dependency", POM_NS)
        if d.findtext("m:artifactId", namespaces=POM_NS) == "kafka_2.13"
    ]
    assert [d.findtext("m:version", namespaces=POM_NS) for d in kafka] == ["${kafka.version}"]


def test_compose_runs_the_kafka_version_the_suites_run_on(
    compose_services: dict[str, Any],
) -> None:
    for name in ("kafka", "create-topics"):
        assert compose_services[name]["image"] == f"apache/kafka:{kafka_version()}", name


def test_compose_gives_its_broker_the_settings_the_launcher_gives_the_suites_broker(
    compose_services: dict[str, Any],
) -> None:
    env = {str(k): str(v) for k, v in compose_services["kafka"]["environment"].items()}
    settings = broker_settings()
    assert settings, "infra/kafka/broker.properties has no settings"
    # The apache/kafka image turns KAFKA_A_B into the property a.b.
    as_env = {"KAFKA_" + key.upper().replace(".", "_"): value for key, value in settings.items()}
    assert {k: env.get(k) for k in as_env} == as_env
    # and sets nothing of that kind the launcher does not (identity and listeners aside)
    node_own = {
        "KAFKA_NODE_ID",
        "KAFKA_PROCESS_ROLES",
        "KAFKA_CONTROLLER_QUORUM_VOTERS",
        "KAFKA_CONTROLLER_LISTENER_NAMES",
        "KAFKA_LISTENERS",
        "KAFKA_ADVERTISED_LISTENERS",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
        "KAFKA_INTER_BROKER_LISTENER_NAME",
        "KAFKA_LOG_DIRS",
    }
    extra = {k for k in env if k.startswith("KAFKA_")} - node_own - set(as_env)
    assert not extra, f"compose sets broker settings the suites' broker lacks: {sorted(extra)}"


def test_a_cluster_id_is_kraft_s_form_and_never_reads_as_an_option() -> None:
    ids = {new_cluster_id() for _ in range(2000)}  # ~1 in 64 would start with "-"
    assert len(ids) == 2000
    for cluster_id in ids:
        assert len(cluster_id) == 22 and "=" not in cluster_id
        assert not cluster_id.startswith("-")
        assert set(cluster_id) <= set(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        )


def test_the_readmes_acl_commands_are_what_the_acl_script_runs() -> None:
    """README: Running in production lists each role's kafka-acls commands; they must be
    the script's (a dry run for the default names), so the docs cannot drift from it."""
    readme = (ROOT / "README.md").read_text()
    listed = [line for line in readme.splitlines() if line.startswith("kafka-acls.sh ")]
    ran: list[str] = []
    for role in (
        ["worker", "User:worker"],
        ["gateway", "User:gateway", "loopfuse.replies"],
        ["tenant", "User:gateway-acme", "acme"],
        ["auditor", "User:auditor"],
        ["whatif", "User:whatif"],
    ):
        env = {
            "PATH": os.environ["PATH"],
            "BOOTSTRAP_SERVER": "$BOOTSTRAP",
            "COMMAND_CONFIG": "admin.properties",
            "DRY_RUN": "1",
        }
        done = subprocess.run(
            ["sh", str(ROOT / "infra" / "kafka" / "kafka-acls.sh"), *role],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        ran += done.stdout.splitlines()
    assert len(ran) == 14
    assert listed == ran


def test_the_acl_script_refuses_what_is_not_a_role_or_a_principal() -> None:
    script = str(ROOT / "infra" / "kafka" / "kafka-acls.sh")
    env = {"PATH": os.environ["PATH"], "BOOTSTRAP_SERVER": "b:1", "DRY_RUN": "1"}
    for args in (
        ["admin", "User:x"],
        ["worker", "worker"],
        ["gateway", "User:g"],
        ["worker"],
        ["tenant", "User:t"],
        ["tenant", "User:t", "a.b"],
        ["tenant", "User:t", ""],
        ["whatif", "User:w", "extra"],
    ):
        done = subprocess.run(["sh", script, *args], env=env, capture_output=True, text=True)
        assert done.returncode == 2 and done.stdout == "", args
