"""Worker settings: one frozen model, read from ``LOOPFUSE_*`` environment variables.

This is the only place that reads the environment; everything else is handed a
``Settings`` instance.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from loopfuse.schemas.verdict_signature import VerdictKey, VerdictKeyError, parse_verdict_keys

TopicName = Annotated[str, Field(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$")]
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
#: A tenant's name: the suffix of its topics, so no dot (``agent.tool-calls.<tenant>``
#: reads back as one tenant whatever the name).
_TENANT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True, slots=True)
class TenantTopics:
    """One tenant's topics. The broker's ACLs let a tenant's gateways write only its
    input topics and read only its verdict and reply topics, so the topic an event
    arrived on is the tenant's identity, vouched for by the broker: the worker never
    takes it from a field the producer writes (docs/wire-format.md: Tenants).

    The default tenant (``name`` empty) has the unsuffixed topics: a single-tenant
    deployment is that tenant alone. Tenant ``T`` has the same names with ``.T``
    appended."""

    name: str
    tool_calls: str
    tool_results: str
    compactions: str
    verdicts: str
    replies: tuple[str, ...]

    @property
    def inputs(self) -> tuple[str, str, str]:
        return (self.tool_calls, self.tool_results, self.compactions)

    @property
    def outputs(self) -> tuple[str, ...]:
        """The topics the worker answers this tenant on: what its gateways may read."""
        return (self.verdicts, *self.replies)


class Settings(BaseSettings):
    """Everything a stream worker needs to know about its environment."""

    model_config = SettingsConfigDict(
        env_prefix="LOOPFUSE_",
        frozen=True,
        extra="forbid",
        validate_default=True,
        # str(ValidationError) would quote a secret (LOOPFUSE_VERDICT_KEY) to whoever
        # prints it (the Hermes plugin's loader); describe_settings_error never does
        hide_input_in_errors=True,
    )

    # -- broker ------------------------------------------------------------------------
    bootstrap_servers: str = "127.0.0.1:9092"
    embedded_broker: bool = Field(
        default=False,
        description="the broker is the embedded Tansu: enables the end-offset workaround",
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None

    # -- topics (all input topics must share one partition count: co-partitioning) ----
    topic_tool_calls: TopicName = "agent.tool-calls"
    topic_tool_results: TopicName = "agent.tool-results"
    topic_compactions: TopicName = "agent.compactions"
    topic_verdicts: TopicName = "loopfuse.verdicts"
    topic_loop_events: TopicName = "loopfuse.loop-events"
    topic_dead_letters: TopicName = "loopfuse.dead-letters"
    # the fleet breaker's (loopfuse.rules.fleetBreaker): created and used only with it
    topic_tool_strikes: TopicName = "loopfuse.tool-strikes"
    topic_tool_breakers: TopicName = Field(
        default="loopfuse.tool-breakers", description="compacted; every worker reads it whole"
    )
    partitions: int = Field(default=4, ge=1, le=10_000)
    # Reply routing (docs/wire-format.md: Reply routing): the topics a call may name in
    # reply_to, comma-separated (one per tenant, say); empty: none, every verdict goes
    # to topic_verdicts. The worker creates them with reply_partitions partitions.
    reply_topics: str = Field(
        default="loopfuse.replies",
        description="the reply topics calls may name (comma-separated; empty: none)",
    )
    reply_partitions: int = Field(
        default=64,
        ge=1,
        le=10_000,
        description="partitions of a reply topic the worker creates (one per gateway "
        "process or more: docs/benchmarks.md, Verdict fan-out)",
    )
    # Tenants (docs/wire-format.md: Tenants): each has its own input, verdict and reply
    # topics (the default topics' names + ".TENANT"), which the broker's ACLs give its
    # gateways alone; empty: the default tenant only, today's topics.
    tenants: str = Field(
        default="",
        description="the tenants this worker serves besides the default one "
        "(comma-separated names: A-Z a-z 0-9 _ -)",
    )
    tenant: str = Field(
        default="",
        description="the tenant a gateway or hooks service publishes as (empty: the "
        "default tenant's topics)",
    )
    replication_factor: int = Field(default=1, ge=1, le=32)
    # A write with acks=all counts once this many replicas hold it: 2 of 3 on a
    # three-node cluster survives one node's crash with nothing acknowledged lost, and
    # refuses writes (rather than keep one copy) when two are gone. Set on every topic
    # the worker creates; 1 (a single node) leaves the broker's default alone.
    min_insync_replicas: int = Field(default=1, ge=1, le=32)

    # -- the Faust app -----------------------------------------------------------------
    app_id: TopicName = Field(default="loopfuse", description="Faust app id = consumer group")
    store: Literal["memory://", "rocksdb://"] = "memory://"
    standby_replicas: int = Field(
        default=0, ge=0, le=8, description="warm copies of each table partition on other workers"
    )
    data_dir: Path = Path("./loopfuse-data")
    config_file: Path | None = Field(default=None, description="loopDetection JSON/JSON5 file")
    web_host: str = "127.0.0.1"
    web_port: int = Field(default=6066, ge=1, le=65_535)
    recovery_stall_seconds: float = Field(
        default=300.0,
        ge=10,
        description="table recovery with no progress this long (broker reachable): /livez fails",
    )

    # -- sessions ----------------------------------------------------------------------
    session_ttl_seconds: float = Field(default=86_400.0, gt=0)
    idle_scan_interval_seconds: float = Field(default=60.0, gt=0)
    max_event_bytes: int = Field(default=1_048_576, ge=1_024)
    sequence_gap_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="event time past a missing seq (early events and input watermark) before it is skipped",
    )
    max_parked_events: int = Field(
        default=128, ge=1, description="early events per session before a seq gap is skipped"
    )
    dead_letter_original_bytes: int = Field(default=65_536, ge=0)
    max_identifier_bytes: int = Field(
        default=512,
        ge=64,
        le=65_536,
        description="longest identifier or token in an event (UTF-8 bytes): session_key, "
        "run_id, agent_id, incarnation, call_id, tool_name, event_id, hashes",
    )
    max_session_state_bytes: int = Field(
        default=65_536,
        ge=16_384,
        le=900_000,
        description="one session's serialised state at most (oldest evidence is shed)",
    )
    max_parked_bytes: int = Field(
        default=16_384,
        ge=1_024,
        description="events per session waiting on a seq gap or a gateway restart, in bytes",
    )
    producer_max_request_size: int = Field(
        default=1_000_000,
        ge=65_536,
        description="largest message the worker produces; larger outputs are dead-lettered",
    )

    # -- consumer group and processing -------------------------------------------------
    broker_session_timeout: float = Field(default=30.0, gt=0)
    broker_heartbeat_interval: float = Field(default=3.0, gt=0)
    commit_interval: float = Field(default=1.0, gt=0)
    checkpoint_interval: float = Field(
        default=0.5,
        ge=0,
        description="this long (s) between checkpoints: writes of the session states "
        "changed, then the input judged acknowledged; 0: after every batch",
    )
    batch_max: int = Field(
        default=1_000, ge=1, description="events per batch (a batch is what fetches brought)"
    )
    fetch_max_wait_ms: int | None = Field(
        default=None,
        ge=0,
        description="consumer fetch long-poll bound (default: see fetch_wait_ms)",
    )
    producer_linger_ms: float = Field(default=1.0, ge=0)
    producer_max_batch_size: int = Field(default=262_144, ge=1_024)
    producer_compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "none"

    # -- verdict signatures (docs/wire-format.md: Verdict signatures) -----------------
    # id:base64[,id:base64...]: the worker signs every verdict with the first key, a
    # gateway accepts any listed one (rotation). A secret: never logged, never in errors.
    verdict_key: SecretStr | None = None

    @field_validator("bootstrap_servers")
    @classmethod
    def _hosts(cls, value: str) -> str:
        hosts = [h.strip() for h in value.split(",") if h.strip()]
        if not hosts or any(":" not in h for h in hosts):
            raise ValueError("bootstrap_servers must be host:port[,host:port...]")
        return ",".join(hosts)

    @field_validator("verdict_key")
    @classmethod
    def _verdict_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and value.get_secret_value().strip():
            try:
                parse_verdict_keys(value.get_secret_value())
            except VerdictKeyError as exc:  # its message never quotes the key
                raise ValueError(str(exc)) from None
            return value
        return None  # unset or empty: verdicts are not signed

    @field_validator("reply_topics")
    @classmethod
    def _reply_topics(cls, value: str) -> str:
        return _name_list(
            value,
            _TOPIC_NAME,
            "reply_topics must be Kafka topic names (A-Z a-z 0-9 . _ -, at most 249 "
            "characters), comma-separated",
        )

    @field_validator("tenants")
    @classmethod
    def _tenants(cls, value: str) -> str:
        return _name_list(
            value,
            _TENANT_NAME,
            "tenants must be names of A-Z a-z 0-9 _ - (no dot, at most 64 characters), "
            "comma-separated",
        )

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        value = value.strip()
        if value and not _TENANT_NAME.fullmatch(value):
            raise ValueError("tenant must be a name of A-Z a-z 0-9 _ - (no dot, at most 64)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.max_session_state_bytes + 4_096 > self.producer_max_request_size:
            raise ValueError(
                "LOOPFUSE_MAX_SESSION_STATE_BYTES must leave room within "
                "LOOPFUSE_PRODUCER_MAX_REQUEST_SIZE"
            )
        if self.broker_heartbeat_interval >= self.broker_session_timeout:
            raise ValueError(
                "LOOPFUSE_BROKER_HEARTBEAT_INTERVAL must be shorter than "
                "LOOPFUSE_BROKER_SESSION_TIMEOUT"
            )
        topics = (
            self.input_topics + self.verdict_topics + self.output_topics[1:] + self.fleet_topics
        )
        if len(set(topics)) != len(topics):
            raise ValueError(
                f"LOOPFUSE_TOPIC_* names (with each tenant's) must be distinct, got {topics}"
            )
        # A call names its reply topic: one of loopfuse's own would let a gateway write
        # verdicts into an input topic (judged again) or among the loop events.
        clash = sorted(set(self.reply_topic_names) & {*topics, self.changelog_name})
        if clash:
            raise ValueError(
                f"LOOPFUSE_REPLY_TOPICS must not name loopfuse's other topics, got {clash}"
            )
        if self.sasl_mechanism is not None and not self.security_protocol.startswith("SASL"):
            raise ValueError(
                "LOOPFUSE_SASL_MECHANISM needs LOOPFUSE_SECURITY_PROTOCOL SASL_PLAINTEXT "
                "or SASL_SSL"
            )
        return self

    def tenant_topics(self, name: str = "") -> TenantTopics:
        """Tenant ``name``'s topics (empty: the default tenant's, the unsuffixed ones)."""
        suffix = f".{name}" if name else ""
        return TenantTopics(
            name,
            self.topic_tool_calls + suffix,
            self.topic_tool_results + suffix,
            self.topic_compactions + suffix,
            self.topic_verdicts + suffix,
            tuple(topic + suffix for topic in self.reply_topics.split(",") if topic),
        )

    @property
    def served_tenants(self) -> tuple[TenantTopics, ...]:
        """The tenants a worker serves: the default one, then ``tenants``."""
        names = ["", *self.tenants.split(",")] if self.tenants else [""]
        return tuple(self.tenant_topics(name) for name in names)

    @property
    def input_topics(self) -> tuple[str, ...]:
        """Every served tenant's input topics (the default tenant's three first)."""
        return tuple(topic for tenant in self.served_tenants for topic in tenant.inputs)

    @property
    def verdict_topics(self) -> tuple[str, ...]:
        """Every served tenant's verdicts topic (the default one first)."""
        return tuple(tenant.verdicts for tenant in self.served_tenants)

    @property
    def output_topics(self) -> tuple[str, str, str]:
        return (self.topic_verdicts, self.topic_loop_events, self.topic_dead_letters)

    @property
    def reply_topic_names(self) -> tuple[str, ...]:
        """Every served tenant's reply topics (the default tenant's are ``reply_topics``
        split); empty: reply routing is off."""
        return tuple(topic for tenant in self.served_tenants for topic in tenant.replies)

    @property
    def changelog_name(self) -> str:
        """Faust's name for the session table's changelog topic (the table is named
        ``sessions``: loopfuse.streams.worker.topics.SESSION_TABLE)."""
        return f"{self.app_id}-sessions-changelog"

    @property
    def fleet_topics(self) -> tuple[str, str]:
        """The fleet breaker's topics: strikes (keyed by tool), breakers (compacted)."""
        return (self.topic_tool_strikes, self.topic_tool_breakers)

    @property
    def fetch_wait_ms(self) -> int:
        """The consumers' fetch long-poll: ``fetch_max_wait_ms`` when set; else 500 ms on
        Apache Kafka, which answers a fetch as soon as a record arrives (a shorter wait
        only polls: an idle worker at 5 ms took 14-18% of a core and its broker 25-30
        points more, at 500 ms 1.4-1.6% and under 2: bench/idle.py), and 5 ms on the embedded broker, which waits
        out the whole long-poll when nothing is new (a verdict would wait that long)."""
        if self.fetch_max_wait_ms is not None:
            return self.fetch_max_wait_ms
        return 5 if self.embedded_broker else 500

    def verdict_keys(self) -> tuple[VerdictKey, ...]:
        """The verdict keys, current first (empty: no signing, no checking)."""
        if self.verdict_key is None:
            return ()
        return parse_verdict_keys(self.verdict_key.get_secret_value())

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of an SSL or SASL_SSL connection (None: no TLS)."""
        if not self.security_protocol.endswith("SSL"):
            return None
        context = ssl.create_default_context(
            cafile=str(self.ssl_cafile) if self.ssl_cafile else None
        )
        if self.ssl_certfile:
            context.load_cert_chain(
                str(self.ssl_certfile), str(self.ssl_keyfile) if self.ssl_keyfile else None
            )
        return context

    def kafka_client_kwargs(self) -> dict[str, object]:
        """Security options for an aiokafka client (admin, producer, consumer)."""
        kwargs: dict[str, object] = {"security_protocol": self.security_protocol}
        context = self.ssl_context()
        if context is not None:
            kwargs["ssl_context"] = context
        if self.sasl_mechanism is not None:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = (
                self.sasl_password.get_secret_value() if self.sasl_password else None
            )
        return kwargs


def _name_list(value: str, pattern: re.Pattern[str], refusal: str) -> str:
    """A comma-separated list of names, each matching ``pattern``, without repeats."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not all(pattern.fullmatch(name) for name in names):
        raise ValueError(refusal)
    return ",".join(dict.fromkeys(names))


def describe_settings_error(exc: ValidationError) -> str:
    """One line naming the variable and what is wrong, never the value (it may be a secret)."""
    first = exc.errors(include_input=False, include_url=False)[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    names = [str(part) for part in first["loc"] if isinstance(part, str)]
    if not names:  # a rule across variables: its message names them
        return f"invalid settings: {message}"
    return f"invalid setting LOOPFUSE_{names[0].upper()}: {message}"
