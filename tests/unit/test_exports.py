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


def test_applications_import_the_cleaner_from_txtasks() -> None:
    """`txtasks.cleaner` names the sidecar's classes (the top-level `cleaner` is a name other
    projects use), and the core never imports it."""
    import cleaner
    import txtasks.cleaner

    assert txtasks.cleaner.__all__ == sorted(txtasks.cleaner.__all__) == sorted(cleaner.__all__)
    for name in txtasks.cleaner.__all__:
        assert getattr(txtasks.cleaner, name) is getattr(cleaner, name), name
    code = (
        "import sys, txtasks, txtasks.worker, txtasks.testing, txtasks.cli.main\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cleaner'"
        " or m == 'txtasks.cleaner'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
