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


async def test_a_contract_method_by_its_name_before_the_roles_warns_and_forwards() -> None:
    """`driver.task_get` (before the roles) is `driver.tasks.task_get`, with a warning; a
    name that never was a contract method is still an AttributeError."""
    import pytest

    from tests.integration.conformance import new  # a row, as the conformance suites make it

    driver = MemoryDriver()
    with pytest.warns(DeprecationWarning, match=r"driver\.tasks\.task_insert_many"):
        [task_id] = await driver.task_insert_many([new(1)])  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match=r"driver\.tasks\.task_get"):
        row = await driver.task_get(task_id)  # type: ignore[attr-defined]
    assert row is not None and row.id == task_id
    assert set(contract.ROLE_OF) == set().union(*map(public_methods, contract.ROLES.values()))
    with pytest.raises(AttributeError, match="no attribute 'task_gets'"):
        driver.task_gets  # type: ignore[attr-defined]  # noqa: B018
