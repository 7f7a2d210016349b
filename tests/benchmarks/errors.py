"""What recording a failed attempt's error costs the worker: `error_text` (the exception, its
traceback and its causes, as a task row keeps them) of an earlier commit against today's, in
the same process, on exceptions raised 3, 20 and 200 calls deep, and one raised while
handling another (a chain of two). A completed attempt never calls it.

Each case calls the function `--calls` times per round; rounds alternate between the two, and
the best round of each counts. Reported: microseconds per call. A report, not a pass/fail test:

    python -m tests.benchmarks.errors --base a4e25fb --calls 2000 --rounds 7
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
from collections.abc import Callable

from txtasks.policy import error_text


def error_text_before(base: str) -> Callable[[BaseException], str]:
    """`error_text` of txtasks/policy.py at commit `base`."""
    source = subprocess.check_output(["git", "show", f"{base}:txtasks/policy.py"])
    module = types.ModuleType("txtasks_policy_before")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"<{base}:txtasks/policy.py>", "exec"), module.__dict__)
    return module.error_text  # type: ignore[no-any-return]


def _raise_at(depth: int) -> None:
    if depth > 1:
        _raise_at(depth - 1)
    raise ValueError(f"raised {depth} calls deep")


def caught(depth: int, *, chained: bool = False) -> BaseException:
    try:
        try:
            _raise_at(depth)
        except ValueError as first:
            if chained:
                raise RuntimeError("the handler gave up") from first
            raise
    except Exception as exc:  # the exception is what is measured
        return exc
    raise AssertionError("unreachable")


def per_call(function: Callable[[BaseException], str], exc: BaseException, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        function(exc)
    return (time.perf_counter() - started) / calls * 1e6


def main(base: str, calls: int, rounds: int) -> None:
    before = error_text_before(base)
    cases = {
        "3 calls deep": caught(3),
        "20 calls deep": caught(20),
        "200 calls deep": caught(200),
        "20 deep, raised from another": caught(20, chained=True),
    }
    print(f"calls per round: {calls}, rounds: {rounds}, base: {base}")
    print(f"| exception | {base} (µs) | today (µs) | today's text (chars) |")
    print("|---|---:|---:|---:|")
    for name, exc in cases.items():
        best = {"before": float("inf"), "today": float("inf")}
        for _ in range(rounds):
            best["before"] = min(best["before"], per_call(before, exc, calls))
            best["today"] = min(best["today"], per_call(error_text, exc, calls))
        size = len(error_text(exc))
        print(f"| {name} | {best['before']:.1f} | {best['today']:.1f} | {size:,} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="a4e25fb", help="the commit to compare with")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    main(options.base, options.calls, options.rounds)
