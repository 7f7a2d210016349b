"""How slowly this machine runs today, and the suite's time bounds stretched to match.

The suite's bounds (how long `waiting.until` waits, pytest-timeout's limit per test, how long
a process may take to exit) were set on a machine running two busy processes at full speed.
A shared or throttled machine runs the same tests several times slower; a bound set for the
fast one would then fail tests for the machine's speed, never for what they check. So a run
measures its pace once, before any test starts: two processes each count a fixed loop at once
(the suite keeps every core busy), and the slower one's time over the reference machine's is
the pace, never below `FLOOR` and at most `MAX_PACE`.

The floor: the suite has run 2.3x slower than on the reference machine on a machine whose loop
measured as fast (the servers, workers and JVMs a run starts contend for its two cores in ways
one loop does not show), so the bounds allow for that much everywhere.

Only bounds stretch: what a test asserts is the same at any pace, and a test that passes
returns as soon as what it awaits happens. The pace is measured by the first pytest process
and handed to xdist's workers and every process a test starts through `TXTASKS_TEST_PACE`;
setting that variable chooses the pace instead (`TXTASKS_TEST_PACE=1` keeps every bound as
written, for a fast machine).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

ENV = "TXTASKS_TEST_PACE"

#: Iterations of the measuring loop, and the seconds the reference machine (2-vCPU EPYC, both
#: cores free) takes for them, the slower of two processes counting at once.
LOOP = 3_000_000
REFERENCE_SECONDS = 0.2

#: The least pace of a run: the slowdown seen where the loop measured none.
FLOOR = 2.5
#: A pace past this is a machine too slow to test on: the bounds stop stretching there.
MAX_PACE = 6.0

_COUNT = (
    "import time\n"
    "t = time.perf_counter()\n"
    f"for _ in range({LOOP}): pass\n"
    "print(time.perf_counter() - t)\n"
)


def measure(rounds: int = 3) -> float:
    """The pace of this machine now: the median over `rounds` of two loops counted at once."""
    seconds = []
    for _ in range(rounds):
        procs = [
            subprocess.Popen([sys.executable, "-c", _COUNT], stdout=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        seconds.append(max(float(proc.communicate()[0]) for proc in procs))
    return min(MAX_PACE, max(FLOOR, statistics.median(seconds) / REFERENCE_SECONDS))


def pace() -> float:
    """This run's pace: `TXTASKS_TEST_PACE` if set, else measured now and set there."""
    given = os.environ.get(ENV)
    if given:
        try:
            value = float(given)
        except ValueError:
            raise ValueError(f"{ENV}={given!r}: expected a number, e.g. 1 or 2.5") from None
        if value <= 0:
            raise ValueError(f"{ENV}={given!r}: expected a number above 0")
        return value
    value = round(measure(), 2)
    os.environ[ENV] = str(value)
    return value


def seconds(bound: float) -> float:
    """`bound` seconds, set on the reference machine, at this run's pace."""
    return bound * pace()


#: The repository's root: the processes a test starts import the tests' applications from it.
REPO = Path(__file__).resolve().parents[1]


def child_environ() -> dict[str, str]:
    """This process's environment for a process a test starts: without the TXTASKS_* settings
    (the test chooses those) but with the run's pace, so that the child neither measures its
    own (seconds of CPU, on a machine already busy) nor stretches its bounds differently; the
    repository first on its PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXTASKS_") or k == ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env
