"""What `pip install txtasks` gets: a build requirement that can read pyproject.toml, and a
wheel with both packages typed (`py.typed`) and the dashboard's files."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests import pace
from tests.servers import in_ci

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = (ROOT / "pyproject.toml").read_text()
#: The packages the wheel ships; each is typed.
PACKAGES = ("txtasks", "cleaner")


def setuptools_minimum() -> tuple[int, ...]:
    build = PYPROJECT.split("[build-system]", 1)[1].split("\n[", 1)[0]
    found = re.search(r'"setuptools>=([\d.]+)"', build)
    assert found, "the build requires no minimum setuptools"
    return tuple(int(part) for part in found.group(1).split("."))


def test_the_build_requirement_reads_the_license_expression() -> None:
    """`license = "MIT"` (an SPDX expression, PEP 639) needs setuptools 77 or later: an older
    one refuses pyproject.toml."""
    if re.search(r'^license = "', PYPROJECT, re.M):
        assert setuptools_minimum() >= (77,)


def test_every_package_is_typed_in_the_source() -> None:
    for package in PACKAGES:
        assert (ROOT / package / "py.typed").is_file(), package
        assert re.search(rf'^{package} = \[[^\]]*"py.typed"', PYPROJECT, re.M), package


@pytest.mark.timeout(300)
def test_the_wheel_ships_typed_packages_and_the_dashboard(tmp_path: Path) -> None:
    """Build the wheel as pip does (an isolated build environment with the declared
    setuptools), from a copy of the source (a build leaves `build/` behind), and look inside."""
    source = tmp_path / "source"
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
    for name in listed.stdout.splitlines():
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
        capture_output=True,
        text=True,
        timeout=pace.seconds(280),
        check=False,
    )
    offline = "No matching distribution" in result.stderr or "Could not find" in result.stderr
    if result.returncode != 0 and offline and not in_ci():
        pytest.skip("no package index to fetch the build's setuptools from")
    assert result.returncode == 0, result.stderr
    [wheel] = wheels.glob("txtasks-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in PACKAGES:
        assert f"{package}/py.typed" in names, package
        assert f"{package}/__init__.py" in names, package
    assert "txtasks/cleaner.py" in names
    assert (
        "txtasks/web/templates/_rows.html" in names and "txtasks/web/static/dashboard.css" in names
    )
    assert not any(name.startswith("tests/") for name in names)
