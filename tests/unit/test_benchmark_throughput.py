"""The throughput benchmark's pure parts: the ratios against the targets and how they read, the
raw loops' shapes, and the server CPU read from /proc (a fake one here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks import server_cpu
from tests.benchmarks.throughput import raw_shape
from tests.benchmarks.throughput_report import (
    Series,
    Target,
    enqueue_ratios,
    met,
    target_ratio,
    targets_block,
)


def series(rates: dict[str, float]) -> dict[str, Series]:
    return {k: Series(k, k, k.split("/")[0], rates=[v]) for k, v in rates.items()}


def test_a_ratio_of_rates_must_reach_its_bound() -> None:
    target = Target("mysql", "tuned / raw", "txtasks/tuned", "raw", 0.7)
    runs = series({"mysql/txtasks/tuned": 7_000.0, "mysql/raw": 10_000.0})
    value = target_ratio(runs, target)
    assert value is not None
    assert value == pytest.approx(0.7)
    assert met(value, target) == "yes"
    assert met(0.69, target) == "NO"


def test_a_ratio_of_times_per_task_must_stay_under_its_bound() -> None:
    target = Target("sqlite", "single", "enqueue/single", "enqueue/single-raw-sa", 1.3, True)
    # txtasks 100 tasks/s, by hand 125: txtasks takes 1.25x the time per task
    runs = series({"sqlite/enqueue/single": 100.0, "sqlite/enqueue/single-raw-sa": 125.0})
    value = target_ratio(runs, target)
    assert value is not None
    assert value == pytest.approx(1.25)
    assert met(value, target) == "yes"
    assert met(1.31, target) == "NO"


def test_a_missing_case_gives_no_ratio() -> None:
    target = Target("mysql", "tuned / raw", "txtasks/tuned", "raw", 0.7)
    assert target_ratio(series({"mysql/txtasks/tuned": 1.0}), target) is None


def test_the_targets_block_says_yes_or_no_per_backend() -> None:
    runs = series(
        {
            "postgresql/txtasks/defaults": 50.0,
            "postgresql/txtasks/tuned": 95.0,
            "postgresql/pgqueuer/tuned": 40.0,
            "postgresql/raw": 100.0,
            "sqlite/txtasks/tuned": 60.0,
            "sqlite/txtasks/tuned-no-archive": 65.0,
            "sqlite/raw": 100.0,
        }
    )
    lines = targets_block(runs)
    assert lines[0] == (
        "- PostgreSQL, burn-down: txtasks defaults / raw limit 0.50x ≥ 0.5x: yes; "
        "txtasks tuned / raw limit 0.95x ≥ 0.9x: yes; "
        "txtasks tuned / PGQueuer tuned 2.38x ≥ 2.5x: NO"
    )
    assert lines[1] == "- SQLite, burn-down: txtasks tuned / raw limit 0.60x ≥ 0.7x: NO"
    assert lines[2] == (
        "- For the record (no target): txtasks tuned without the archive / raw limit, SQLite: 0.65x"
    )
    assert len(lines) == 3  # MariaDB was not measured: no line


def test_the_enqueue_ratios_are_a_row_per_backend() -> None:
    runs = series(
        {
            "mysql/enqueue/single": 100.0,
            "mysql/enqueue/single-raw-sa": 140.0,
            "mysql/enqueue/bulk": 30_000.0,
            "mysql/enqueue/bulk-raw": 15_000.0,
            "sqlite/enqueue/bulk": 10_000.0,
            "sqlite/enqueue/bulk-raw": 20_000.0,
        }
    )
    table = enqueue_ratios(runs)
    assert table[2:] == [
        "| MariaDB | 1.40x | NO | 2.00x | yes |",
        "| SQLite | - | - | 0.50x | NO |",
    ]
    assert enqueue_ratios({}) == []


def test_a_raw_shape_is_processes_claimers_and_batch() -> None:
    assert raw_shape("2x4x500") == (2, 4, 500)
    with pytest.raises(ValueError):
        raw_shape("1x0x500")
    with pytest.raises(ValueError):
        raw_shape("4x500")


def stat_line(pid: int, comm: str, ppid: int, utime: int, stime: int, cu: int, cs: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime ...
    return f"{pid} ({comm}) S {ppid} 1 1 0 -1 0 0 0 0 0 {utime} {stime} {cu} {cs} 20 0 1 0\n"


def test_a_stat_line_gives_the_parent_and_the_ticks() -> None:
    # a command name may hold spaces and parentheses
    line = stat_line(7, "postgres: app (idle)", 3, 10, 5, 100, 50)
    assert server_cpu.stat_fields(line) == (3, 165)


def fake_proc(tmp_path: Path, processes: list[str]) -> Path:
    for line in processes:
        entry = tmp_path / line.split()[0]
        entry.mkdir()
        (entry / "stat").write_text(line)
    (tmp_path / "self").mkdir()  # not a pid: skipped
    return tmp_path


def test_a_server_is_its_process_and_its_children(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        [
            stat_line(100, "postmaster", 1, 10, 10, 300, 200),  # 500: backends waited for
            stat_line(101, "postgres: walwriter", 100, 7, 3, 0, 0),
            stat_line(102, "postgres: app bench", 100, 40, 20, 0, 0),
            stat_line(200, "python", 1, 999, 999, 0, 0),  # not the server's
            stat_line(201, "psql", 200, 5, 5, 0, 0),
        ],
    )
    assert server_cpu.tree_ticks(100, proc) == 20 + 500 + 10 + 60


def test_the_server_listening_on_a_port_is_the_root_holder(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        [
            stat_line(100, "postmaster", 1, 0, 0, 0, 0),
            stat_line(101, "postgres: app bench", 100, 0, 0, 0, 0),
            stat_line(300, "other", 1, 0, 0, 0, 0),
        ],
    )
    (proc / "net").mkdir()
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (proc / "net" / "tcp").write_text(
        header
        # 127.0.0.1:48432 (0xBD30) listening, socket inode 555; the same port connected: 556
        + "   0: 0100007F:BD30 00000000:0000 0A 00000000:00000000 00:00000000 00000000   0        0 555\n"
        + "   1: 0100007F:BD30 0100007F:9C40 01 00000000:00000000 00:00000000 00000000   0        0 556\n"
        # another port listening: 127.0.0.1:5432
        + "   2: 0100007F:1538 00000000:0000 0A 00000000:00000000 00:00000000 00000000   0        0 777\n"
    )
    for pid, target in ((100, "socket:[555]"), (101, "socket:[555]"), (300, "socket:[777]")):
        (proc / str(pid) / "fd").mkdir()
        (proc / str(pid) / "fd" / "3").symlink_to(target)
    assert server_cpu.listening_pid(48432, proc) == 100
    assert server_cpu.listening_pid(5432, proc) == 300
    assert server_cpu.listening_pid(1, proc) is None
