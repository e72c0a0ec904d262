"""Wire format v1: the input events gateways publish and the outputs loopfuse publishes.

The input events are msgspec Structs: what the decoder (loopfuse.schemas.decode) returns, the
engine folds and a session's state keeps waiting. The decoder validates an event's
JSON into them in one pass, or leaves the event to the pydantic models of
loopfuse.schemas.event_schema, which word every rejection and export the JSON Schema. The
outputs are pydantic models, one per JSON object on the wire.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import orjson
from msgspec import UNSET, Meta, Struct, UnsetType
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
)

WIRE_VERSION = 1

#: The largest integer a JavaScript gateway can send exactly (2**53 - 1): the bound of
#: every integer on the wire (``seq``, token counts), so state and outputs never overflow.
MAX_WIRE_INT = 2**53 - 1
#: The latest event time on the wire, 9999-12-31T23:59:59.999Z in epoch milliseconds.
#: An event time is shown by every consumer: Python's ``datetime`` (``loopfuse tail``,
#: logs, notify) stops at year 9999, JavaScript's ``Date`` (the audit report, the
#: OpenClaw gateway) at +-8.64e15 ms (year 275760), and RFC 3339 text, the other form
#: ``ts`` takes, has four-digit years. So year 9999 is the range all of them can show;
#: a real gateway sends "now" (about 1.8e12), far below it, while microseconds or
#: nanoseconds sent by mistake (1.8e15, 1.8e18) land beyond it and are refused.
MAX_EVENT_TS = 253_402_300_799_999
#: Default bound of identifiers and tokens, in UTF-8 bytes (``LOOPFUSE_MAX_IDENTIFIER_BYTES``).
DEFAULT_MAX_IDENTIFIER_BYTES = 512
#: The fields that identify something (and end up in state, outputs or messages);
#: each is at most ``max_identifier_bytes`` UTF-8 bytes (checked in loopfuse.schemas.decode).
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


WireInt = Annotated[StrictInt, Field(ge=0, le=MAX_WIRE_INT)]
NonEmptyStr = Annotated[
    StrictStr,
    Field(min_length=1, json_schema_extra={"maxLength": DEFAULT_MAX_IDENTIFIER_BYTES}),
]


# -- input events ------------------------------------------------------------------
#
# The same fields as the models of loopfuse.schemas.event_schema (and defaults: a test holds
# them so), with the types of the models' plain case: what the models would convert
# (RFC 3339 text or 10.0 for ``ts``) or reject makes the decoder's msgspec pass fail,
# and the models decide. ``args`` and ``result`` are UNSET when the gateway did not
# send them (a null is sent). Identifier sizes, the exactly-one-of rules and the
# history scope are checked by the decoder after the pass. No GC tracking: an event
# holds JSON values, which never refer back to it.

_WireInt = Annotated[int, Meta(ge=0, le=MAX_WIRE_INT)]
_EventTs = Annotated[int, Meta(ge=0, le=MAX_EVENT_TS)]
_NonEmpty = Annotated[str, Meta(min_length=1)]

#: Kafka's own rule for a topic name (legal characters, at most 249 of them), as the
#: models' regex engine (Rust's: ``$`` is the end of the text) reads it; msgspec's is
#: Python's ``re.search``, where ``$`` also matches before a final newline.
TOPIC_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
_TOPIC_NAME_RE = r"^[A-Za-z0-9._-]{1,249}\Z"
#: A Kafka partition number is an int32.
MAX_PARTITION = 2**31 - 1
#: The bound of ``reply_to.requester``, in characters (it becomes a Kafka record key).
MAX_REQUESTER_CHARS = 255
_TopicName = Annotated[str, Meta(pattern=_TOPIC_NAME_RE)]
_Partition = Annotated[int, Meta(ge=0, le=MAX_PARTITION)]
_Requester = Annotated[str, Meta(min_length=1, max_length=MAX_REQUESTER_CHARS)]


class ReplyTo(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """Where an event's verdicts go (docs/wire-format.md: Reply routing): one partition
    of a reply topic, with the record key ``requester`` so that a gateway sharing the
    partition skips the others' records without parsing them."""

    topic: _TopicName
    partition: _Partition
    requester: _Requester


class _InputEvent(
    Struct,
    kw_only=True,
    frozen=True,
    forbid_unknown_fields=True,
    tag_field="type",
    omit_defaults=True,
    gc=False,
):
    type: ClassVar[str]

    event_id: _NonEmpty
    session_key: str | None = None
    run_id: str | None = None
    agent_id: str | None = None
    # Restart-safe extension to v1: the gateway's seq space (docs/wire-format.md: Ordering).
    incarnation: _NonEmpty | None = None
    seq: _WireInt | None = None
    ts: _EventTs  # epoch milliseconds, 1970 .. year 9999
    # Extension to v1: where this event's verdicts go (docs/wire-format.md: Reply routing).
    reply_to: ReplyTo | None = None

    @property
    def key(self) -> str:
        """The session key: history scope and Kafka message key."""
        return self.session_key or self.run_id or ""


class _ArgsCarrier(_InputEvent, frozen=True):
    call_id: str
    tool_name: _NonEmpty
    args: Any | UnsetType = UNSET
    args_hash: str | None = None
    # Extension to v1 for gateways that hash args locally: the string value of
    # args.action (process polls and message sends told apart without the args).
    args_action: str | None = None

    @property
    def has_args(self) -> bool:
        return self.args is not UNSET or self.args_hash is not None


class ToolCall(_ArgsCarrier, frozen=True, tag="tool_call"):
    """The agent is about to run a tool; the gateway waits for the verdict."""

    type: ClassVar[str] = "tool_call"


class ErrorDetail(Struct, frozen=True, omit_defaults=True, gc=False):
    message: str
    name: str | None = None


class Usage(Struct, frozen=True, omit_defaults=True, gc=False):
    """What the session spent since its previous usage report (run caps, docs/configuration.md: Rules)."""

    input_tokens: _WireInt | None = None
    output_tokens: _WireInt | None = None
    total_tokens: _WireInt | None = None  # counted instead of input + output when given
    cost: Annotated[float, Meta(ge=0)] | None = None

    @property
    def tokens(self) -> int:
        if self.total_tokens is not None:
            return self.total_tokens
        return (self.input_tokens or 0) + (self.output_tokens or 0)


class ToolResult(_ArgsCarrier, frozen=True, tag="tool_result"):
    """A tool finished (or failed); its outcome feeds the no-progress detectors."""

    type: ClassVar[str] = "tool_result"

    result: Any | UnsetType = UNSET
    result_hash: str | None = None
    error: str | ErrorDetail | None = None
    unknown_tool: str | None = None
    usage: Usage | None = None

    @property
    def error_text(self) -> str | None:
        if self.error is None:
            return None
        if isinstance(self.error, str):
            return self.error
        return self.error.message or (self.error.name or "")


class Compaction(_InputEvent, frozen=True, tag="compaction"):
    """The gateway compacted the run's context; arms the post-compaction guard."""

    type: ClassVar[str] = "compaction"

    reason: str | None = None


class RunEnded(_InputEvent, frozen=True, tag="run_ended"):
    """The run is over: its guard and warning keys are freed."""

    type: ClassVar[str] = "run_ended"


#: Any input event: what the decoder returns, the engine folds and a state keeps waiting.
InputEvent = ToolCall | ToolResult | Compaction | RunEnded

#: Each input event class's identifier fields, in IDENTIFIER_FIELDS order.
IDENTIFIERS_OF: dict[type[InputEvent], tuple[str, ...]] = {
    cls: tuple(name for name in IDENTIFIER_FIELDS if name in cls.__struct_fields__)
    for cls in (ToolCall, ToolResult, Compaction, RunEnded)
}

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
    # opt-in rules (docs/configuration.md: Rules)
    "tool_loop_run_ended",
    "cycle",
    "repeated_failure",
    "argument_churn",
    "run_call_cap",
    "token_budget",
    "cost_budget",
    "fleet_tool_breaker",
    "identical_calls",
]


_Model = TypeVar("_Model", bound=BaseModel)
_new_object = object.__new__
# The setters of BaseModel's four slots, bound once: object.__setattr__ would look
# each one up in the model's class hierarchy first, for every model built.
_set_values = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def unvalidated(cls: type[_Model], values: dict[str, Any], fields_set: Iterable[str]) -> _Model:
    """A model of ``values`` that the caller has checked, built without validation.

    ``values`` holds every field of ``cls``, in its order. Like ``model_construct``
    but without its per-field defaults pass: the engine builds its outputs (a verdict
    per call, loop events) this way. The models are frozen, so ``fields_set`` may be
    one frozenset shared by all of them (each model gets a copy).
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
    "reply_refused",
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
