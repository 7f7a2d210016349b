"""The in-memory driver is composed of one object per role of the contract, sharing one store."""

from __future__ import annotations

import inspect

from txtasks.driver import Driver, MemoryDriver
from txtasks.driver import base as contract


def public_methods(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, callable) if not name.startswith("_")}


def test_each_role_is_an_object_of_its_own_on_the_one_store() -> None:
    memory = MemoryDriver()
    driver: Driver = memory  # mypy: the in-memory driver is a `Driver`, every role included
    roles = [driver.tasks, driver.claims, driver.topics, driver.control, driver.admin]
    roles += [driver.sweeps, driver.processes, driver.dashboard]
    assert len({id(role) for role in roles}) == len(roles)
    assert all(role.store is memory.store for role in roles)  # type: ignore[attr-defined]


def test_each_role_has_the_methods_of_its_protocol_and_no_others() -> None:
    driver = MemoryDriver()
    for name in (
        "tasks",
        "claims",
        "topics",
        "control",
        "admin",
        "sweeps",
        "processes",
        "dashboard",
    ):
        protocol = getattr(contract, name.capitalize())
        assert public_methods(type(getattr(driver, name))) == public_methods(protocol), name
