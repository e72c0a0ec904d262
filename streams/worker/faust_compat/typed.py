"""Typed doors into Faust's untyped API: its timer decorator, its assignment signal,
its table manager's recovery state, its broker credentials.

Faust's ``app.timer`` is untyped, ``on_partitions_assigned.connect`` is typed for
synchronous receivers only, and ``app.tables.recovery`` is not on ``TableManagerT``.
The worker's wiring (``app.py``) goes through these, so mypy checks it in strict mode
instead of leaving the module out.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import faust

from loopfuse.streams.settings import Settings

Tick = Callable[[], Awaitable[None]]


def every(app: faust.App, seconds: float, name: str) -> Callable[[Tick], Tick]:
    """``app.timer(seconds, name=name)`` as a typed decorator: ``tick`` runs every
    ``seconds`` on the worker that runs timers (each worker runs its own)."""

    def register(tick: Tick) -> Tick:
        app.timer(seconds, name=name)(tick)
        return tick

    return register


def on_assigned(app: faust.App, receiver: Tick) -> None:
    """Run ``receiver`` after every partition assignment (Faust's
    ``on_partitions_assigned`` signal, whose sender and partitions it does not need)."""

    async def _receive(sender: Any, *args: Any, **kwargs: Any) -> None:
        await receiver()

    # mode's signals hold receivers strongly (weak=False) and await async ones
    app.on_partitions_assigned.connect(_receive)  # type: ignore[arg-type]


def recovery_completed(app: faust.App) -> bool:
    """Whether the table manager finished restoring the tables from their changelogs."""
    recovery: Any = getattr(app.tables, "recovery")  # noqa: B009  # not on TableManagerT
    return bool(recovery.completed.is_set())


def faust_credentials(settings: Settings) -> faust.auth.Credentials | None:
    """The settings' security options as Faust's broker credentials (None: plaintext)."""
    context = settings.ssl_context()
    if settings.sasl_mechanism is not None:
        password = settings.sasl_password
        return faust.SASLCredentials(
            username=settings.sasl_username or "",
            password=password.get_secret_value() if password is not None else "",
            mechanism=settings.sasl_mechanism,
            ssl_context=context,
        )
    if settings.security_protocol == "SSL":
        return faust.SSLCredentials(context)
    return None
