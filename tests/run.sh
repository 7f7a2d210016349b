#!/usr/bin/env bash
# The txtasks test command: lint, type-check and test against real servers.
#
#   bash tests/run.sh [pytest args...]        e.g.  bash tests/run.sh -x -k enqueue
#
# 1. tests/install-deps.sh: the PostgreSQL/MariaDB/RabbitMQ packages and .venv (pip install -e ".[dev]").
# 2. Starts PostgreSQL, PgBouncer, MariaDB and RabbitMQ with tests/services.sh in a new
#    /tmp/txtasks-svc.XXXXXX, on the default ports 55432, 56432, 53306 and 55672-55674 when they
#    are free, else on other free ones.
#    They are stopped and the directory removed when this script exits, however it exits.
# 3. Exports TXTASKS_TEST_SERVICES_ENV=$BASE/services.env and the variables in it (PG_DSN,
#    MYSQL_DSN, AMQP_URL, ...): the test fixtures (tests/servers.py) use these servers.
# 4. Runs `ruff check`, `mypy` and `pytest "$@"`, all three even if one fails, and exits non-zero
#    if any failed. pytest's "no tests collected" (exit code 5) counts as a failure.
#
# 5. At most TXTASKS_TEST_SLOTS runs at once on one machine (default: one per two cores); a
#    run started while they are busy waits for one to end (servers and databases are each
#    run's own anyway: the limit is for the CPU).
#
# Env knobs: those of tests/services.sh (PG_FAST=0 for PostgreSQL's durable defaults, SERVICES,
# SVC_TIMEOUT, PG_PORT, PGB_PORT, MY_PORT, RMQ_PORT: a port given here is used as is, not searched).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD
PY=$ROOT/.venv/bin/python
say() { printf '[run] %s\n' "$*"; }

bash tests/install-deps.sh || { say "tests/install-deps.sh failed"; exit 1; }

# One run per two cores at a time on this machine (TXTASKS_TEST_SLOTS overrides; 0: no limit).
# A run keeps every core busy (servers, 4 pytest processes, a JVM): two at once on 2 cores
# starve each other past the tests' time limits, so a second run waits for a free slot. Only
# this shell holds the slot's lock: every command it starts gets the descriptor closed
# ({SLOT_FD}>&-), so a server that outlives the run (epmd) cannot keep the slot.
SLOT_FD=
take_slot() {
  local slots=${TXTASKS_TEST_SLOTS:-$(( $(nproc) / 2 ))} i said=""
  if [ "$slots" -eq 0 ]; then exec {SLOT_FD}> /dev/null; return 0; fi  # no limit: a stand-in
  [ "$slots" -ge 1 ] || slots=1
  while true; do
    for ((i = 0; i < slots; i++)); do
      exec {SLOT_FD}> "${TMPDIR:-/tmp}/txtasks-tests.slot$i"
      if flock -n "$SLOT_FD"; then
        [ -n "$said" ] && say "slot $i free: starting"
        return 0
      fi
      exec {SLOT_FD}>&-
    done
    [ -n "$said" ] || { say "waiting: $slots test run(s) at once on this machine (TXTASKS_TEST_SLOTS)"; said=1; }
    sleep 2
  done
}
take_slot

BASE=$(mktemp -d /tmp/txtasks-svc.XXXXXX) || exit 1
cleanup() {
  local out
  out=$(bash "$ROOT/tests/services.sh" stop "$BASE" 2>&1) || printf '%s\n[run] stopping the servers failed\n' "$out" >&2
  rm -rf "$BASE"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Free ports: the defaults if free, else random ones below the ephemeral range.
# RabbitMQ needs three consecutive ones (AMQP, Erlang distribution, epmd).
ports=$("$PY" - "${PG_PORT:-}" "${MY_PORT:-}" "${RMQ_PORT:-}" "${PGB_PORT:-}" <<'PY'
import random
import socket
import sys

taken: set[int] = set()


def free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do: TIME_WAIT is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick(given: str, default: int, n: int) -> int:
    if given:
        return int(given)
    for p in [default] + [random.randrange(20000, 32000) for _ in range(500)]:
        block = set(range(p, p + n))
        if not block & taken and all(free(q) for q in block):
            taken.update(block)
            return p
    sys.exit(f"no {n} free consecutive port(s) found")


print(
    pick(sys.argv[1], 55432, 1),
    pick(sys.argv[2], 53306, 1),
    pick(sys.argv[3], 55672, 3),
    pick(sys.argv[4], 56432, 1),
)
PY
) || { say "could not pick free ports"; exit 1; }
read -r PG_PORT MY_PORT RMQ_PORT PGB_PORT <<< "$ports"
export PG_PORT MY_PORT RMQ_PORT PGB_PORT

t0=$(date +%s.%N)
bash tests/services.sh start "$BASE" {SLOT_FD}>&- || { say "could not start the test servers (see above)"; exit 1; }
say "servers started in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')s (base $BASE)"

set -a
# shellcheck source=/dev/null
. "$BASE/services.env"
set +a
export TXTASKS_TEST_SERVICES_ENV=$BASE/services.env
export PYSPARK_PYTHON=$PY SPARK_LOCAL_IP=127.0.0.1
export VIRTUAL_ENV=$ROOT/.venv PATH=$ROOT/.venv/bin:$PATH

failed=()
say "ruff check . and ruff format --check ."
"$PY" -m ruff check . {SLOT_FD}>&- || failed+=("ruff (rc $?)")
"$PY" -m ruff format --check . {SLOT_FD}>&- || failed+=("ruff format (rc $?)")
say "mypy"
"$PY" -m mypy {SLOT_FD}>&- || failed+=("mypy (rc $?)")
# pytest-xdist: TXTASKS_TEST_WORKERS processes unless the arguments choose (-n 0 runs
# serially); --dist loadgroup keeps each xdist_group in one worker
args=("$@")
if ! printf '%s\n' "$@" | grep -Eq '^(-n|--numprocesses)(=|$)|^-n[0-9a-z]'; then
  args=(-n "${TXTASKS_TEST_WORKERS:-4}" "${args[@]}")
fi
if ! printf '%s\n' "$@" | grep -Eq '^--dist(=|$)'; then args=(--dist loadgroup "${args[@]}"); fi
say "pytest ${args[*]}"
"$PY" -m pytest "${args[@]}" {SLOT_FD}>&-
rc=$?
if [ "$rc" -eq 5 ]; then
  failed+=("pytest (rc 5: no tests collected)")
elif [ "$rc" -ne 0 ]; then
  failed+=("pytest (rc $rc)")
fi

if [ ${#failed[@]} -gt 0 ]; then
  say "FAILED: ${failed[*]}"
  exit 1
fi
exit 0
