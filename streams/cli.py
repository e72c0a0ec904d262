"""The ``loopfuse`` command line: replay, worker, broker, demo, audit, whatif, tail, notify,
hooks, config.

Each subcommand imports what it needs when it runs: operators run these commands in
scripts and loops, and a coding agent's hook may run one per tool call, so the parser
and ``--help`` load no models, Kafka client or terminal library
(tests/unit/test_cli_startup.py holds it).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loopfuse.schemas.config import DetectionConfigFile


def _worker_missing(command: str) -> int | None:
    """Exit status 2 and one line when the [worker] extra is not installed, else None.

    The base install (a gateway's, an operator's) has no Faust: `loopfuse worker` and
    the demo (which starts a worker) need ``pip install "loopfuse[worker]"``.
    """
    if importlib.util.find_spec("faust") is not None:
        return None
    print(
        f"loopfuse {command}: needs the worker's dependencies (Faust, RocksDB): "
        'pip install "loopfuse[worker]"',
        file=sys.stderr,
    )
    return 2


def _load(path: str | None) -> DetectionConfigFile | None:
    if path is None:
        return None
    from loopfuse.schemas.config import load_config

    return load_config(path)


def _cmd_replay(args: argparse.Namespace) -> int:
    from loopfuse.streams.replay import run_replay

    config = _load(args.config)
    return run_replay(args.events, config, sys.stdout.buffer, progress=args.progress)


def _cmd_worker(args: argparse.Namespace) -> int:
    if (missing := _worker_missing("worker")) is not None:
        return missing
    from loopfuse.streams.settings import Settings
    from loopfuse.streams.worker.run import run_worker

    overrides = {
        name: value
        for name, value in {
            "bootstrap_servers": args.bootstrap,
            "web_port": args.web_port,
            "web_host": args.web_host,
            "config_file": args.config,
            "store": args.store,
            "data_dir": args.data_dir,
        }.items()
        if value is not None
    }
    settings = Settings(**overrides)
    # run_worker loads the config file first and exits 2 naming the key path.
    return run_worker(settings, loglevel=args.loglevel)


def _cmd_broker(args: argparse.Namespace) -> int:
    from loopfuse.streams.local.broker import run_broker_cli

    if args.nodes > 1 and not args.kafka:
        print(
            "loopfuse broker: --nodes needs --kafka (the embedded broker is one process)",
            file=sys.stderr,
        )
        return 2
    if args.nodes > 1 and args.port is not None:
        print(
            "loopfuse broker: --port is for one node; a cluster's ports are free ones",
            file=sys.stderr,
        )
        return 2
    if args.nodes == 2:
        print(
            "loopfuse broker: --nodes is 1, or 3 or more (a quorum that survives a node)",
            file=sys.stderr,
        )
        return 2
    if args.secure and not args.kafka:
        print(
            "loopfuse broker: --secure needs --kafka (the embedded broker has no TLS or ACLs)",
            file=sys.stderr,
        )
        return 2
    return run_broker_cli(
        args.port, kafka=args.kafka, data_dir=args.data_dir, nodes=args.nodes, secure=args.secure
    )


def _cmd_demo(args: argparse.Namespace) -> int:
    if (missing := _worker_missing("demo")) is not None:
        return missing
    from loopfuse.streams.local.demo import run_demo

    return run_demo(args)


def _cmd_audit(args: argparse.Namespace) -> int:
    from loopfuse.streams.ops.audit import run_audit

    if args.events is None and args.bootstrap is None:
        args.events = "-" if not sys.stdin.isatty() else None
    if args.events is None and args.bootstrap is None:
        print("loopfuse audit: give a JSONL file (or -) or --bootstrap", file=sys.stderr)
        return 2
    return run_audit(
        events=args.events,
        bootstrap=args.bootstrap,
        topic=args.topic,
        since=args.since,
        until=args.until,
        html=args.html,
        top=args.top,
    )


def _cmd_whatif(args: argparse.Namespace) -> int:
    from loopfuse.streams.engine import Engine
    from loopfuse.streams.engine.native_step import native_for
    from loopfuse.streams.ops.whatif import run_whatif
    from loopfuse.streams.replay import replay_lines

    engine = Engine(_load(args.config))
    judged_by = "the native judge" if native_for(engine) is not None else "the Python engine"
    return run_whatif(args, judge=lambda lines: replay_lines(lines, engine), judged_by=judged_by)


def _cmd_tail(args: argparse.Namespace) -> int:
    from loopfuse.streams.ops.tail import run_tail

    return run_tail(args)


def _cmd_notify(args: argparse.Namespace) -> int:
    from loopfuse.streams.ops.notify import run_notify

    return run_notify(args)


def _cmd_hooks_serve(args: argparse.Namespace) -> int:
    from loopfuse.streams.gateway.hooks.protocols import AGENTS
    from loopfuse.streams.gateway.hooks.service import HooksOptions, is_loopback, run_serve
    from loopfuse.streams.settings import Settings

    token = None
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            print(f"loopfuse hooks: cannot read --token-file ({exc.strerror})", file=sys.stderr)
            return 2
        if not token:
            print("loopfuse hooks: --token-file is empty", file=sys.stderr)
            return 2
    elif not is_loopback(args.host):
        print(
            f"loopfuse hooks: --host {args.host} is not loopback: give --token-file (a bearer "
            "token every request must carry)",
            file=sys.stderr,
        )
        return 2
    if not 0 <= args.port <= 65_535 or args.verdict_timeout <= 0 or args.max_body_bytes < 1_024:
        print(
            "loopfuse hooks: --port is 0-65535, --verdict-timeout above 0, "
            "--max-body-bytes at least 1024",
            file=sys.stderr,
        )
        return 2
    closed = set(AGENTS) if "all" in (args.fail_closed or []) else set(args.fail_closed or [])
    options = HooksOptions(
        host=args.host,
        port=args.port,
        token=token,
        host_id=args.host_id,
        verdict_timeout=args.verdict_timeout,
        fail_policy={agent: "closed" for agent in AGENTS if agent in closed},
        max_body_bytes=args.max_body_bytes,
        raw_payloads=args.raw_payloads,
        codex_interrupt=args.codex_interrupt,
    )
    return run_serve(Settings(), options)


def _cmd_hooks_install(args: argparse.Namespace) -> int:
    from loopfuse.streams.gateway.hooks.install import InstallError, InstallOptions, install

    options = InstallOptions(
        project=args.project, fail_closed=args.fail_closed, url=args.url, token_env=args.token_env
    )
    try:
        lines = install(args.agent, options, Path.home(), Path.cwd())
    except (InstallError, OSError) as exc:
        print(f"loopfuse hooks install: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


def _cmd_hooks_uninstall(args: argparse.Namespace) -> int:
    from loopfuse.streams.gateway.hooks.install import InstallError, uninstall

    try:
        lines = uninstall(args.agent, args.project, Path.home(), Path.cwd())
    except (InstallError, OSError) as exc:
        print(f"loopfuse hooks uninstall: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


def _cmd_hooks_unit(args: argparse.Namespace) -> int:
    import shutil

    from loopfuse.streams.gateway.hooks.install import launchd_plist, systemd_unit
    from loopfuse.streams.settings import Settings

    program = shutil.which("loopfuse")
    command = [program] if program else [sys.executable, "-m", "loopfuse.streams.cli"]
    serve_args = args.serve_args[1:] if args.serve_args[:1] == ["--"] else args.serve_args
    command += ["hooks", "serve", *serve_args]
    if args.launchd:
        print(launchd_plist(command, Settings().bootstrap_servers), end="")
    else:
        print(systemd_unit(command), end="")
    return 0


def _host_id(value: str) -> str:
    if not value or len(value) > 64 or not all(c.isalnum() or c in "._-" for c in value):
        raise argparse.ArgumentTypeError("1-64 characters: letters, digits, . _ -")
    return value


def _cmd_config_check(args: argparse.Namespace) -> int:
    from loopfuse.streams.ops.config_check import run_config_check

    return run_config_check(args.file, args.agent)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loopfuse", description="Fleet-wide tool-call loop detection for AI agents."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log notices to stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    replay = sub.add_parser("replay", help="judge a JSONL file of events offline (no broker)")
    replay.add_argument("events", nargs="?", default="-", help="EVENTS.jsonl, or - for stdin")
    replay.add_argument("--config", help="OpenClaw-shaped JSON/JSON5 config file")
    replay.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: on a terminal, for inputs over 1 MB)",
    )
    replay.set_defaults(handler=_cmd_replay)

    worker = sub.add_parser("worker", help="run a stream worker (settings: LOOPFUSE_* env vars)")
    worker.add_argument("--bootstrap", help="Kafka bootstrap servers (LOOPFUSE_BOOTSTRAP_SERVERS)")
    worker.add_argument("--config", help="loopDetection config file (LOOPFUSE_CONFIG_FILE)")
    worker.add_argument("--web-host", help="web server bind host (default 127.0.0.1)")
    worker.add_argument("--web-port", type=int, help="web server port (metrics, health)")
    worker.add_argument("--store", help="table store: memory:// or rocksdb://")
    worker.add_argument("--data-dir", help="Faust data directory (rocksdb tables)")
    worker.add_argument(
        "-l", "--loglevel", default="info", choices=["debug", "info", "warning", "error"]
    )
    worker.set_defaults(handler=_cmd_worker)

    broker = sub.add_parser(
        "broker", help="run a broker on 127.0.0.1: the embedded Tansu, or Apache Kafka (--kafka)"
    )
    broker.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: free)")
    broker.add_argument(
        "--kafka",
        action="store_true",
        help="one Apache Kafka KRaft node (Java 17+; jars from Maven Central on first use)",
    )
    broker.add_argument(
        "--data-dir", help="with --kafka: keep the node's data here (default: temporary)"
    )
    broker.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="with --kafka: KRaft nodes (3: a cluster, replication 3, min.insync.replicas 2)",
    )
    broker.add_argument(
        "--secure",
        action="store_true",
        help="with --kafka: TLS listeners, SASL_SSL clients (SCRAM-SHA-512), ACLs per role "
        "(prints security=DIR: the CA and each role's LOOPFUSE_* variables)",
    )
    broker.set_defaults(handler=_cmd_broker)

    demo = sub.add_parser("demo", help="embedded broker + worker + simulated fleet, live view")
    demo.add_argument("--bootstrap", help="use an existing Kafka instead of the embedded broker")
    demo.add_argument(
        "--kafka", action="store_true", help="start Apache Kafka (one KRaft node) for the demo"
    )
    demo.add_argument("--duration", type=float, default=30.0, help="seconds of simulated traffic")
    demo.add_argument("--sessions", type=int, default=40, help="concurrent simulated sessions")
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--no-tui", action="store_true", help="plain progress lines")
    demo.set_defaults(handler=_cmd_demo)

    audit = sub.add_parser(
        "audit", help="summarise loop events (JSONL or the topic); --html writes a report"
    )
    audit.add_argument(
        "events", nargs="?", help="JSONL with loop_event lines (loopfuse replay output), or -"
    )
    audit.add_argument("--bootstrap", help="read the loop-events topic of this Kafka instead")
    audit.add_argument("--topic", help="loop-events topic (default LOOPFUSE_TOPIC_LOOP_EVENTS)")
    audit.add_argument(
        "--since", help="from this event time: 2026-11-30T10:00:00Z, epoch ms, or 2h / 30m / 7d ago"
    )
    audit.add_argument("--until", help="before this event time (same forms as --since)")
    audit.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
    audit.add_argument("--top", type=int, default=10, help="rows of the top-N tables (10)")
    audit.set_defaults(handler=_cmd_audit)

    whatif = sub.add_parser(
        "whatif",
        help="judge a window of the input topics with a candidate config; diff with what "
        "was issued",
    )
    whatif.add_argument(
        "--config", required=True, metavar="CANDIDATE", help="the candidate config file"
    )
    whatif.add_argument("--bootstrap", help="Kafka bootstrap servers (LOOPFUSE_BOOTSTRAP_SERVERS)")
    whatif.add_argument(
        "--tenant",
        action="append",
        help="only this tenant (repeatable; '' is the default tenant; default: every "
        "served one, LOOPFUSE_TENANTS)",
    )
    whatif.add_argument(
        "--since", help="window start (broker time): 6h / 30m / 7d ago, ISO time or epoch ms"
    )
    whatif.add_argument(
        "--from", dest="from_time", metavar="TIME", help="window start: 2026-11-30T10:00:00Z"
    )
    whatif.add_argument(
        "--offsets",
        action="append",
        metavar="TOPIC:PARTITION=OFFSET",
        help="window start per partition (repeatable or comma-separated; other partitions "
        "from --since/--from, else not read)",
    )
    whatif.add_argument("--until", help="window end (same forms as --since; default: now)")
    whatif.add_argument(
        "--max-bytes",
        type=int,
        default=256 * 1024 * 1024,
        help="input record bytes at most, and as many output bytes (268435456)",
    )
    whatif.add_argument(
        "--max-seconds", type=float, default=300.0, help="wall-clock budget of the reads (300)"
    )
    whatif.add_argument("--json", action="store_true", help="print the result as JSON")
    whatif.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
    whatif.add_argument(
        "--calls", type=int, default=20, help="changed calls shown per session in the terminal (20)"
    )
    whatif.set_defaults(handler=_cmd_whatif)

    tail = sub.add_parser("tail", help="follow loop events (or verdicts) from now on")
    tail.add_argument("--bootstrap", help="Kafka bootstrap servers (LOOPFUSE_BOOTSTRAP_SERVERS)")
    tail.add_argument(
        "--verdicts",
        action="store_true",
        help="follow verdicts, not loop events (the reply topics and the verdicts topic)",
    )
    tail.add_argument(
        "--topic",
        help="follow this topic only (default: the loop-events topic; with --verdicts, every "
        "topic verdicts go to)",
    )
    tail.add_argument("--agent", action="append", help="only this agent id (repeatable)")
    tail.add_argument("--session", action="append", help="only this session key (repeatable)")
    tail.add_argument("--detector", action="append", help="only this detector (repeatable)")
    tail.add_argument("--count", type=int, help="stop after this many lines")
    tail.set_defaults(handler=_cmd_tail)

    notify = sub.add_parser(
        "notify", help="POST critical loop events to a webhook (Slack-compatible JSON)"
    )
    notify.add_argument("--bootstrap", help="Kafka bootstrap servers (LOOPFUSE_BOOTSTRAP_SERVERS)")
    notify.add_argument("--topic", help="loop-events topic (default LOOPFUSE_TOPIC_LOOP_EVENTS)")
    notify.add_argument(
        "--group",
        default="loopfuse-notify",
        help="consumer group: it resumes from the group's commits (loopfuse-notify)",
    )
    # Refused with a reason (a URL in argv is visible in ps), and defined so that argparse
    # does not take --webhook as an abbreviation of --webhook-file.
    notify.add_argument("--webhook", help=argparse.SUPPRESS)
    notify.add_argument(
        "--webhook-file",
        type=Path,
        metavar="FILE",
        help="file holding the webhook URL (else LOOPFUSE_NOTIFY_WEBHOOK_URL)",
    )
    notify.add_argument(
        "--dead-letter-file",
        type=Path,
        metavar="FILE",
        help="JSON lines of given-up loop events (LOOPFUSE_NOTIFY_DEAD_LETTER_FILE, "
        "default loopfuse-notify-dead-letters.jsonl)",
    )
    notify.add_argument(
        "--metrics-port", type=int, default=6068, help="/metrics on 127.0.0.1:PORT (0: none)"
    )
    notify.add_argument(
        "--retries", type=int, default=None, help="attempts after the first (default: no limit)"
    )
    notify.add_argument(
        "--backoff", type=float, default=0.5, help="first retry delay in s, doubling to 30 (0.5)"
    )
    notify.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout per attempt (s)")
    notify.add_argument(
        "--give-up-after",
        type=float,
        default=3600.0,
        help="s after the first attempt: then the dead-letter file (3600)",
    )
    notify.add_argument("--concurrency", type=int, default=4, help="posts in flight (4)")
    notify.add_argument(
        "--coalesce-seconds",
        type=float,
        default=60.0,
        help="repeats of one loop within this after a post go as one post with a count (60)",
    )
    notify.add_argument("--rate", type=float, default=1.0, help="posts per second (1; 0: no limit)")
    notify.add_argument("--burst", type=int, default=5, help="posts at once above --rate (5)")
    notify.add_argument(
        "--max-pending",
        type=int,
        default=10_000,
        help="records held before reading pauses (10000)",
    )
    notify.add_argument(
        "--drain-seconds",
        type=float,
        default=10.0,
        help="on SIGTERM, s to finish posts in flight before stopping (10)",
    )
    notify.add_argument(
        "--include-args",
        action="store_true",
        help="also post the call's args (only there with includePayloadsInLoopEvents)",
    )
    notify.set_defaults(handler=_cmd_notify)

    hooks = sub.add_parser(
        "hooks", help="Claude Code, Codex CLI and Gemini CLI through their hooks: serve, install"
    )
    hooks_sub = hooks.add_subparsers(dest="hooks_command", required=True)
    serve = hooks_sub.add_parser(
        "serve",
        help="answer the agents' hooks on loopback (Kafka settings: LOOPFUSE_* variables)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="bind address (127.0.0.1)")
    serve.add_argument("--port", type=int, default=7311, help="port (7311; 0: a free one)")
    serve.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="a bearer token every request must carry (needed to bind beyond loopback)",
    )
    serve.add_argument(
        "--host-id",
        "--agent-id-prefix",
        dest="host_id",
        type=_host_id,
        help="this machine's id in every session key: <agent>:<host id>:<session id>",
    )
    serve.add_argument(
        "--verdict-timeout",
        type=float,
        default=5.0,
        help="s a tool call waits for its verdict, under the agent's hook timeout (5)",
    )
    serve.add_argument(
        "--fail-closed",
        action="append",
        choices=["claude", "codex", "gemini", "all"],
        help="no verdict in time: block this agent's call (repeatable; default: run it)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        default=8 * 1024 * 1024,
        help="largest hook body read; larger ones get the fail policy (8 MiB)",
    )
    serve.add_argument(
        "--raw-payloads",
        action="store_true",
        help="send tool arguments and outputs to Kafka, not their hashes",
    )
    serve.add_argument(
        "--codex-interrupt",
        action="store_true",
        help="SIGINT the Codex process whose run loopfuse aborted (Linux; opt-in)",
    )
    serve.set_defaults(handler=_cmd_hooks_serve)
    for name, handler in (("install", _cmd_hooks_install), ("uninstall", _cmd_hooks_uninstall)):
        command = hooks_sub.add_parser(
            name,
            help=f"{'merge loopfuse hooks into' if name == 'install' else 'remove them from'} "
            "an agent's settings file",
        )
        command.add_argument("agent", choices=["claude", "codex", "gemini"])
        where = command.add_mutually_exclusive_group()
        where.add_argument(
            "--user", action="store_false", dest="project", help="~/.<agent>/ (the default)"
        )
        where.add_argument(
            "--project", action="store_true", dest="project", help="./.<agent>/ of this project"
        )
        if name == "install":
            command.add_argument(
                "--fail-closed",
                action="store_true",
                help="the service down, slow or failing blocks the call (Claude: onFailure "
                "block; Codex, Gemini: curl -f ... || exit 2)",
            )
            command.add_argument(
                "--url", default="http://127.0.0.1:7311", help="the service (http://127.0.0.1:7311)"
            )
            command.add_argument(
                "--token-env",
                metavar="VAR",
                help="send the bearer token from this environment variable (never written)",
            )
        command.set_defaults(handler=handler, project=False)
    unit = hooks_sub.add_parser(
        "unit", help="print a systemd user unit (or --launchd: a launchd agent) for the service"
    )
    unit.add_argument("--launchd", action="store_true", help="a macOS launchd agent")
    unit.add_argument(
        "serve_args", nargs=argparse.REMAINDER, help="flags for hooks serve (after --)"
    )
    unit.set_defaults(handler=_cmd_hooks_unit)

    config = sub.add_parser("config", help="inspect a loopDetection config file")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser(
        "check", help="validate FILE and print the resolved config per agent"
    )
    check.add_argument("file", metavar="FILE", help="OpenClaw-shaped JSON/JSON5 config file")
    check.add_argument("--agent", help="only this agent id")
    check.set_defaults(handler=_cmd_config_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="loopfuse: %(message)s",
        stream=sys.stderr,
    )
    if args.handler in (_cmd_tail, _cmd_audit, _cmd_notify, _cmd_whatif):
        from loopfuse.streams.broker_access import EXPLAINED_HERE

        for handler in logging.getLogger().handlers:  # they print the one line instead
            handler.addFilter(EXPLAINED_HERE)
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not _explained(args.command, exc):
            raise
        return 2


def _explained(command: str, exc: Exception) -> bool:
    """Print one line for an invalid config file or invalid settings; False for any
    other exception. The classes are looked up where loaded, not imported: an
    exception of a class that no module loaded cannot have been raised."""
    config = sys.modules.get("loopfuse.schemas.config")
    if config is not None and isinstance(exc, config.ConfigError):
        print(f"loopfuse {command}: invalid config: {exc}", file=sys.stderr)
        return True
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(exc, pydantic.ValidationError):
        # settings from LOOPFUSE_* variables or flags
        from loopfuse.streams.settings import describe_settings_error

        print(f"loopfuse {command}: {describe_settings_error(exc)}", file=sys.stderr)
        return True
    return False


if __name__ == "__main__":
    raise SystemExit(main())
