"""Export the wire models and the config model as JSON Schema files beside this module.

Gateways in other languages (OpenClaw's is TypeScript) validate against these files.
Regenerate with ``python -m loopfuse.schemas.export``; tests/unit/test_schema_export.py fails
when a file drifts from the models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loopfuse.schemas.config import DetectionConfigFile
from loopfuse.schemas.event_schema import input_event_adapter
from loopfuse.schemas.events import DeadLetter, LoopEvent, Verdict

SCHEMA_DIR = Path(__file__).parent


def schemas() -> dict[str, dict[str, Any]]:
    """File name -> JSON Schema document."""
    documents: dict[str, dict[str, Any]] = {
        "input-event.schema.json": input_event_adapter.json_schema(),
        "verdict.schema.json": Verdict.model_json_schema(),
        "loop-event.schema.json": LoopEvent.model_json_schema(),
        "dead-letter.schema.json": DeadLetter.model_json_schema(),
        "loop-detection-config.schema.json": DetectionConfigFile.model_json_schema(),
    }
    for name, document in documents.items():
        document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        document["$id"] = f"loopfuse/wire-v1/{name}"
    return documents


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def main() -> None:
    for name, document in schemas().items():
        (SCHEMA_DIR / name).write_text(render(document), encoding="utf-8")
        print(f"wrote {SCHEMA_DIR / name}")


if __name__ == "__main__":
    main()
