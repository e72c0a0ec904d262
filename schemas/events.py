"""Wire format v1: the input events gateways publish and the outputs loopfuse publishes.

One pydantic model per JSON object on the wire. Input events are validated here and
nowhere else; the engine receives only validated objects.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar

import orjson
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

WIRE_VERSION = 1

#: The largest integer a JavaScript gateway can send exactly (2**53 - 1): the bound of
#: every integer on the wire (``ts``, ``seq``), so state and outputs never overflow.
MAX_WIRE_INT = 2**53 - 1
#: Default bound of identifiers and tokens, in UTF-8 bytes (``LOOPFUSE_MAX_IDENTIFIER_BYTES``).
DEFAULT_MAX_IDENTIFIER_BYTES = 512
#: The fields that identify something (and end up in state, outputs or messages);
#: each is at most ``max_identifier_bytes`` UTF-8 bytes (checked in schemas.decode).
IDENTIFIER_FIELDS = (
    "event_id",
    "session_key",
    "run_id",
    "agent_id",
    "incarnation",
    "call_id",
    "tool_name",
    "args_hash",
    "args_action",
    "result_hash",
    "unknown_tool",
)


def _to_epoch_ms(value: Any) -> Any:
    """Accept RFC 3339 text or epoch milliseconds; store epoch milliseconds (0 .. 2**53-1)."""
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
        if not 0 <= value <= MAX_WIRE_INT:
            raise ValueError("ts must be epoch milliseconds in 0 .. 2**53-1")
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
    Field(json_schema_extra={"minimum": 0, "maximum": MAX_WIRE_INT}),
]
WireInt = Annotated[StrictInt, Field(ge=0, le=MAX_WIRE_INT)]
NonEmptyStr = Annotated[
    StrictStr,
    Field(min_length=1, json_schema_extra={"maxLength": DEFAULT_MAX_IDENTIFIER_BYTES}),
]


class _InputEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    event_id: NonEmptyStr
    session_key: Identifier | None = _identifier("history scope and Kafka message key")
    run_id: Identifier | None = _identifier("detection scope inside the session")
    agent_id: Identifier | None = _identifier("selects per-agent config overrides")
    # Restart-safe extension to v1: the gateway's seq space. A gateway that restarts
    # (or otherwise starts counting seq from 0 again) sends a new incarnation, which
    # opens a new seq space while the session keeps its history (README: Ordering).
    incarnation: Annotated[Identifier, Field(min_length=1)] | None = _identifier(
        "the gateway's seq space: a new value per gateway start (e.g. a random id)"
    )
    seq: WireInt | None = None
    ts: EpochMs = Field(description="Event time: RFC 3339 text or epoch milliseconds")

    @model_validator(mode="after")
    def _has_key(self) -> _InputEvent:
        if not self.session_key and not self.run_id:
            raise ValueError("an event needs session_key or run_id (the history scope)")
        return self

    @property
    def key(self) -> str:
        """The session key: history scope and Kafka message key."""
        return self.session_key or self.run_id or ""


class _ArgsCarrier(_InputEvent):
    call_id: Identifier
    tool_name: NonEmptyStr
    args: Any = None
    args_hash: Identifier | None = _identifier("opaque token of the args (instead of args)")
    # Extension to v1 for gateways that hash args locally: the string value of
    # args.action, which the engine needs to tell process polls and message sends
    # apart without seeing the args themselves.
    args_action: Identifier | None = _identifier("the string value of args.action")

    @property
    def has_args(self) -> bool:
        return "args" in self.model_fields_set or self.args_hash is not None


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
    """What the session spent since its previous usage report (run caps, README: Rules).

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

    @property
    def tokens(self) -> int:
        if self.total_tokens is not None:
            return self.total_tokens
        return (self.input_tokens or 0) + (self.output_tokens or 0)


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

    @property
    def error_text(self) -> str | None:
        if self.error is None:
            return None
        if isinstance(self.error, str):
            return self.error
        return self.error.message or (self.error.name or "")


class Compaction(_InputEvent):
    """The gateway compacted the run's context; arms the post-compaction guard."""

    type: Literal["compaction"]
    reason: StrictStr | None = None


class RunEnded(_InputEvent):
    """The run is over: its guard and warning keys are freed."""

    type: Literal["run_ended"]


#: Any input event: what the decoder returns, the engine folds and a state keeps waiting.
InputEvent = ToolCall | ToolResult | Compaction | RunEnded
#: The same union as the wire tells its members apart (by ``type``): validation and the
#: exported JSON Schema.
TaggedInputEvent = Annotated[InputEvent, Field(discriminator="type")]
input_event_adapter: TypeAdapter[InputEvent] = TypeAdapter(TaggedInputEvent)

Action = Literal["allow", "warn", "block", "abort"]
Level = Literal["none", "warning", "critical"]
Detector = Literal[
    "unknown_tool_repeat",
    "global_circuit_breaker",
    "known_poll_no_progress",
    "ping_pong",
    "generic_repeat",
    "compaction_loop_persisted",
    "sequence_gap",
    # opt-in rules (issue 14, README: Rules)
    "tool_loop_run_ended",
    "cycle",
    "repeated_failure",
    "argument_churn",
    "run_call_cap",
    "token_budget",
    "cost_budget",
    "fleet_tool_breaker",
]


_Model = TypeVar("_Model", bound=BaseModel)
_new_object = object.__new__
# The setters of BaseModel's four slots, bound once: object.__setattr__ would look
# each one up in the model's class hierarchy first, for every model built.
_set_values = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def unvalidated(
    cls: type[_Model], values: dict[str, Any], fields_set: Iterable[str]
) -> _Model:
    """A model of ``values`` that the caller has checked, built without validation.

    ``values`` holds every field of ``cls``, in its order. Like ``model_construct``
    but without its per-field defaults pass: the engine builds one or two models per
    event this way (schemas.decode's plain events, the engine's outputs). The models
    are frozen, so ``fields_set`` may be one frozenset shared by all of them (each
    model gets a copy); or the wire object itself, whose keys are the set fields.
    """
    model = _new_object(cls)
    _set_values(model, values)
    # A set of its own (not the caller's shared frozenset): pydantic's model_copy
    # updates it in place.
    _set_fields_set(model, set(fields_set))
    _set_extra(model, None)
    _set_private(model, None)
    return model


class _Output(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    def to_json(self) -> bytes:
        """The message as published: every field, in order (orjson, not pydantic's
        serialiser, which costs several times as much)."""
        return orjson.dumps(self.__dict__)


class Verdict(_Output):
    """What the gateway must do with one tool call (or with its run, for abort)."""

    type: Literal["verdict"] = "verdict"
    verdict_id: str
    session_key: str
    run_id: str | None
    agent_id: str | None
    call_id: str | None
    seq: int | None
    incarnation: str | None = None
    tool_name: str | None
    action: Action
    level: Level
    detector: Detector | None
    count: int
    message: str | None
    args_hash: str | None
    paired_tool_name: str | None = None
    event_ts: int
    decided_ts: int


class FleetBreak(BaseModel):
    """What tripped a fleet-wide tool breaker (only on ``fleet_tool_breaker`` loop events)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    sessions: int = Field(description="distinct sessions that hit a loop on the tool")
    window_seconds: int
    since_ts: int = Field(description="event time of the strike that tripped it")
    until_ts: int = Field(description="event time from which its calls are judged alone again")


class LoopEvent(_Output):
    """Audit trail: a loop detected (every critical, warnings once per bucket).

    A fleet-wide tool breaker's event (detector ``fleet_tool_breaker``) belongs to no
    session: its ``session_key`` is ``"fleet"``, its run and call fields are null, and
    ``fleet`` says what tripped it.
    """

    type: Literal["loop_event"] = "loop_event"
    event_id: str
    session_key: str
    run_id: str | None
    agent_id: str | None
    call_id: str | None
    seq: int | None
    incarnation: str | None = None
    tool_name: str | None
    action: Action
    level: Level
    detector: Detector
    count: int
    message: str | None
    args_hash: str | None
    paired_tool_name: str | None = None
    warning_key: str | None
    config: dict[str, Any]
    enforced: bool = True
    args: Any = Field(
        default=None,
        description="the call's raw args, only with loopfuse.includePayloadsInLoopEvents "
        "(and only when the call was judged with raw args as it arrived)",
    )
    fleet: FleetBreak | None = Field(
        default=None, description="only on the fleet-wide tool breaker's own loop event"
    )
    event_ts: int
    decided_ts: int

    def to_json(self) -> bytes:
        """As published: every field in order, ``fleet`` only when set (a session's loop
        events are written as before the fleet breaker existed)."""
        data = self.__dict__
        fleet = data.get("fleet")
        if fleet is None:
            data = {key: value for key, value in data.items() if key != "fleet"}
        else:
            data = {**data, "fleet": fleet.model_dump()}
        return orjson.dumps(data)


class ToolStrike(BaseModel):
    """A session hit a loop on a tool (topic ``loopfuse.tool-strikes``, keyed by tool).

    Only published when the fleet breaker is configured; no args, results or session
    key: the session is a hash, enough to count distinct sessions.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["tool_strike"] = "tool_strike"
    tool_name: NonEmptyStr
    session: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{16}$")]
    detector: Detector
    ts: WireInt = Field(description="event time of the call (or result) that hit")


class ToolBreakerState(BaseModel):
    """A tool broken fleet-wide (topic ``loopfuse.tool-breakers``, compacted, keyed by tool).

    Every worker reads the topic whole; calls to the tool with an event time before
    ``until_ts`` get the breaker's verdict. A tombstone clears it early.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["tool_breaker"] = "tool_breaker"
    tool_name: NonEmptyStr
    sessions: Annotated[StrictInt, Field(ge=1, le=1_000)]
    window_seconds: Annotated[StrictInt, Field(ge=1, le=86_400)]
    since_ts: WireInt
    until_ts: WireInt


DeadLetterCode = Literal[
    "empty_message",
    "too_large",
    "invalid_utf8",
    "invalid_json",
    "too_deep",
    "not_an_object",
    "unknown_type",
    "invalid_event",
    "orphan_result",
    "engine_error",
    "output_too_large",
    "state_too_large",
]


class DeadLetter(BaseModel):
    """An input that could not be judged, with why; the original bytes as far as safe."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["dead_letter"] = "dead_letter"
    error_code: DeadLetterCode
    reason: str
    source_topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    line: int | None = Field(default=None, description="1-based line number in a replay file")
    key: str | None = None
    original: str | None = Field(
        default=None, description="the input as text (invalid UTF-8 replaced), truncated"
    )
    original_size: int = 0
    original_truncated: bool = False
