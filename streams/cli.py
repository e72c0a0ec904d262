"""The ``loopfuse`` command line: replay, worker, broker, demo."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from schemas.config import ConfigError, DetectionConfigFile, load_config


def _load(path: str | None) -> DetectionConfigFile | None:
    return None if path is None else load_config(path)


def _cmd_replay(args: argparse.Namespace) -> int:
    from streams.replay import run_replay

    config = _load(args.config)
    return run_replay(args.events, config, sys.stdout.buffer, progress=args.progress)


def _cmd_worker(args: argparse.Namespace) -> int:
    from streams.settings import Settings
    from streams.worker import run_worker

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
    settings = Settings(**overrides)  # type: ignore[arg-type]
    # run_worker loads the config file first and exits 2 naming the key path.
    return run_worker(settings, loglevel=args.loglevel)


def _cmd_broker(args: argparse.Namespace) -> int:
    from streams.broker import run_broker_cli

    return run_broker_cli(args.port)


def _cmd_demo(args: argparse.Namespace) -> int:
    from streams.demo import run_demo

    return run_demo(args)


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

    broker = sub.add_parser("broker", help="run the embedded Kafka-protocol broker (Tansu)")
    broker.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: free)")
    broker.set_defaults(handler=_cmd_broker)

    demo = sub.add_parser("demo", help="embedded broker + worker + simulated fleet, live view")
    demo.add_argument("--bootstrap", help="use an existing Kafka instead of the embedded broker")
    demo.add_argument("--duration", type=float, default=30.0, help="seconds of simulated traffic")
    demo.add_argument("--sessions", type=int, default=40, help="concurrent simulated sessions")
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--no-tui", action="store_true", help="plain progress lines")
    demo.set_defaults(handler=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="loopfuse: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.handler(args))
    except ConfigError as exc:
        print(f"loopfuse {args.command}: invalid config: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # settings from LOOPFUSE_* variables or flags
        from streams.settings import describe_settings_error

        print(f"loopfuse {args.command}: {describe_settings_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
