"""`txtasks worker --loop`: uvloop when installed, the standard loop on request."""

from __future__ import annotations

import asyncio
import importlib.util

import click
import pytest

from txtasks.cli import common


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_auto_takes_uvloop_when_it_is_installed_and_runs_on_it() -> None:
    assert importlib.util.find_spec("uvloop") is not None  # a dev dependency (txtasks[fast])
    assert common.loop_choice("auto") == "uvloop"
    assert common.run_async(loop_module, loop="uvloop").startswith("uvloop")
    assert common.run_async(loop_module, loop=common.loop_choice("asyncio")).startswith("asyncio")


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert common.loop_choice("auto") == "asyncio"
    with pytest.raises(click.BadParameter, match=r"txtasks\[fast\]"):
        common.loop_choice("uvloop")
