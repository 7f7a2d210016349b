"""The servers go away mid-run and come back:

- PostgreSQL stopped with `pg_ctl stop -m immediate` and started again (a private server):
  workers and the cleaner live through it and finish every committed task, nothing runs twice
  beyond the tasks in flight at the crash, nothing is dead-lettered.
- RabbitMQ stopped and started again (a private broker): tasks keep running by polling, and
  wake-ups resume within 5 s of the broker's return, also for an application that started
  while it was down.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from sqlalchemy import func, select

from tests.chaos.harness import Chaos, metric, metrics_port
from tests.chaos.private_pg import PrivatePostgres
from tests.integration.rabbitmq_private import PrivateRabbitMQ
from txtasks.schema.tables import tasks

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

WORKERS = 3
#: Seconds the database stays down.
DOWNTIME = 3.0
#: Seconds wake-ups may take to resume once the broker is back (issue item 4).
WAKEUP_RESUME = 5.0
#: Workers' poll interval in the broker scenario: long, so that a wake-up is told from a poll.
SLOW_POLL = 3.0


def processing(h: Chaos) -> int:
    with h.engine.connect() as conn:
        query = select(func.count()).select_from(tasks).where(tasks.c.state == "processing")
        return int(conn.execute(query).scalar_one())


def test_postgresql_crash_and_restart_loses_nothing(chaos: Callable[..., Chaos]) -> None:
    with PrivatePostgres.running() as pg:
        h = chaos(pg.url)
        workers = [h.worker() for _ in range(WORKERS)]
        cleaner = h.cleaner()
        enqueuer = h.enqueuer(1200, pause=0.008, max_ms=200)  # tasks in flight at the crash
        h.wait_until(lambda: h.finished_count() >= 200, 20, watch=workers)
        in_flight = processing(h)
        pg.crash()
        time.sleep(DOWNTIME)  # the outage itself, not a wait for state
        pg.start()
        settled = h.settle(45, enqueuers=[enqueuer])
        report = h.report()
        alive = [p.name for p in [*workers, cleaner] if p.alive]
        took = h.stop_all()
        print(
            f"postgresql restart: {report.summary()}; {in_flight} in flight at the crash; "
            f"settled {settled}; alive before SIGTERM {alive}; stop {took}"
        )
        h.engine.dispose()
        logs = {f"{p.name} {p.pid}": p.stderr for p in [*workers, cleaner]}
    h.expect(len(alive) == WORKERS + 1, f"only {alive} lived through the restart")
    for name, log in logs.items():  # one line per fault: no traceback from any library
        told = [line for line in log.splitlines() if " WARNING " in line or " ERROR " in line]
        print(f"{name}: {len(told)} warning/error lines\n" + "\n".join(told[:40]))
        h.expect("Traceback" not in log, f"{name} logged a traceback:\n{log[-6000:]}")
        # asyncpg keeps no floor of connections to reconnect (and log) while the server is away
        h.expect("connection floor" not in log, f"{name}: asyncpg reconnected its floor")
        # a kept connection the server ended is replaced, not reported as a misuse
        h.expect("released back to the pool" not in log, f"{name} used a lost connection")
    # the application's transactions during the outage fail, as they must; the orders table
    # holds the ones that committed
    h.check(report, max_reruns=in_flight, allow_failures=True)


def wakeups_received(ports: list[int]) -> float:
    return sum(metric(port, "txtasks_wakeups_received_total") for port in ports)


@pytest.mark.postgresql
def test_rabbitmq_restart_tasks_poll_and_wakeups_resume(
    chaos: Callable[..., Chaos], postgres_url: str
) -> None:
    with PrivateRabbitMQ.running() as broker:
        h = chaos(postgres_url, broker_url=broker.url)
        workers = [
            h.worker(poll=SLOW_POLL, broker_url=broker.url, extra=["--metrics-port", "0"])
            for _ in range(2)
        ]
        h.cleaner(broker_url=broker.url)
        ports = [metrics_port(w) for w in workers]
        before = h.enqueuer(400, pause=0.02, broker_url=broker.url)  # runs into the outage
        woken = h.wait_until(lambda: wakeups_received(ports) >= 10, 20, watch=workers)
        assert woken, "no wake-ups before the outage"

        broker.stop()
        done = h.finished_count()
        polled = h.wait_until(lambda: h.finished_count() >= done + 50, 4 * SLOW_POLL, watch=workers)
        late = h.enqueuer(2000, start=400, pause=0.05, broker_url=broker.url)  # starts meanwhile
        h.wait_until(lambda: before.popen.poll() is not None, 30)
        received = wakeups_received(ports)
        broker.start()
        t = time.monotonic()
        resumed = h.wait_until(lambda: wakeups_received(ports) > received, 30, watch=workers)
        resumed_in = time.monotonic() - t
        late.popen.terminate()  # enough orders: stop the application
        late.popen.wait(10)
        settled = h.settle(30)
        report = h.report()
        took = h.stop_all()
    print(
        f"rabbitmq restart: {report.summary()}; polled through the outage {bool(polled)}; "
        f"wake-ups resumed {bool(resumed)} {resumed_in:.1f}s after the broker was back; "
        f"settled {settled}; stop {took}"
    )
    h.expect(polled, "tasks did not run by polling while the broker was down")
    h.expect(resumed, "wake-ups never resumed within 30 s")
    h.expect(
        resumed_in <= WAKEUP_RESUME,
        f"wake-ups resumed {resumed_in:.1f}s after the broker came back (bound {WAKEUP_RESUME}s)",
    )
    h.check(report)
