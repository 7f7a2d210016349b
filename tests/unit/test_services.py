"""Services (txtasks.services): found through the entry points of installed packages, hosted by
workers and cleaners alike, reporting to `txtasks status`; the hosts import nothing of Spark;
the deprecated settings of the Spark publisher and purge still work, with a warning."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import ClassVar

import pytest

import cleaner
from cleaner import ArchiverConfig, Cleaner, CleanerConfig, ServiceSweep
from cleaner.cli import config_from
from cleaner.settings import config_with
from txtasks import App, MemoryDriver, Worker, WorkerConfig
from txtasks import services as services_module
from txtasks.cli.status import snapshot_grids, snapshot_take
from txtasks.driver import Driver
from txtasks.errors import ConfigurationError
from txtasks.services import (
    GROUP,
    OWN,
    ServiceConfig,
    ServiceHost,
    ServiceResult,
    StatusSection,
    discovered,
    services_for,
)
from txtasks.spark import DeferredPublisher, PublishResult, StagedPurge
from txtasks.testing import run_until_empty

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Counted(ServiceResult):
    passes: int = 0


@dataclass(frozen=True)
class Counting(ServiceConfig):
    """A service of a package installed by the `installed` fixture: on its first pass in a
    host it enqueues a task naming the host, and it reports to `txtasks status`."""

    name: ClassVar[str] = "counting"
    hosts: ClassVar[Collection[str]] = ("worker", "cleaner")
    activity: ClassVar[str] = "counting"
    passes: ClassVar[dict[str, int]] = {}
    ran: ClassVar[asyncio.Event | None] = None

    interval: float = 0.01

    async def run_once(self, host: ServiceHost) -> Counted:
        done = self.passes[host.kind] = self.passes.get(host.kind, 0) + 1
        if done == 1:
            await host.app.aenqueue("hosts.note", {"host": host.kind})
            host.wake("notes")
        if self.ran is not None:
            self.ran.set()
        return Counted(passes=int(done == 1))

    async def status(self, driver: Driver, now: datetime) -> StatusSection:
        shown = (("worker", str(self.passes.get("worker", 0))),)
        return StatusSection("counting", dict(self.passes), "passes", ("host", "passes"), shown)


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A package on the path whose entry point contributes `Counting`."""
    dist = tmp_path / "txtasks_counting-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: txtasks-counting\nVersion: 1.0\n")
    entry = f"[{GROUP}]\ncounting = tests.unit.test_services:Counting\n"
    (dist / "entry_points.txt").write_text(entry)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(Counting, "passes", {})
    services_module._entry_points.cache_clear()
    yield
    services_module._entry_points.cache_clear()


def notes_app() -> tuple[App, list[str]]:
    app = App("services-test", driver=MemoryDriver())
    noted: list[str] = []
    app.task(name="hosts.note", queue="notes")(lambda payload: noted.append(payload["host"]))
    return app, noted


# -- discovery and hosts -----------------------------------------------------------------------


@pytest.mark.usefixtures("installed")
async def test_a_burst_worker_runs_an_installed_service_and_the_tasks_it_makes() -> None:
    app, noted = notes_app()

    stats = await run_until_empty(app)

    assert noted == ["worker"]  # a burst runs the services when the queues look empty
    assert stats.outcomes == {"completed": 1}


@pytest.mark.usefixtures("installed")
async def test_a_worker_runs_an_installed_service_in_a_loop_of_its_own() -> None:
    app, _ = notes_app()
    worker = Worker(app, WorkerConfig(poll_interval=0.01))
    ran = asyncio.Event()
    Counting.ran = ran
    try:
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(ran.wait(), 10)
        worker.stop()
        await running
    finally:
        Counting.ran = None
    assert Counting.passes["worker"] >= 1
    assert "txtasks-counting" in {loop.get_name() for loop in worker._loops}


@pytest.mark.usefixtures("installed")
async def test_the_cleaner_runs_an_installed_service_as_a_sweep() -> None:
    app, noted = notes_app()
    daemon = Cleaner(app, CleanerConfig(reannouncer=None))
    assert list(daemon.sweeps)[-3:] == ["counting", "publisher", "staged_purge"]

    results = await daemon.run_once()

    assert results["counting"] == Counted(passes=1)
    assert (await run_until_empty(app, services={"counting": None})).outcomes == {"completed": 1}
    assert noted == ["cleaner"]
    configured = config_with(CleanerConfig(), "counting.interval=5")
    assert configured.services["counting"] == Counting(interval=5)
    assert "counting" not in Cleaner(app, config_from(None, (), (), ("counting",))).sweeps


@pytest.mark.usefixtures("installed")
def test_configured_services_replace_add_or_turn_off_the_installed_ones() -> None:
    @dataclass(frozen=True)
    class Mine(Counting):
        name: ClassVar[str] = "mine"

    chosen = services_for("worker", {"counting": Counting(interval=2), "mine": Mine()})
    assert chosen == [Counting(interval=2), DeferredPublisher(), Mine()]
    assert services_for("worker", {"counting": None, "publisher": None}) == []
    assert [s.name for s in services_for("cleaner", {})] == [
        "counting",
        "publisher",
        "staged_purge",
    ]


@pytest.mark.parametrize(
    ("configured", "message"),
    [
        ({"nothing": None}, "no service 'nothing' to turn off"),
        ({"other": DeferredPublisher()}, "the service is named 'publisher'"),
        ({"staged_purge": StagedPurge()}, "'staged_purge' runs in a cleaner, not in a worker"),
        ({"x": object()}, "is not a service"),
    ],
)
def test_bad_services_are_named(configured: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        services_for("worker", configured)  # type: ignore[arg-type]


def test_txtasks_own_entry_points_are_those_pyproject_declares() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    table = text.split(f'[project.entry-points."{GROUP}"]\n')[1].split("\n\n")[0]
    declared = dict(line.replace('"', "").split(" = ") for line in table.splitlines())
    assert declared == OWN
    assert discovered() == {"publisher": DeferredPublisher(), "staged_purge": StagedPurge()}


# -- txtasks status ----------------------------------------------------------------------------


@pytest.mark.usefixtures("installed")
async def test_status_shows_the_sections_of_services() -> None:
    Counting.passes["worker"] = 3
    snapshot = await snapshot_take(MemoryDriver(), keys=0)

    document = snapshot.to_json()
    assert document["counting"] == {"worker": 3}
    assert document["deferred"] == {"rows": 0, "commits": 0, "oldest_commit_age": None}
    grids = {grid.title: grid for grid in snapshot_grids(snapshot)}
    assert grids["passes"].rows == [["worker", "3"]]
    assert "deferred Spark writes to publish" not in grids  # nothing waits: no table


# -- the hosts import nothing of Spark ---------------------------------------------------------


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_worker_cleaner_and_status_import_nothing_of_spark() -> None:
    files = [
        *(ROOT / "txtasks" / "worker").glob("*.py"),
        *(ROOT / "cleaner").glob("*.py"),
        ROOT / "txtasks" / "cli" / "status.py",
    ]
    assert len(files) > 15
    for path in files:
        spark = {m for m in imported_modules(path) if m.startswith("txtasks.spark")}
        assert spark == set(), f"{path.relative_to(ROOT)} imports {sorted(spark)}"


# -- the deprecated settings -------------------------------------------------------------------


def test_worker_publish_deferred_warns_and_still_turns_the_publisher_off() -> None:
    with pytest.warns(DeprecationWarning, match=r"services=\{'publisher': None\}"):
        config = WorkerConfig(publish_deferred=False)
    assert config.services == {"publisher": None}
    app, _ = notes_app()
    assert Worker(app, config)._services.services == []
    with pytest.warns(DeprecationWarning):
        assert WorkerConfig(publish_deferred=True).services == {}
    assert [s.name for s in Worker(app)._services.services] == ["publisher"]


def test_cleaner_publisher_names_warn_and_still_configure_the_publisher() -> None:
    with pytest.warns(DeprecationWarning, match="cleaner.PublisherConfig is deprecated"):
        publisher_config = cleaner.PublisherConfig
    with pytest.warns(DeprecationWarning, match="cleaner.Publisher is deprecated"):
        publisher = cleaner.Publisher
    with pytest.warns(DeprecationWarning, match="cleaner.PublishResult is deprecated"):
        assert cleaner.PublishResult is PublishResult
    assert publisher_config is DeferredPublisher and publisher is ServiceSweep
    app = App(driver=MemoryDriver())
    with pytest.warns(DeprecationWarning, match="CleanerConfig.publisher is deprecated"):
        config = CleanerConfig(publisher=publisher_config(batch_size=2))
    assert Cleaner(app, config).sweeps["publisher"].config == DeferredPublisher(batch_size=2)
    with pytest.warns(DeprecationWarning, match="CleanerConfig.publisher is deprecated"):
        assert "publisher" not in Cleaner(app, CleanerConfig(publisher=None)).sweeps
    assert publisher(app, publisher_config()).name == "publisher"


def test_archiver_staged_settings_warn_and_still_configure_the_purge() -> None:
    with pytest.warns(DeprecationWarning, match="staged_purge"):
        archiver = ArchiverConfig(staged_batch_size=5, staged_after=1800)
    config = CleanerConfig(archiver=archiver)
    assert config.services == {"staged_purge": StagedPurge(batch_size=5, after=1800)}
    assert config.archiver == ArchiverConfig()
    sweep = Cleaner(App(driver=MemoryDriver()), config).sweeps["staged_purge"]
    assert sweep.config == StagedPurge(batch_size=5, after=1800)
    with pytest.warns(DeprecationWarning):
        config = config_with(CleanerConfig(), "archiver.staged_after=60")
    assert config.services["staged_purge"] == StagedPurge(after=60)
