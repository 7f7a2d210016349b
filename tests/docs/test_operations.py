"""The cleaner's documentation matches the code: docs/operations.md and docs/periodic.md.

- The settings reference of operations.md has one row per setting of every sweep config and
  of every service the cleaner hosts (and `Keep`, and `CleanerConfig`'s other fields), named as `--set` takes it (`rescuer.grace`,
  `retention.keep.dead`, `health_port`), and no row for a setting that does not exist. A new
  setting, a removed one or a changed default fails here.
- The rendering rule of a default, in the second column: the first code span of the cell is
  `render(default)`: `None`, `True`/`False`, a whole number without `.0` (`5`, `604800`), other
  numbers as `repr` (`0.5`), text in double quotes (`"0.0.0.0"`), `()` and `{}` for an empty
  tuple and mapping, an enum as its quoted value (`"latest"`). A "(N days)" after it must agree.
- Each sweep has a section naming every counter of its result; each `--set` the pages show
  applies to a `CleanerConfig`; the `--config` and `--once` examples run as shown.
- periodic.md's option table lists every parameter of `App.periodic` with its default, and what
  the page says about fire times (intervals, weekdays, daylight saving) holds.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import re
import shutil
import sys
import typing
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from cleaner import CleanerConfig, Keep
from cleaner.daemon import SWEEPS, UNSET
from cleaner.settings import SETTABLE, cleaner_services, config_with
from tests.docs.test_snippets import DOCS, SNIPPETS, fenced_blocks, run
from txtasks import App
from txtasks.periodic import Schedule

OPERATIONS = DOCS / "operations.md"
PERIODIC = DOCS / "periodic.md"
DAY = 86400
CODE = re.compile(r"`([^`]*)`")
SET_ASSIGNMENT = re.compile(r"--set[ =]([\w.]+=[^\s`]+)")


def render(value: Any) -> str:
    """A default as the pages show it (the rule in the module docstring)."""
    if value is None or isinstance(value, bool):
        return str(value)
    if isinstance(value, enum.Enum):
        return render(value.value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple) and not value:
        return "()"
    if isinstance(value, Mapping) and not value:
        return "{}"
    raise AssertionError(f"no rendering rule for {value!r}")


def table_rows(text: str) -> dict[str, list[str]]:
    """Body rows of the Markdown tables whose first cell is one code span: name -> other cells."""
    rows: dict[str, list[str]] = {}
    lines = text.splitlines()
    for line, following in zip(lines, [*lines[1:], ""], strict=True):
        if not line.startswith("|") or following.startswith("|--"):
            continue  # not a table row, or a table's header
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = re.fullmatch(r"`([^`]+)`", cells[0])
        if name:
            assert name.group(1) not in rows, f"two rows for {name.group(1)}"
            rows[name.group(1)] = cells[1:]
    return rows


def shown_default(cell: str, setting: str) -> str:
    found = CODE.search(cell)
    assert found, f"{setting}: no default in {cell!r}"
    return found.group(1)


def expected_settings() -> dict[str, Any]:
    """Every setting the reference must list, by the name `--set` takes, with its default."""
    defaults = CleanerConfig()
    settings: dict[str, Any] = {}
    configs = {sweep: getattr(defaults, sweep) for sweep in SETTABLE}
    for sweep, config in {**configs, **cleaner_services(defaults)}.items():
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            if isinstance(value, Keep):
                for k in dataclasses.fields(value):
                    settings[f"{sweep}.{f.name}.{k.name}"] = getattr(value, k.name)
            else:
                settings[f"{sweep}.{f.name}"] = value
    for f in dataclasses.fields(CleanerConfig):
        if f.name not in SETTABLE and getattr(defaults, f.name) is not UNSET:  # deprecated
            settings[f.name] = getattr(defaults, f.name)
    return settings


def sections(text: str) -> dict[str, str]:
    """Text of each `### heading` up to the next heading, by the heading's first word."""
    parts = re.split(r"^#{2,3} (.*)$", text, flags=re.M)
    return {title.split()[0]: body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


# -- the settings reference --------------------------------------------------------------------


def test_every_setting_is_listed_with_its_default() -> None:
    rows = table_rows(OPERATIONS.read_text())
    expected = expected_settings()
    missing = sorted(set(expected) - set(rows))
    assert missing == [], f"operations.md lists no row for {missing}"
    for setting, value in expected.items():
        shown = shown_default(rows[setting][0], setting)
        assert shown == render(value), f"{setting}: the page says {shown}, the default is {value!r}"
        days = re.search(r"\((\d+) days?\)", rows[setting][0])
        if days:
            assert int(days.group(1)) * DAY == value, f"{setting}: {days.group(0)} is wrong"


def test_no_setting_is_listed_that_does_not_exist() -> None:
    rows = table_rows(OPERATIONS.read_text())
    named = {*SWEEPS, *cleaner_services(CleanerConfig())}
    sweep_rows = {name for name in rows if name.split(".")[0] in named and "." in name}
    assert sweep_rows - set(expected_settings()) == set()


def test_every_setting_can_be_set_as_listed() -> None:
    """Each row's name is accepted by `--set` (those that take a value from the command line)."""
    samples = {int: "7", float: "7"}
    for setting, value in expected_settings().items():
        if "." not in setting or isinstance(value, Mapping):
            continue  # health fields have flags; retention.queues needs --config
        sample = samples.get(type(value), "a,b" if isinstance(value, tuple) else "none")
        config_with(CleanerConfig(), f"{setting}={sample}")


def test_each_sweep_has_a_section_naming_its_counters() -> None:
    text = sections(OPERATIONS.read_text())
    services = {name: type(s) for name, s in cleaner_services(CleanerConfig()).items()}
    for name, sweep in {**SWEEPS, **services}.items():
        assert name in text, f"operations.md has no section '### {name}'"
        result = typing.get_type_hints(sweep.run_once)["return"]
        for counter in dataclasses.fields(result):
            assert f"`{counter.name}" in text[name], f"{name}: counter {counter.name} not named"


def test_shown_set_assignments_apply() -> None:
    shown = [
        assignment
        for page in (OPERATIONS, PERIODIC, DOCS / "configuration.md")
        for assignment in SET_ASSIGNMENT.findall(page.read_text())
        if not assignment.startswith("SWEEP.")
    ]
    assert len(shown) >= 5
    config = CleanerConfig()
    for assignment in shown:
        config = config_with(config, assignment)


def test_cli_runs_the_documented_config_and_once(tmp_path: Path) -> None:
    """`--config operations_cleaner_config:config` and `--once --only ...` as the page shows."""
    for name in ("shop.py", "operations_cleaner_config.py"):
        shutil.copy(SNIPPETS / name, tmp_path / name)
    url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    txtasks = [sys.executable, "-m", "txtasks"]
    run([*txtasks, "migrate"], tmp_path, url)

    spec = ["cleaner", "shop:app", "--once"]
    configured = run(
        [*txtasks, *spec, "--config", "operations_cleaner_config:config"], tmp_path, url
    )
    assert list(json.loads(configured.stdout)) == [
        "rescuer",
        "archiver",
        "retention",
        "periodic",
        "stats",
        "publisher",
        "staged_purge",
    ]

    only = run([*txtasks, *spec, "--only", "retention", "--only", "archiver"], tmp_path, url)
    assert json.loads(only.stdout) == {
        "archiver": {"archived": 0},
        "retention": {"purged": {}, "keys_forgotten": 0, "topic_drops_forgotten": 0},
    }
    page = OPERATIONS.read_text()
    assert "$ txtasks cleaner shop:app --once --only retention --only archiver" in page


# -- periodic tasks ----------------------------------------------------------------------------


def test_periodic_options_are_listed_with_their_defaults() -> None:
    rows = table_rows(PERIODIC.read_text())
    parameters = list(inspect.signature(App.periodic).parameters.values())[1:]
    for parameter in parameters:
        assert parameter.name in rows, f"periodic.md lists no option {parameter.name}"
        cell = rows[parameter.name][0]
        if parameter.default is inspect.Parameter.empty:
            assert "required" in cell, parameter.name
        elif CODE.search(cell):
            assert shown_default(cell, parameter.name) == render(parameter.default), parameter.name
        else:  # explained in words ("the task's queue"): the signature leaves it to the task
            assert parameter.default is None, parameter.name


def test_headers_shown_are_the_ones_fired_tasks_carry() -> None:
    source = (Path(__file__).resolve().parents[2] / "cleaner" / "firer.py").read_text()
    headers = set(re.findall(r'"(txtasks-[\w-]+)"', source))
    rows = table_rows(PERIODIC.read_text())
    assert headers == {"txtasks-periodic", "txtasks-fire-time"}
    assert headers <= set(rows)


def fires(schedule: Schedule, after: datetime, count: int) -> list[datetime]:
    times = []
    for _ in range(count):
        after = schedule.next_after(after)
        times.append(after)
    return times


def test_interval_fire_times_are_multiples_since_the_epoch() -> None:
    five = Schedule("s", "t", every=300)
    assert fires(five, datetime(2030, 1, 1, 10, 3, 7), 2) == [
        datetime(2030, 1, 1, 10, 5),
        datetime(2030, 1, 1, 10, 10),
    ]
    daily = Schedule("s", "t", every=timedelta(days=1).total_seconds())
    assert daily.next_after(datetime(2030, 1, 1, 10, 0)) == datetime(2030, 1, 2)
    weekly = Schedule("s", "t", every=timedelta(days=7).total_seconds())
    assert weekly.next_after(datetime(2030, 1, 1)).strftime("%A %H:%M") == "Thursday 00:00"


def test_weekdays_behave_as_the_page_says() -> None:
    """periodic.md: day-of-week numbers count as in crontab(5), names mean the same."""
    sunday = datetime(2030, 1, 6, 12, 0)
    workdays = ["Mon", "Tue", "Wed", "Thu", "Fri"]
    for cron in ("0 8 * * mon-fri", "0 8 * * 1-5"):
        schedule = Schedule("s", "t", cron=cron)
        assert [t.strftime("%a") for t in fires(schedule, sunday, 5)] == workdays
    for cron in ("0 8 * * 0", "0 8 * * 7"):
        assert fires(Schedule("s", "t", cron=cron), sunday, 1)[0].strftime("%a") == "Sun"
    text = " ".join(PERIODIC.read_text().split())
    assert "`0` and `7` are Sunday, `1-5` is Monday to Friday" in text


def test_daylight_saving_behaves_as_the_page_says() -> None:
    """Europe/Paris: 02:30 does not exist on 2030-03-31 and occurs twice on 2030-10-27."""
    schedule = Schedule("s", "t", cron="30 2 * * *", timezone="Europe/Paris")
    spring = fires(schedule, datetime(2030, 3, 30, 12, 0), 2)
    assert spring == [datetime(2030, 3, 31, 1, 30), datetime(2030, 4, 1, 0, 30)]  # 03:30 CEST
    autumn = fires(schedule, datetime(2030, 10, 26, 12, 0), 3)
    assert autumn == [
        datetime(2030, 10, 27, 0, 30),  # 02:30 CEST
        datetime(2030, 10, 27, 1, 30),  # 02:30 CET
        datetime(2030, 10, 28, 1, 30),
    ]


def test_pages_link_each_other() -> None:
    index = (DOCS / "index.md").read_text()
    assert "(operations.md)" in index and "(periodic.md)" in index
    for page in DOCS.glob("*.md"):
        text = page.read_text()
        assert "later release" not in text, f"{page.name} still says the cleaner comes later"
        for target, anchor in re.findall(r"\]\(([\w-]+\.md)#([\w-]+)\)", text):
            headings = re.findall(r"^#+ (.*)$", (DOCS / target).read_text(), flags=re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor in slugs, f"{page.name}: no heading #{anchor} in {target}"


def test_fences_are_closed() -> None:
    for page in (OPERATIONS, PERIODIC):
        text = page.read_text()
        assert text.count("```") % 2 == 0, page.name
        assert fenced_blocks(text), page.name
