"""A Spark standalone cluster on one machine, from the installed PySpark (its `bin/spark-class`).

The master and one worker listen on 127.0.0.2, a second worker on 127.0.0.3 (each process with
its own `SPARK_LOCAL_IP`): Spark takes them for two hosts, so it starts a speculative copy of a
task on the other one (it never does on the host where the task already runs, which is why
`local[N]` and `local-cluster` never speculate). Each worker has one core. Ports are the ones
each process picked (port 0) and logged; the master's REST submission server is off (it would
take the fixed port 6066). Every process runs in a process group of its own, ended at `stop()`
with its executors.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests import pace

#: Seconds the master and each worker get to start (JVM start, registration).
START_TIMEOUT = pace.seconds(60.0)
#: Seconds a process gets to end after SIGTERM before SIGKILL.
STOP_TIMEOUT = pace.seconds(10.0)

#: The addresses of the two hosts (the master runs on the first one).
HOSTS = ("127.0.0.2", "127.0.0.3")
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
REGISTERED = re.compile(r"Successfully registered with master")
#: Settings of the daemons (not of the applications): no REST server on its fixed port.
DAEMON_PROPERTIES = "spark.master.rest.enabled false\nspark.ui.killEnabled false\n"


class ClusterError(RuntimeError):
    """A daemon of the cluster exited or did not start in time (its log is named)."""


def missing() -> str | None:
    """What this machine lacks for a cluster (None if nothing): `spark-class`, Java, or the
    loopback addresses the daemons bind to."""
    if not spark_class().exists():
        return f"no {spark_class()}"
    if shutil.which("java") is None:
        return "no java on the PATH"
    for host in HOSTS:
        with socket.socket() as probe:
            try:
                probe.bind((host, 0))
            except OSError as error:
                return f"cannot bind {host}: {error}"
    return None


def spark_class() -> Path:
    """The `bin/spark-class` of the installed PySpark."""
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home()) / "bin" / "spark-class"


@dataclass
class Daemon:
    """One JVM of the cluster and its log."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def wait_for(self, pattern: re.Pattern[str], timeout: float = START_TIMEOUT) -> re.Match[str]:
        """Wait (bounded) until the log has a line matching `pattern`; fail if the JVM exits."""
        deadline = time.monotonic() + timeout
        while True:
            found = pattern.search(self.log.read_text(errors="replace"))
            if found:
                return found
            if self.process.poll() is not None:
                raise ClusterError(
                    f"spark {self.name} exited ({self.process.returncode}): {self.log}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"spark {self.name}: no {pattern.pattern!r} in {timeout:g}s: {self.log}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM the daemon's process group (its executors and their Python workers too),
        then SIGKILL what is left of it."""
        group = self.process.pid  # the group's id: the daemon leads a session of its own
        for sig, patience in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(patience)
            except subprocess.TimeoutExpired:
                continue
            if sig == signal.SIGTERM:
                with contextlib.suppress(ProcessLookupError):  # what it started goes too
                    os.killpg(group, signal.SIGKILL)
            return


@dataclass
class Cluster:
    """A running standalone cluster: its master URL and daemons."""

    master_url: str
    daemons: list[Daemon] = field(default_factory=list)

    def stop(self) -> None:
        for daemon in reversed(self.daemons):
            daemon.stop()


def start_daemon(name: str, cls: str, host: str, args: list[str], work: Path) -> Daemon:
    """Start one JVM of the cluster (`spark-class cls args`), bound to `host`."""
    log = work / f"{name}.log"
    env = {**os.environ, "SPARK_LOCAL_IP": host, "SPARK_DAEMON_MEMORY": "256m"}
    env.pop("SPARK_CONF_DIR", None)
    properties = work / "daemon.properties"
    properties.write_text(DAEMON_PROPERTIES)
    command = [str(spark_class()), cls, "--host", host, "--port", "0", "--webui-port", "0"]
    command += ["--properties-file", str(properties), *args]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return Daemon(name, process, log)


@contextmanager
def standalone_cluster(
    work: Path, hosts: tuple[str, ...] = ("127.0.0.2", "127.0.0.3")
) -> Iterator[Cluster]:
    """A master on the first host and a one-core worker on each host, logs and work
    directories under `work`; every process ended when the block ends."""
    cluster = Cluster("")
    try:
        master = start_daemon("master", MASTER, hosts[0], [], work)
        cluster.daemons.append(master)
        cluster.master_url = master.wait_for(MASTER_URL).group(1)
        for n, host in enumerate(hosts):
            (work / f"worker{n}").mkdir()
            args = ["--cores", "1", "--memory", "1g", "--work-dir", str(work / f"worker{n}")]
            worker = start_daemon(f"worker{n}", WORKER, host, [*args, cluster.master_url], work)
            cluster.daemons.append(worker)
        for worker in cluster.daemons[1:]:
            worker.wait_for(REGISTERED)
        yield cluster
    finally:
        cluster.stop()
