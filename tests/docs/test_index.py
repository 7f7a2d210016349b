"""The front pages list everything: every page of the site's navigation is linked from
docs/index.md and from the README, and every extra of pyproject.toml is named in both."""

from __future__ import annotations

import re

import pytest

from tests.docs.test_snippets import DOCS

ROOT = DOCS.parent
#: A page in mkdocs.yml's `nav:` (`- Title: page.md`).
NAV_PAGE = re.compile(r"^\s*- .*?:\s*([\w./-]+\.md)\s*$", re.M)


def nav_pages() -> list[str]:
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    return [page for page in NAV_PAGE.findall(nav) if page != "index.md"]


def extras() -> list[str]:
    """The names of `[project.optional-dependencies]` (no TOML parser on Python 3.10)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]
    return sorted(re.findall(r"^([\w-]+) = \[", section, re.M))


def test_the_navigation_is_read() -> None:
    assert {"quickstart.md", "dashboard.md", "results.md", "cli.md"} <= set(nav_pages())
    assert {"postgres", "web", "dev"} <= set(extras())


@pytest.mark.parametrize(("front", "prefix"), [("docs/index.md", ""), ("README.md", "docs/")])
def test_every_page_is_linked_from_the_front_pages(front: str, prefix: str) -> None:
    text = (ROOT / front).read_text()
    missing = [page for page in nav_pages() if f"]({prefix}{page})" not in text]
    assert not missing, f"{front} does not link {missing}"


@pytest.mark.parametrize("front", ["docs/index.md", "README.md"])
def test_every_extra_is_named_on_the_front_pages(front: str) -> None:
    text = (ROOT / front).read_text()
    missing = [extra for extra in extras() if f"txtasks[{extra}]" not in text]
    assert not missing, f"{front} does not name the extras {missing}"
