"""Per-call cost of the decision table on a looping history: Python against Rust (issue 27).

One call judged on a run's history of 30 looping records (the default historySize),
three ways, each the median of ``--rounds`` passes of ``--number`` calls:

* ``detectors.detect``, the Python engine's;
* the native core (native/src/engine/detectors.rs) on records it holds, timed inside
  Rust (``_native.time_detect_history``: the records converted once, then only the core);
* the native core through its test-only PyO3 entry point (``_native.detect_history``):
  every record read from its Python attributes on every call, the Detection built as a
  tuple. That is the cost the native engine of the next stage does not pay (it keeps the
  records in Rust), shown to bound it.

    python bench/detectors.py [--number 20000] [--rounds 5]

The last line is ``python_ns=<float> native_core_ns=<float> native_pyo3_ns=<float>``
for the generic-repeat loop (the first workload).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from collections.abc import Callable
from functools import partial
from typing import Any

from loopfuse.streams.engine.config import ResolvedConfig
from loopfuse.streams.engine.detectors import detect
from loopfuse.streams.engine.fingerprint import result_fingerprint, signature
from loopfuse.streams.engine.history import Record
from loopfuse.streams.engine.native import NATIVE
from loopfuse.streams.engine.state import run_key

TOKEN = "0123456789abcdef0123456789abcdef"
RUN = "agent-1:run-7"


def _loops() -> list[tuple[str, list[Record], tuple[Any, ...]]]:
    """(name, history, the rest of detect's arguments) of each looping workload."""
    run = run_key(RUN)
    config = ResolvedConfig(enabled=True)
    read = signature("read", TOKEN)
    same = result_fingerprint("ok")
    # the same read with the same outcome, 30 times: warned at 10, blocked at 20 (here
    # the breaker's 30 decides: every counter is scanned to the end)
    repeat = [Record("read", read, run, 0, same, None, i) for i in range(30)]
    write = signature("write", TOKEN)
    # read, write, read, write...: the ping-pong tail is the whole history
    pong = [
        Record("read", read, run, 0, same, None, i)
        if i % 2 == 0
        else Record("write", write, run, 0, result_fingerprint("w"), None, i)
        for i in range(30)
    ]
    return [
        ("generic repeat", repeat, ("read", read, TOKEN, False, config, RUN, 30)),
        ("ping-pong", pong, ("read", read, TOKEN, False, config, RUN, 15)),
    ]


def _median_ns(call: Callable[[], object], number: int, rounds: int) -> float:
    times = timeit.repeat(call, number=number, repeat=rounds)
    return statistics.median(times) / number * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20_000, help="calls per timed pass")
    parser.add_argument("--rounds", type=int, default=5, help="passes; the median is reported")
    opts = parser.parse_args()
    if NATIVE is None:
        sys.exit("the native engine is not built (python -m loopfuse.streams.local.native_engine)")
    figures: list[tuple[float, float, float]] = []
    for name, history, call in _loops():
        found = detect(history, *call)
        native = NATIVE.detect_history(history, *call)
        assert found is not None and native[1] == found.detector, (native, found)
        python_ns = _median_ns(partial(detect, history, *call), opts.number, opts.rounds)
        pyo3_ns = _median_ns(
            partial(NATIVE.detect_history, history, *call), opts.number, opts.rounds
        )
        core_ns = statistics.median(
            NATIVE.time_detect_history(history, *call, opts.number) for _ in range(opts.rounds)
        )
        figures.append((python_ns, core_ns, pyo3_ns))
        print(
            f"{name} ({len(history)} records, {found.level} {found.detector}): "
            f"Python {python_ns:,.0f} ns/call, native core {core_ns:,.0f} ns/call "
            f"({python_ns / core_ns:.1f}x), through PyO3 {pyo3_ns:,.0f} ns/call "
            f"({python_ns / pyo3_ns:.1f}x)"
        )
    python_ns, core_ns, pyo3_ns = figures[0]
    print(f"python_ns={python_ns:.0f} native_core_ns={core_ns:.0f} native_pyo3_ns={pyo3_ns:.0f}")


if __name__ == "__main__":
    main()
