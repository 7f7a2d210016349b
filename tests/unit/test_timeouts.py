"""Where the database timeouts come from, and what is refused."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from txtasks.driver import driver_for_url
from txtasks.driver.timeouts import Timeouts
from txtasks.errors import ConfigurationError

URL = make_url("postgresql://app:pw@db/app?connect_timeout=3&command_timeout=60&sslmode=require")


def test_url_parameters_are_read_and_taken_out_of_the_url() -> None:
    timeouts, url = Timeouts.resolve(URL, env={})
    assert (timeouts.connect, timeouts.command) == (3.0, 60.0)
    assert dict(url.query) == {"sslmode": "require"}  # the drivers never see txtasks' own


def test_given_timeouts_win_over_the_url_and_the_environment_over_both(
    caplog: pytest.LogCaptureFixture,
) -> None:
    given = Timeouts(connect=7, command=None)
    assert Timeouts.resolve(URL, given, env={})[0] == given
    env = {"TXTASKS_DB_COMMAND_TIMEOUT": "12.5", "TXTASKS_DB_KEEPALIVE_IDLE": "10"}
    with caplog.at_level("INFO", "txtasks"):
        timeouts = Timeouts.resolve(URL, given, env=env)[0]
    assert (timeouts.connect, timeouts.command, timeouts.keepalive_idle) == (7, 12.5, 10.0)
    # never silently: one line names the variable that changed what the code set
    assert [r.getMessage() for r in caplog.records] == [
        "timeouts: TXTASKS_DB_COMMAND_TIMEOUT=12.5 used, over the Timeouts given in code "
        "(unset it to use the code's)"
    ]
    assert Timeouts.resolve(URL, env={"TXTASKS_DB_COMMAND_TIMEOUT": "off"})[0].command is None


def test_defaults_notice_a_dead_connection_within_thirty_seconds() -> None:
    timeouts = Timeouts()
    assert timeouts.command is not None and timeouts.command <= 30
    assert timeouts.dead_after <= 30


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "soon"])
def test_a_bad_value_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(ConfigurationError, match=r"timeouts\.connect"):
        Timeouts.resolve(make_url(f"sqlite:///x.db?connect_timeout={value}"), env={})
    with pytest.raises(ConfigurationError, match=r"timeouts\.keepalive_idle"):
        Timeouts.resolve(URL, env={"TXTASKS_DB_KEEPALIVE_IDLE": value})


def test_a_driver_carries_its_timeouts_to_the_database_drivers() -> None:
    driver = driver_for_url(str(URL), timeouts=Timeouts(connect=2.5, command=9))
    assert driver.db.connect_args(sync=False)["timeout"] == 2.5
    settings = driver.db.connect_args(sync=False)["server_settings"]
    assert settings["idle_in_transaction_session_timeout"] == "9000"
    assert driver.db.connect_args(sync=True)["connect_timeout"] == 3
    mysql = driver_for_url("mysql://app:pw@db/app?command_timeout=20")
    assert mysql.db.connect_args(sync=True)["read_timeout"] == 20.0
    assert "command_timeout" not in mysql.url.query
    listed = {"group_concat_max_len": 1 << 30}  # the keys' rows come back as one JSON value
    assert mysql.db.session_settings(mariadb=True) == {  # type: ignore[attr-defined]
        **listed,
        "innodb_lock_wait_timeout": 20,
        "idle_transaction_timeout": 20,
    }
    assert mysql.db.session_settings(mariadb=False) == {**listed, "innodb_lock_wait_timeout": 20}  # type: ignore[attr-defined]


def test_the_worker_flags_reach_every_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from txtasks.cli.main import main

    monkeypatch.setenv("TXTASKS_DB_COMMAND_TIMEOUT", "30")  # restored after the test
    runner = CliRunner()
    bad = runner.invoke(main, ["worker", "x:app", "--db-command-timeout", "inf"])
    assert bad.exit_code == 2
    assert "--db-command-timeout" in bad.output and "finite number" in bad.output
    # a valid flag is stored where every driver made afterwards reads it
    with monkeypatch.context() as patched:
        patched.setattr("txtasks.cli.common.load_app", lambda spec: 1 / 0)
        runner.invoke(main, ["worker", "x:app", "--db-command-timeout", "7.5"])
        assert driver_for_url("sqlite:///x.db").timeouts.command == 7.5
