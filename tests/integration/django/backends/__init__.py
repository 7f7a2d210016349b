"""Django's database backends on a driver other than the one Django picks, beside Django's own
in one test process: Django imports its driver once (psycopg before psycopg2; `MySQLdb`, which
is mysqlclient unless PyMySQL stands in for it), so each of these packages is a private copy
of Django's backend imported while `sys.modules` shows it only its driver.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

_MISSING = object()


def _under(name: str, module: ModuleType | None) -> dict[str, ModuleType | None]:
    """`module` and its submodules imported so far, as `name` and `name.*`."""
    if module is None:
        return {name: None}
    prefix = f"{module.__name__}."
    subs = {
        f"{name}.{sub[len(prefix) :]}": m
        for sub, m in sys.modules.items()
        if sub.startswith(prefix)
    }
    return {name: module, **subs}


def backend_copy(package: str, stand_ins: dict[str, ModuleType | None]) -> Any:
    """`package.base` (a Django backend) imported afresh while each name of `stand_ins` is
    that module with its submodules (None: not importable); `sys.modules` and the parent
    package are as before after, so Django's own backend and the drivers are untouched."""

    def swapped(name: str) -> bool:
        return any(name == top or name.startswith(f"{top}.") for top in (package, *stand_ins))

    saved = {name: module for name, module in sys.modules.items() if swapped(name)}
    parent_name, _, child = package.rpartition(".")
    parent = importlib.import_module(parent_name)
    attribute = getattr(parent, child, _MISSING)
    for name in saved:
        del sys.modules[name]
    for name, module in stand_ins.items():
        sys.modules.update(_under(name, module))  # type: ignore[arg-type]  # None: hidden
    try:
        return importlib.import_module(f"{package}.base")
    finally:
        for name in [name for name in sys.modules if swapped(name)]:
            del sys.modules[name]
        sys.modules.update(saved)
        if attribute is _MISSING:
            vars(parent).pop(child, None)
        else:
            setattr(parent, child, attribute)
