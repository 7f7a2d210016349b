"""The public face stays exact: every export is deliberate."""

import txtasks


def test_all_is_sorted_and_complete() -> None:
    assert txtasks.__all__ == sorted(txtasks.__all__)
    public = {
        name
        for name in vars(txtasks)
        if not name.startswith("_") and not isinstance(getattr(txtasks, name), type(txtasks))
    }
    assert public == set(txtasks.__all__) - {"__version__"}


def test_package_is_typed() -> None:
    from importlib import resources

    assert resources.files("txtasks").joinpath("py.typed").is_file()
