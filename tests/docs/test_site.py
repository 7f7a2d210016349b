"""The documentation site builds with `mkdocs build --strict`: no warning of any kind.

Strict mode fails on a broken link or anchor between pages, a page missing from the nav, and an
API reference entry (mkdocstrings) that does not resolve. Needs the `dev` extra's mkdocs-material
and mkdocstrings[python]; without them the test is skipped, or fails when `CI` is `true` or `1`.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import pace
from tests.docs.test_snippets import DOCS
from tests.servers import in_ci

ROOT = DOCS.parent
TIMEOUT = pace.seconds(300)
NEEDED = {
    "mkdocs": "mkdocs",
    "material": "mkdocs-material",
    "mkdocstrings": "mkdocstrings",
    "mkdocstrings_handlers.python": "mkdocstrings-python",
}


def missing_packages() -> list[str]:
    missing = []
    for module, package in NEEDED.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(package)
    return missing


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built site: `mkdocs build --strict` must succeed."""
    missing = missing_packages()
    if missing:
        reason = f"not installed: {', '.join(missing)} (pip install -e '.[dev]')"
        if in_ci():
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{output}"
    assert "WARNING" not in output, output
    return out


def built_page(site: Path, page: Path) -> Path:
    """Where a docs/*.md page lands with mkdocs' directory URLs."""
    return site / "index.html" if page.stem == "index" else site / page.stem / "index.html"


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_page_is_built(site: Path, page: Path) -> None:
    assert built_page(site, page).is_file()


def test_key_pages(site: Path) -> None:
    index = (site / "index.html").read_text()
    assert "txtasks" in index
    assert "Usage: txtasks worker [OPTIONS] APP" in (site / "cli" / "index.html").read_text()
    api = (site / "api" / "index.html").read_text()
    for name in ("txtasks.App", "txtasks.Worker", "txtasks.testing", "txtasks.cleaner.Cleaner"):
        assert f'id="{name}"' in api, f"the API reference has no entry for {name}"
    assert (site / "search" / "search_index.json").is_file()


def test_snippet_files_are_not_published(site: Path) -> None:
    """The snippets are shown inside the pages; they are not files of the site."""
    assert not (site / "snippets").exists()
