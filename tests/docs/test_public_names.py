"""The documentation and the example application use only txtasks' public names.

Every snippet in docs/snippets, every Python file of deploy/ and every ```python block of the
Markdown pages and of README.md is parsed; an import of a txtasks (or cleaner) module or name
outside `PUBLIC`, or an attribute of `txtasks` outside it (`txtasks.driver.urls...` after
`import txtasks`), fails the test. What a user copies from the docs then keeps working when
internals move.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from tests.docs.test_snippets import DOCS, SNIPPETS, python_blocks

ROOT = DOCS.parent
#: The packages whose names are checked; other imports (sqlalchemy, the example's own) are not.
CHECKED = ("txtasks", "cleaner")


def module_all(module: str) -> set[str]:
    """A module's `__all__`, read from its source without importing it (pyspark, aio-pika)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, f"no module {module}"
    tree = ast.parse(Path(spec.origin).read_text())
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return set(ast.literal_eval(node.value))  # type: ignore[union-attr]
    raise AssertionError(f"{module} defines no __all__")


#: module -> the names the docs and the example may import from it.
PUBLIC: dict[str, set[str]] = {
    "txtasks": module_all("txtasks"),
    "txtasks.testing": module_all("txtasks.testing"),
    "txtasks.spark": module_all("txtasks.spark"),
    "txtasks.web": module_all("txtasks.web"),  # the dashboard (extra `web`)
    "txtasks.services": module_all("txtasks.services"),
    "txtasks.contrib.django": module_all(
        "txtasks.contrib.django"
    ),  # extra `django`  # to write a service of one's own
    # the cleaner's configuration and sweeps (not the top-level `cleaner`, a name others use)
    "txtasks.cleaner": module_all("txtasks.cleaner"),
    # A notifier of your own, for another reconnect policy (docs/wakeups.md).
    "txtasks.wakeup.amqp": {"AmqpNotifier"},
}


def checked(module: str) -> bool:
    return module.split(".")[0] in CHECKED


def violations(source: str) -> list[str]:
    """Each import or `txtasks.` attribute outside PUBLIC, as `line: what`."""
    tree = ast.parse(source)
    found = []
    modules: dict[str, str] = {}  # a local name bound to a checked module -> that module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not checked(alias.name):
                    continue
                if alias.name not in PUBLIC:
                    found.append(f"{node.lineno}: import {alias.name}")
                bound = alias.asname or alias.name.split(".")[0]
                modules[bound] = alias.name if alias.asname else bound
        elif isinstance(node, ast.ImportFrom) and node.module and checked(node.module):
            if node.module not in PUBLIC:
                found.append(f"{node.lineno}: from {node.module} import ...")
                continue
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if alias.name in PUBLIC[node.module] or submodule in PUBLIC:
                    if submodule in PUBLIC:
                        modules[alias.asname or alias.name] = submodule
                    continue
                found.append(f"{node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = modules.get(node.value.id)
            if module is None:
                continue
            if node.attr not in PUBLIC[module] and f"{module}.{node.attr}" not in PUBLIC:
                found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


# -- the checker -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "from txtasks.driver.urls import url_sync",
        "from txtasks.driver.sqlite import sqlite_connection_setup",
        "from txtasks.schema.migrate import migrate",
        "import txtasks.driver",
        "from txtasks import driver",
        "from txtasks import url_sync",
        "from txtasks.testing import Worker",
        "from cleaner.rescuer import Rescuer",
        "from cleaner import CleanerConfig, Keep",
        "from txtasks.wakeup.amqp import RECONNECT_BACKOFF",
        "import txtasks\ntxtasks.driver.urls.url_sync('sqlite://')",
        "import txtasks as t\nt.schema",
        "import txtasks.testing\ntxtasks.testing.MemoryDriver\ntxtasks.errors",
    ],
)
def test_the_checker_finds_an_internal_name(source: str) -> None:
    assert violations(source) != []


@pytest.mark.parametrize(
    "source",
    [
        "from txtasks import App, create_engine, migrate",
        "from txtasks.testing import run_until_empty",
        "from txtasks.spark import register",
        "from txtasks.cleaner import CleanerConfig, Keep",
        "from txtasks.wakeup.amqp import AmqpNotifier",
        "import txtasks\ntxtasks.create_async_engine(url)\ntxtasks.testing.enqueued(app)",
        "import txtasks.testing as t\nt.run_until_empty(app)",
        "from txtasks import testing\ntesting.payloads([])",
        "from sqlalchemy import create_engine\nimport os.path",
    ],
)
def test_the_checker_lets_public_names_through(source: str) -> None:
    assert violations(source) == []


def test_the_public_set_holds_the_engines_and_migrate() -> None:
    assert {"App", "create_engine", "create_async_engine", "migrate"} <= PUBLIC["txtasks"]
    assert "run_until_empty" in PUBLIC["txtasks.testing"]


# -- the docs and the example ------------------------------------------------------------------


def python_files() -> list[Path]:
    return sorted(SNIPPETS.glob("*.py")) + sorted((ROOT / "deploy").rglob("*.py"))


def markdown_pages() -> list[Path]:
    return [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]


def test_there_is_something_to_check() -> None:
    assert len(list(SNIPPETS.glob("*.py"))) >= 10
    assert ROOT / "deploy" / "example" / "shop.py" in python_files()
    assert any(python_blocks(ROOT / "README.md"))


@pytest.mark.parametrize("path", python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_file_uses_only_public_names(path: Path) -> None:
    assert violations(path.read_text()) == [], f"{path.relative_to(ROOT)}: internal names"


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_python_blocks_use_only_public_names(page: Path) -> None:
    for _reference, body in python_blocks(page):
        assert violations(body) == [], f"{page.relative_to(ROOT)}: internal names"
