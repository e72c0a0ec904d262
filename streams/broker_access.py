"""Why a Kafka client could not connect, in one line naming the setting to fix.

aiokafka reports a refused password, an untrusted certificate and a listener of another
protocol alike: ``KafkaConnectionError: Unable to bootstrap from [...]`` (the cause goes
to its log, once per node). After a client failed to start, :func:`diagnose` connects
once more to each bootstrap address, step by step (TCP, TLS, the SASL handshake), and
says which step failed and which setting decides it. A message never holds a secret:
it names the password's setting, never its value, and a certificate problem is
OpenSSL's verification message (a subject, never key material).

Used by every edge that connects: the worker at start-up, the gateway client (and so the
Hermes plugin), and ``loopfuse audit`` / ``tail`` / ``notify``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import errors as kafka_errors
from aiokafka.conn import create_conn
from aiokafka.protocol.metadata import MetadataRequest

__all__ = [
    "CLIENT_NAMES",
    "ENV_NAMES",
    "EXPLAINED_HERE",
    "BrokerAccessError",
    "Diagnosis",
    "SettingNames",
    "diagnose",
    "explain",
]


@dataclass(frozen=True)
class SettingNames:
    """What the user calls each option where they set it (variables, or arguments)."""

    bootstrap: str
    protocol: str
    mechanism: str
    username: str
    password: str
    cafile: str


#: The worker's, the operator commands' and the Hermes plugin's: environment variables.
ENV_NAMES = SettingNames(
    "LOOPFUSE_BOOTSTRAP_SERVERS",
    "LOOPFUSE_SECURITY_PROTOCOL",
    "LOOPFUSE_SASL_MECHANISM",
    "LOOPFUSE_SASL_USERNAME",
    "LOOPFUSE_SASL_PASSWORD",
    "LOOPFUSE_SSL_CAFILE",
)
#: :class:`~loopfuse.streams.gateway.client.GatewayClient`'s: aiokafka's keyword arguments.
CLIENT_NAMES = SettingNames(
    "bootstrap_servers",
    "security_protocol",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
    "ssl_context",
)


class _ExplainedHere(logging.Filter):
    """Drops aiokafka's log lines about what this module says in one line instead (a
    refused password, an untrusted certificate, a topic the ACLs hide), so that a
    command's error is that line, not three."""

    _NOISE = (
        "SaslAuthenticationFailed",
        "CERTIFICATE_VERIFY_FAILED",
        "is not authorized for this client",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(noise in message for noise in self._NOISE)


#: Add it to the handler of a command that explains access errors itself.
EXPLAINED_HERE = _ExplainedHere()


class BrokerAccessError(ConnectionError):
    """The broker cannot be used with these settings; the message is one line naming the
    setting (never its value)."""


@dataclass(frozen=True)
class Diagnosis:
    """Why connecting failed. ``lasting``: a retry will not help (a refused password, an
    untrusted certificate, the wrong protocol), as opposed to a broker not up yet."""

    message: str
    lasting: bool


async def diagnose(
    bootstrap: str,
    options: Mapping[str, Any],
    names: SettingNames = ENV_NAMES,
    timeout: float = 10.0,
) -> Diagnosis | None:
    """Connect to each bootstrap address with ``options`` (aiokafka's security keywords);
    the first address's problem, or None when one of them connects (the failure was not
    about reaching the broker)."""
    first: Diagnosis | None = None
    for host, port in _addresses(bootstrap):
        try:
            problem = await asyncio.wait_for(_one(host, port, options, names), timeout)
        except TimeoutError:
            problem = Diagnosis(
                f"{host}:{port} accepted a connection but did not answer in {timeout:.0f} s: "
                f"does {names.protocol}={options.get('security_protocol', 'PLAINTEXT')} "
                "match the broker's listener?",
                lasting=False,
            )
        if problem is None:
            return None
        first = first or problem
    return first


async def _one(
    host: str, port: int, options: Mapping[str, Any], names: SettingNames
) -> Diagnosis | None:
    protocol = str(options.get("security_protocol", "PLAINTEXT"))
    context = options.get("ssl_context")
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        return Diagnosis(
            f"nothing answers at {host}:{port} ({names.bootstrap}): {exc.strerror or exc}",
            lasting=False,
        )
    await _close(writer)
    if protocol.endswith("SSL") and isinstance(context, ssl.SSLContext):
        try:
            _, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname=host)
        except ssl.SSLCertVerificationError as exc:
            return Diagnosis(
                f"the broker at {host}:{port} presented a certificate that {names.cafile} "
                f"does not trust ({exc.verify_message})",
                lasting=True,
            )
        except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError) as exc:
            reason = getattr(exc, "reason", None) or type(exc).__name__
            return Diagnosis(
                f"TLS with the broker at {host}:{port} failed ({reason}): does "
                f"{names.protocol}={protocol} match its listener?",
                lasting=True,
            )
        await _close(writer)
    try:
        conn = await create_conn(
            host,
            port,
            request_timeout_ms=5_000,
            **{k: v for k, v in options.items() if k in _CONNECTION_OPTIONS},
        )
    except kafka_errors.SaslAuthenticationFailed:
        user = options.get("sasl_plain_username")
        return Diagnosis(
            f"the broker refused the SASL credentials of user {user!r} "
            f"({names.username} / {names.password})",
            lasting=True,
        )
    except kafka_errors.UnsupportedSaslMechanismError:
        return Diagnosis(
            f"the broker does not offer SASL mechanism {options.get('sasl_mechanism')!r} "
            f"({names.mechanism})",
            lasting=True,
        )
    except (kafka_errors.KafkaError, OSError) as exc:
        return Diagnosis(
            f"the broker at {host}:{port} ended the handshake ({type(exc).__name__}): does "
            f"{names.protocol}={protocol} match its listener?",
            lasting=True,
        )
    try:
        # A SASL listener answers ApiVersions before any handshake: only a real request
        # shows that an SSL client without credentials is refused.
        await conn.send(MetadataRequest([]))
    except (kafka_errors.KafkaError, OSError) as exc:
        return Diagnosis(
            f"the broker at {host}:{port} closed the connection at the first request "
            f"({type(exc).__name__}): does {names.protocol}={protocol} match its listener?",
            lasting=True,
        )
    finally:
        conn.close()
    return None


def explain(
    exc: BaseException,
    bootstrap: str,
    options: Mapping[str, Any],
    names: SettingNames = ENV_NAMES,
) -> Diagnosis | None:
    """For a command that failed with ``exc`` outside an event loop: the diagnosis, when
    ``exc`` is a connection failure and the diagnosis finds why (else None)."""
    if not isinstance(exc, kafka_errors.KafkaConnectionError | OSError | TimeoutError):
        return None
    return asyncio.run(diagnose(bootstrap, options, names))


#: What :func:`aiokafka.conn.create_conn` takes of a client's options.
_CONNECTION_OPTIONS = frozenset(
    {
        "security_protocol",
        "ssl_context",
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "sasl_kerberos_service_name",
        "sasl_kerberos_domain_name",
        "sasl_oauth_token_provider",
        "client_id",
    }
)


def _addresses(bootstrap: str) -> list[tuple[str, int]]:
    addresses = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        if host and port.isdigit():
            addresses.append((host.strip("[]"), int(port)))
    return addresses


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()
