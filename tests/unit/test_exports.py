"""The public face stays exact: every export is deliberate, and served lazily."""

import subprocess
import sys

import txtasks


def test_all_is_sorted_and_complete() -> None:
    assert txtasks.__all__ == sorted(txtasks.__all__)
    for name in txtasks.__all__:
        assert getattr(txtasks, name) is not None, name
    public = {
        name
        for name in dir(txtasks)
        if not name.startswith("_") and not isinstance(getattr(txtasks, name), type(txtasks))
    }
    assert public == set(txtasks.__all__) - {"__version__"}


def test_every_export_imports_in_a_fresh_interpreter_and_nothing_else_does() -> None:
    code = (
        "import txtasks\n"
        "from txtasks import *\n"
        "missing = [n for n in txtasks.__all__ if n not in globals()]\n"
        "assert not missing, missing\n"
        "try:\n"
        "    txtasks.NotAnExport\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "module 'txtasks' has no attribute 'NotAnExport'"


def test_package_is_typed() -> None:
    from importlib import resources

    assert resources.files("txtasks").joinpath("py.typed").is_file()
