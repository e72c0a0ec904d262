"""The input events' validation and JSON Schema: pydantic models of wire format v1.

The decoder (loopfuse.schemas.decode) validates most events in one msgspec pass straight into
the engine's events (loopfuse.schemas.events); whatever that pass is not sure of is validated
here, where every rejection is worded, and converted by :func:`to_event`. The
exported ``input-event.schema.json`` is these models'. Their fields and defaults are
the events' own (tests/unit/test_decode.py holds them to that): the models word, the
Structs are what runs, and a field is added to both.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from msgspec import UNSET
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    model_validator,
)

from loopfuse.schemas import events
from loopfuse.schemas.events import (
    DEFAULT_MAX_IDENTIFIER_BYTES,
    MAX_EVENT_TS,
    MAX_PARTITION,
    MAX_REQUESTER_CHARS,
    TOPIC_NAME_PATTERN,
    NonEmptyStr,
    WireInt,
)

#: Why a ``ts`` out of range is refused, in the dead letter's reason (``invalid_event``).
TS_RANGE = (
    f"ts must be epoch milliseconds in 0 .. {MAX_EVENT_TS} "
    "(1970-01-01T00:00:00Z .. 9999-12-31T23:59:59.999Z, the times every consumer can show; "
    "a larger value is usually micro- or nanoseconds)"
)


def _to_epoch_ms(value: Any) -> Any:
    """Accept RFC 3339 text or epoch milliseconds; store epoch milliseconds
    (0 .. MAX_EVENT_TS, see there)."""
    if isinstance(value, bool):
        raise ValueError("ts must be an RFC 3339 time or epoch milliseconds, not a boolean")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError as exc:
            raise ValueError(f"ts is not an RFC 3339 time: {value[:40]!r}") from exc
        if parsed.tzinfo is None:
            raise ValueError("ts must carry a time zone offset (RFC 3339)")
        value = int(parsed.timestamp() * 1000)
    if isinstance(value, int):
        if not 0 <= value <= MAX_EVENT_TS:
            raise ValueError(TS_RANGE)
        return value
    raise ValueError("ts must be an RFC 3339 time or epoch milliseconds")


def _identifier(description: str) -> Any:
    return Field(
        default=None,
        description=f"{description}; at most {DEFAULT_MAX_IDENTIFIER_BYTES} UTF-8 bytes",
    )


# JSON Schema's maxLength counts characters; the worker counts UTF-8 bytes (the same
# for ASCII ids) against LOOPFUSE_MAX_IDENTIFIER_BYTES, whose default this documents.
# On the string type itself, so that the schema's string branch carries it (strict
# validators such as ajv reject maxLength beside an anyOf).
Identifier = Annotated[
    StrictStr, Field(json_schema_extra={"maxLength": DEFAULT_MAX_IDENTIFIER_BYTES})
]


EpochMs = Annotated[
    int,
    BeforeValidator(_to_epoch_ms),
    Field(json_schema_extra={"minimum": 0, "maximum": MAX_EVENT_TS}),
]


class ReplyTo(BaseModel):
    """Where the event's verdicts go instead of the shared verdicts topic.

    An extension to v1 (docs/wire-format.md: Reply routing): the worker publishes the
    verdicts of this event to ``partition`` of ``topic``, one of the reply topics it is
    configured with, keyed by ``requester``; a topic or partition it does not have
    sends them to the verdicts topic, as for an event without ``reply_to``.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)
    topic: Annotated[StrictStr, Field(pattern=TOPIC_NAME_PATTERN)] = Field(
        description="a reply topic (a Kafka topic name)"
    )
    partition: Annotated[StrictInt, Field(ge=0, le=MAX_PARTITION)] = Field(
        description="the partition of the reply topic this gateway reads"
    )
    requester: Annotated[StrictStr, Field(min_length=1, max_length=MAX_REQUESTER_CHARS)] = Field(
        description="the reply record's Kafka key: the gateway's own id (e.g. its incarnation)"
    )


class _InputEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    event_id: NonEmptyStr
    session_key: Identifier | None = _identifier("history scope and Kafka message key")
    run_id: Identifier | None = _identifier("detection scope inside the session")
    agent_id: Identifier | None = _identifier("selects per-agent config overrides")
    # Restart-safe extension to v1: the gateway's seq space. A gateway that restarts
    # (or otherwise starts counting seq from 0 again) sends a new incarnation, which
    # opens a new seq space while the session keeps its history (docs/wire-format.md: Ordering).
    incarnation: Annotated[Identifier, Field(min_length=1)] | None = _identifier(
        "the gateway's seq space: a new value per gateway start (e.g. a random id)"
    )
    seq: WireInt | None = None
    ts: EpochMs = Field(
        description="Event time: RFC 3339 text or epoch milliseconds, "
        "1970-01-01T00:00:00Z .. 9999-12-31T23:59:59.999Z"
    )
    reply_to: ReplyTo | None = None

    @model_validator(mode="after")
    def _has_key(self) -> _InputEvent:
        if not self.session_key and not self.run_id:
            raise ValueError("an event needs session_key or run_id (the history scope)")
        return self


class _ArgsCarrier(_InputEvent):
    call_id: Identifier
    tool_name: NonEmptyStr
    args: Any = None
    args_hash: Identifier | None = _identifier("opaque token of the args (instead of args)")
    # Extension to v1 for gateways that hash args locally: the string value of
    # args.action, which the engine needs to tell process polls and message sends
    # apart without seeing the args themselves.
    args_action: Identifier | None = _identifier("the string value of args.action")


class ToolCall(_ArgsCarrier):
    """The agent is about to run a tool; the gateway waits for the verdict."""

    type: Literal["tool_call"]

    @model_validator(mode="after")
    def _args_xor_hash(self) -> ToolCall:
        sent_args = "args" in self.model_fields_set
        if sent_args == (self.args_hash is not None):
            raise ValueError("a tool_call carries exactly one of args or args_hash")
        return self


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    message: StrictStr
    name: StrictStr | None = None


class Usage(BaseModel):
    """What the session spent since its previous usage report (run caps, docs/configuration.md: Rules).

    An extension to v1 that older consumers ignore: the gateway reports each model
    turn's spend (and a tool's own, if it has one) once, on a tool result of the turn.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)
    input_tokens: WireInt | None = None
    output_tokens: WireInt | None = None
    total_tokens: WireInt | None = Field(
        default=None, description="counted instead of input_tokens + output_tokens when given"
    )
    cost: Annotated[StrictFloat, Field(ge=0, allow_inf_nan=False)] | None = Field(
        default=None, description="spend in the operator's unit (e.g. USD), as runCaps.cost*"
    )


class ToolResult(_ArgsCarrier):
    """A tool finished (or failed); its outcome feeds the no-progress detectors."""

    type: Literal["tool_result"]
    result: Any = None
    result_hash: Identifier | None = _identifier("opaque token of the result (instead of result)")
    error: StrictStr | ErrorDetail | None = None
    unknown_tool: Identifier | None = _identifier("the missing tool's name")
    usage: Usage | None = None

    @model_validator(mode="after")
    def _one_outcome(self) -> ToolResult:
        given = (
            ("result" in self.model_fields_set)
            + (self.result_hash is not None)
            + (self.error is not None)
        )
        if given != 1:
            raise ValueError("a tool_result carries exactly one of result, result_hash or error")
        if "args" in self.model_fields_set and self.args_hash is not None:
            raise ValueError("a tool_result carries at most one of args or args_hash")
        return self


class Compaction(_InputEvent):
    """The gateway compacted the run's context; arms the post-compaction guard."""

    type: Literal["compaction"]
    reason: StrictStr | None = None


class RunEnded(_InputEvent):
    """The run is over: its guard and warning keys are freed."""

    type: Literal["run_ended"]


#: Any input event as its model (validated here, then converted by to_event).
EventModel = ToolCall | ToolResult | Compaction | RunEnded
#: The union as the wire tells its members apart (by ``type``): validation and the
#: exported JSON Schema.
TaggedEventModel = Annotated[EventModel, Field(discriminator="type")]
input_event_adapter: TypeAdapter[EventModel] = TypeAdapter(TaggedEventModel)

_STRUCTS: dict[type[BaseModel], Any] = {
    ToolCall: events.ToolCall,
    ToolResult: events.ToolResult,
    Compaction: events.Compaction,
    RunEnded: events.RunEnded,
    ErrorDetail: events.ErrorDetail,
    Usage: events.Usage,
    ReplyTo: events.ReplyTo,
}
#: Fields whose absence the events keep (``UNSET``): a null ``args`` is args, none is not.
_UNSET_WHEN_ABSENT = frozenset({"args", "result"})


def to_event(model: EventModel) -> events.InputEvent:
    """The engine's event of a validated model: the same fields, the same values."""
    event: events.InputEvent = _to_struct(model)
    return event


def _to_struct(model: BaseModel) -> Any:
    values = {}
    for name, value in model.__dict__.items():
        if name == "type":
            continue  # the Struct's tag
        if name in _UNSET_WHEN_ABSENT and name not in model.model_fields_set:
            value = UNSET
        elif isinstance(value, BaseModel):
            value = _to_struct(value)
        values[name] = value
    return _STRUCTS[type(model)](**values)


def validate_event(data: Any) -> events.InputEvent:
    """An event from a JSON object already parsed (tests, tools): validated by the
    models, whatever the decoder's fast pass would have made of its bytes."""
    return to_event(input_event_adapter.validate_python(data))
