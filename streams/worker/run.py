"""Run one stream worker programmatically (the ``loopfuse worker`` command and tests)."""

from __future__ import annotations

import asyncio
import logging
import sys

import faust
from aiokafka.errors import KafkaConnectionError
from pydantic import ValidationError

from loopfuse.schemas.config import ConfigError, load_config
from loopfuse.streams.broker_access import diagnose
from loopfuse.streams.engine.rule_config import RulesResolver
from loopfuse.streams.settings import Settings, describe_settings_error
from loopfuse.streams.worker.app import create_app
from loopfuse.streams.worker.faust_compat import UnsupportedVersion, check_versions
from loopfuse.streams.worker.topics import TopicAccessDenied, TopicMismatchError, ensure_topics

log = logging.getLogger("loopfuse.worker")


def run_worker(settings: Settings, loglevel: str = "info") -> int:
    """Create topics, build the app and run a Faust worker until SIGTERM / SIGINT.

    Returns the process exit code: 0 after a clean shutdown, 2 for a problem that
    retrying will not fix (bad config, topics with the wrong size, also when an
    input topic comes back with the wrong size while running).
    """
    try:
        check_versions()
        config = load_config(settings.config_file) if settings.config_file else None
    except (ConfigError, UnsupportedVersion) as exc:
        print(f"loopfuse worker: {exc}", file=sys.stderr, flush=True)
        return 2
    # One loop for the pre-flight and the worker: Faust binds to the current loop.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        fleet = config is not None and RulesResolver(config).fleet_breaker is not None
        loop.run_until_complete(ensure_topics(settings, fleet_breaker=fleet))
    except TopicMismatchError as exc:
        print(f"loopfuse worker: {exc}", file=sys.stderr, flush=True)
        loop.close()
        return 2
    except TopicAccessDenied as exc:
        print(f"loopfuse worker: {exc}", file=sys.stderr, flush=True)
        loop.close()
        return 2
    except Exception as exc:
        # A refused password, an untrusted certificate, the wrong protocol: one line
        # naming the variable, and exit 2 (a restart will not fix it).
        diagnosis = None
        if isinstance(exc, KafkaConnectionError | OSError | TimeoutError):
            diagnosis = loop.run_until_complete(
                diagnose(settings.bootstrap_servers, settings.kafka_client_kwargs())
            )
        if diagnosis is not None and diagnosis.lasting:
            print(f"loopfuse worker: {diagnosis.message}", file=sys.stderr, flush=True)
            loop.close()
            return 2
        if diagnosis is not None:  # not up yet: a restart may help (exit 1)
            print(
                f"loopfuse worker: cannot create topics on {settings.bootstrap_servers}: "
                f"{diagnosis.message}",
                file=sys.stderr,
                flush=True,
            )
            loop.close()
            return 1
        print(
            f"loopfuse worker: cannot create topics on {settings.bootstrap_servers}: {exc!r}",
            file=sys.stderr,
            flush=True,
        )
        loop.close()
        return 1
    app = create_app(settings, config)
    worker = faust.Worker(
        app,
        loop=loop,
        loglevel=loglevel,
        redirect_stdouts=False,
        # web host/port/bind come from the app's configuration (create_app).
        # mode's Worker handles SIGINT/SIGTERM: it stops the app (agents finish
        # their batch, the consumer commits, the producer flushes) and returns.
    )
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = exc.code
        code = code if isinstance(code, int) else (0 if code is None else 1)
    else:
        code = 0
    # The app asks for a non-zero exit (and stops itself) on a problem a restart
    # will not fix, e.g. an input topic re-created with the wrong size.
    requested: tuple[int, str] | None = getattr(app, "loopfuse_exit", None)
    if requested is not None:
        print(f"loopfuse worker: {requested[1]}", file=sys.stderr, flush=True)
        return requested[0]
    return code


def main() -> int:
    try:
        settings = Settings()
    except ValidationError as exc:  # never a traceback: it would print the values
        print(f"loopfuse worker: {describe_settings_error(exc)}", file=sys.stderr, flush=True)
        return 2
    return run_worker(settings, loglevel="info")


if __name__ == "__main__":
    sys.exit(main())
