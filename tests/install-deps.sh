#!/usr/bin/env bash
# Install what the txtasks test suite needs; safe to run again (does only what is missing).
#
#   bash tests/install-deps.sh
#
# 1. The server binaries that tests/services.sh starts: PostgreSQL (initdb), PgBouncer, MariaDB
#    (mariadbd), RabbitMQ (rabbitmq-server) and Erlang's epmd, from Debian's packages. If any is
#    missing it runs `apt-get update` and `apt-get install postgresql pgbouncer mariadb-server
#    rabbitmq-server`, as root or through sudo. The packages' own daemons are not started where there is no systemd
#    (containers, CI): the test suite starts private servers on its own ports instead. Also what
#    some tests and dev dependencies need: Java, JDBC drivers, Chromium, and mysqlclient's build
#    dependencies (libmariadb-dev, pkg-config, a C compiler).
# 2. The virtualenv .venv at the repository root with `pip install -e ".[dev]"`. The install is
#    skipped while pyproject.toml is unchanged since the last successful one.
#
# Env knobs: PYTHON=python3 (interpreter for a new .venv), VENV=.venv
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
say() { printf '[install-deps] %s\n' "$*"; }

missing=()
packages=(postgresql pgbouncer mariadb-server rabbitmq-server)
compgen -G '/usr/lib/postgresql/*/bin/initdb' > /dev/null || missing+=("initdb (PostgreSQL)")
[ -x /usr/sbin/pgbouncer ] || missing+=("pgbouncer (PgBouncer)")
[ -x /usr/sbin/mariadbd ] || missing+=("mariadbd (MariaDB)")
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || missing+=("rabbitmq-server (RabbitMQ)")
command -v epmd > /dev/null || missing+=("epmd (Erlang)")
# Spark (the txtasks[spark] tests) needs Java 17 or newer
if ! command -v java > /dev/null; then missing+=("java (Spark)"); packages+=(default-jre-headless); fi
# the Spark benchmark (tests/benchmarks/spark_write.py) compares with Spark's JDBC writer
if [ ! -e /usr/share/java/postgresql.jar ]; then missing+=("PostgreSQL JDBC driver (Spark benchmark)"); packages+=(libpostgresql-jdbc-java); fi
if [ ! -e /usr/share/java/mariadb-java-client.jar ]; then missing+=("MariaDB JDBC driver (Spark benchmark)"); packages+=(libmariadb-java); fi
# mysqlclient (a dev dependency: the DB-API and Django tests) builds from source against MariaDB's
# client library, found by pkg-config, with a C compiler
if ! pkg-config --exists libmariadb 2> /dev/null; then missing+=("libmariadb-dev, pkg-config (mysqlclient)"); packages+=(libmariadb-dev pkg-config); fi
if ! command -v cc > /dev/null; then missing+=("cc (mysqlclient)"); packages+=(gcc libc6-dev); fi
# the dashboard's browser tests (tests/web) drive Debian's Chromium with Playwright
if [ ! -x /usr/bin/chromium ]; then missing+=("chromium (dashboard tests)"); packages+=(chromium); fi

if [ ${#missing[@]} -eq 0 ]; then
  say "server binaries present (PostgreSQL, PgBouncer, MariaDB, RabbitMQ, epmd, Java, JDBC drivers, Chromium, mysqlclient's build dependencies)"
else
  say "missing: ${missing[*]}"
  if [ "$(id -u)" = 0 ]; then
    SUDO=()
  elif command -v sudo > /dev/null; then
    SUDO=(sudo)
  else
    say "cannot install them: not root and no sudo. As root run:" >&2
    say "  apt-get update && apt-get install -y --no-install-recommends ${packages[*]}" >&2
    exit 1
  fi
  # Without systemd, the packages' postinst scripts would start system-wide daemons on the
  # default ports (left running forever). policy-rc.d exit code 101 = "don't start services".
  policy=/usr/sbin/policy-rc.d added_policy=0
  if [ ! -d /run/systemd/system ] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$policy" > /dev/null
    "${SUDO[@]}" chmod 755 "$policy"; added_policy=1
    trap '"${SUDO[@]}" rm -f "$policy"' EXIT
  fi
  say "apt-get update"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  say "apt-get install ${packages[*]}"
  aptlog=$(mktemp /tmp/txtasks-apt.XXXXXX)
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${packages[@]}" > "$aptlog" 2>&1 \
    || { tail -40 "$aptlog" >&2; say "apt-get install failed (log: $aptlog)" >&2; exit 1; }
  rm -f "$aptlog"
  if [ "$added_policy" = 1 ]; then "${SUDO[@]}" rm -f "$policy"; trap - EXIT; fi
  say "installed ${packages[*]}"
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi

stamp="$VENV/.txtasks-dev-install"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  say "$VENV up to date (pip install -e \".[dev]\" done for this pyproject.toml)"
else
  say "pip install -e \".[dev]\" into $VENV"
  rm -f "$stamp"
  log=$(mktemp /tmp/txtasks-pip.XXXXXX)
  # Playwright drives /usr/bin/chromium: it must not download a browser of its own
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 \
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev]" > "$log" 2>&1 \
    || { tail -40 "$log" >&2; say "pip install failed (log: $log)" >&2; exit 1; }
  rm -f "$log"
  printf '%s\n' "$want" > "$stamp"
  say "pip install done"
fi
