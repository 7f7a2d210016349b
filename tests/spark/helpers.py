"""Functions the Spark tests run inside executors (importable there as tests.spark.helpers)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from pyspark import TaskContext

from tests import pace

#: Seconds a gated row waits for its gate file before failing the partition.
GATE_PATIENCE = pace.seconds(60.0)


def gated(value: int, gate: str, gated_value: int) -> int:
    """Identity, except that `gated_value` waits until the file `gate` exists."""
    if value == gated_value:
        deadline = time.monotonic() + GATE_PATIENCE
        while not Path(gate).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {gate} never opened")
            time.sleep(0.02)
    return value


def failing(value: int, bad_value: int) -> int:
    """Identity, except that `bad_value` fails its partition (every attempt)."""
    if value == bad_value:
        raise ValueError(f"row {value} is bad")
    return value


def crash_first_attempt(value: int, bad_value: int, marker: str) -> int:
    """Identity, except that the first attempt of the task holding `bad_value` dies (its
    Python worker exits) after the rows before it were read; the retry goes through."""
    context = TaskContext.get()
    if value == bad_value and context is not None and context.attemptNumber() == 0:
        Path(marker).write_text(str(context.partitionId()))
        os._exit(1)
    return value


def slow_first_attempt(value: int, slow_value: int, markers: str) -> int:
    """Identity, except for the row `slow_value`: its task's first attempt waits until another
    attempt of the task reached that row; every attempt then waits for the file `go` (both
    files in the directory `markers`), so that the test sees the write at that moment."""
    context = TaskContext.get()
    if value != slow_value or context is None:
        return value
    folder = Path(markers)
    attempt = context.attemptNumber()
    (folder / f"attempt-{attempt}").write_text(str(context.partitionId()))
    if attempt == 0:
        _wait_for(folder, lambda: any(folder.glob("attempt-[1-9]*")), "another attempt")
    _wait_for(folder, lambda: (folder / "go").exists(), "the go file")
    return value


def _wait_for(folder: Path, done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GATE_PATIENCE
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} never came ({folder})")
        time.sleep(0.02)
