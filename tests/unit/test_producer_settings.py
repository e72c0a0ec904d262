"""What loopfuse's producers ask of Kafka: ``acks=all`` and idempotence, so a write is
acknowledged only once ``min.insync.replicas`` hold it and a resend after a leader's
crash is not written twice (the embedded broker, which has no idempotent producer, is
spared). Read off the producer Faust would start; nothing connects."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopfuse.streams.settings import Settings
from loopfuse.streams.worker.app import create_app
from loopfuse.streams.worker.topics import topic_configs


def _producer_settings(tmp_path: Path, embedded: bool) -> dict[str, object]:
    settings = Settings(
        bootstrap_servers="127.0.0.1:1", data_dir=tmp_path, embedded_broker=embedded
    )
    producer = create_app(settings).producer
    return {
        **producer._settings_default(),  # type: ignore[attr-defined]
        **producer._settings_extra(),  # type: ignore[attr-defined]
    }


def test_the_worker_produces_with_acks_all_and_idempotence_on_kafka(tmp_path: Path) -> None:
    produced = _producer_settings(tmp_path, embedded=False)
    assert produced["acks"] in (-1, "all")
    assert produced["enable_idempotence"] is True


def test_the_worker_is_not_idempotent_on_the_embedded_broker(tmp_path: Path) -> None:
    assert not _producer_settings(tmp_path, embedded=True).get("enable_idempotence")


@pytest.mark.parametrize(("min_insync", "expected"), [(1, None), (2, "2")])
def test_created_topics_get_min_insync_replicas_only_on_a_cluster(
    min_insync: int, expected: str | None
) -> None:
    settings = Settings(replication_factor=3 if expected else 1, min_insync_replicas=min_insync)
    changelog = f"{settings.app_id}-sessions-changelog"
    assert topic_configs(settings, settings.topic_verdicts).get("min.insync.replicas") == expected
    assert topic_configs(settings, changelog) == {
        "cleanup.policy": "compact",
        **({"min.insync.replicas": expected} if expected else {}),
    }
