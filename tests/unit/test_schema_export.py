"""The exported JSON Schema files must match the pydantic models they came from."""

import json

import pytest

from loopfuse.schemas.export import SCHEMA_DIR, render, schemas


@pytest.mark.parametrize("name", sorted(schemas()))
def test_exported_schema_matches_model(name: str) -> None:
    on_disk = (SCHEMA_DIR / name).read_text(encoding="utf-8")
    assert on_disk == render(schemas()[name]), (
        f"{name} drifted: run python -m loopfuse.schemas.export"
    )


def test_input_event_schema_lists_every_event_type() -> None:
    document = json.loads((SCHEMA_DIR / "input-event.schema.json").read_text())
    mapping = document["discriminator"]["mapping"]
    assert set(mapping) == {"tool_call", "tool_result", "compaction", "run_ended"}
