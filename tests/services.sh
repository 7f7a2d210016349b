#!/usr/bin/env bash
# Throw-away PostgreSQL, PgBouncer, MariaDB and RabbitMQ servers for the txtasks test suite.
#
# Starts real servers from the Debian packages (postgresql-15, pgbouncer, mariadb-server,
# rabbitmq-server; tests/install-deps.sh installs them) in one base directory, on given loopback ports, without
# Docker or systemd. Works as root (postgres runs as the 'postgres' user) and as a normal user.
#
#   tests/services.sh start BASE   start the servers, wait until they accept connections,
#                                  write BASE/services.env (on failure: stop what was started)
#   tests/services.sh stop  BASE   stop every server started in BASE (by pid file); idempotent;
#                                  keeps BASE (a later start reuses the data directories)
#   tests/services.sh env   BASE   print BASE/services.env
#   tests/services.sh vhost BASE NAME       create the RabbitMQ virtual host NAME (idempotent),
#                                  open to the test user: one per pytest worker (tests/servers.py)
#   tests/services.sh vhost-drop BASE NAME  delete it (idempotent)
#
# BASE may also come from SVC_BASE. Every parent of BASE must be traversable by the 'postgres'
# user, so use e.g. `mktemp -d /tmp/txtasks-svc.XXXXXX`, not pytest's 0700 temp dir.
#
# services.env holds: SVC_BASE, PG_DSN, PG_SOCKET_DIR, PGB_DSN, MYSQL_DSN, MYSQL_SOCKET, AMQP_URL,
# RMQ_PORT (only those of the started SERVICES), e.g.
#   PG_DSN=postgresql://app:app@127.0.0.1:55432/appdb
#   PGB_DSN=postgresql://app:app@127.0.0.1:56432/appdb   (PgBouncer in front of PG_DSN's server)
#   MYSQL_DSN=mysql://app:app@127.0.0.1:53306/appdb
#   AMQP_URL=amqp://app:app@127.0.0.1:55672/
#
# Env knobs:
#   SERVICES="pg pgbouncer mariadb rabbitmq"   which servers to start (pgbouncer needs pg)
#   PG_PORT=55432  MY_PORT=53306     listening ports (127.0.0.1 only)
#   PGB_PORT=56432                   PgBouncer's port: transaction pooling (pool_mode=transaction,
#                                    default_pool_size=20 server connections per database and
#                                    user) in front of PostgreSQL, every database of the server
#                                    through it, the same user and password (SCRAM)
#   RMQ_PORT=55672                   AMQP port; RMQ_PORT+1 is the Erlang distribution port and
#                                    RMQ_PORT+2 a private epmd, so three consecutive free ports
#   SVC_TIMEOUT=60                   seconds to wait for each server
#   SVC_DB=appdb SVC_USER=app SVC_PASSWORD=app   database, user and password (also the broker's)
#   PG_FAST=1                        1: fsync, synchronous_commit and full_page_writes off (fast,
#                                    not crash-safe); 0: PostgreSQL's durable defaults (benchmarks)
#   MY_FAST=$PG_FAST                 1: MariaDB writes its redo log at each commit and flushes it to
#                                    disk once a second (innodb_flush_log_at_trx_commit=2: a
#                                    killed mariadbd loses nothing, a machine crash up to a second);
#                                    0: its durable default (1: a flush per commit)
#   MY_BUFFER_POOL=64M MY_LOG_FILE=16M  MariaDB's InnoDB buffer pool and redo log (small for tests;
#                                    benchmarks of millions of rows want a pool that holds them)
#   PGBIN=/usr/lib/postgresql/NN/bin  default: the newest installed version
#
# Limits raised for multi-process tests: PostgreSQL max_connections=400, MariaDB max_connections=600
# (pytest-xdist workers share the servers). The test user may create databases: PostgreSQL
# CREATEDB, MariaDB every privilege on databases named txt_% (tests/servers.py makes one per
# pytest worker and test run).
set -euo pipefail

CMD=${1:-start}
BASE=${2:-${SVC_BASE:-}}
[ -n "$BASE" ] || { echo "usage: $0 start|stop|env BASE_DIR (or SVC_BASE=...)" >&2; exit 2; }
SERVICES=${SERVICES:-"pg pgbouncer mariadb rabbitmq"}
PG_PORT=${PG_PORT:-55432}
PGB_PORT=${PGB_PORT:-56432}
MY_PORT=${MY_PORT:-53306}
RMQ_PORT=${RMQ_PORT:-55672}
TIMEOUT=${SVC_TIMEOUT:-60}
DB=${SVC_DB:-appdb}; DBUSER=${SVC_USER:-app}; DBPASS=${SVC_PASSWORD:-app}
PG_FAST=${PG_FAST:-1}
MY_FAST=${MY_FAST:-$PG_FAST}
MY_BUFFER_POOL=${MY_BUFFER_POOL:-64M}; MY_LOG_FILE=${MY_LOG_FILE:-16M}
PGBIN=${PGBIN:-$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -1)}
RMQBIN=/usr/lib/rabbitmq/bin          # NOT /usr/sbin/rabbitmq-server (that wrapper su's to rabbitmq)
PGBOUNCER=${PGBOUNCER:-/usr/sbin/pgbouncer}

log() { printf '[services %(%T)T] %s\n' -1 "$*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b-a}'; }
has() { case " $SERVICES " in *" $1 "*) return 0;; esac; return 1; }
port_free() { ! (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; }
# a pid that exists and is not a zombie (orphans may never be reaped when PID 1 does not reap)
alive() { kill -0 "$1" 2>/dev/null && [ "$(ps -o stat= -p "$1" 2>/dev/null | cut -c1)" != Z ]; }
# run a command as the unprivileged postgres user when we are root (postgres refuses root)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
need() { [ -x "$1" ] || { log "$2 not found ($1); run tests/install-deps.sh"; return 1; }; }

rmq_env() { # isolated RabbitMQ node: own HOME (cookie), dirs, node name, dist port, epmd port
  local d=$BASE/rabbitmq
  export HOME=$d                                     # server AND CLI read $HOME/.erlang.cookie
  export RABBITMQ_NODENAME=txtasks_${RMQ_PORT}@localhost
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$RMQ_PORT
  export RABBITMQ_DIST_PORT=$((RMQ_PORT + 1))        # default NODE_PORT+20000 may be > 65535
  export ERL_EPMD_PORT=$((RMQ_PORT + 2)) ERL_EPMD_ADDRESS=127.0.0.1   # private epmd, not :4369
  export RABBITMQ_MNESIA_BASE=$d/mnesia RABBITMQ_LOG_BASE=$d/log RABBITMQ_PID_FILE=$d/rabbitmq.pid
  export RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins        # '[].' -> no management plugin
  export RABBITMQ_CONFIG_FILE=$d/rabbitmq RABBITMQ_CONF_ENV_FILE=$d/rabbitmq-env.conf
  export RABBITMQ_ADVANCED_CONFIG_FILE=$d/advanced.config
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  export ERL_CRASH_DUMP=$d/erl_crash.dump            # default: the current directory
}

start_pg() {
  local d=$BASE/pg t; t=$(now)
  need "$PGBIN/initdb" "PostgreSQL (initdb)"
  port_free "$PG_PORT" || { log "port $PG_PORT busy"; return 1; }
  mkdir -p "$d"
  if [ "$(id -u)" = 0 ]; then
    chown postgres: "$d"
    # every parent dir must be traversable by 'postgres' (pytest's per-user temp dir is 0700)
    runuser -u postgres -- test -w "$d" || { log "user postgres cannot reach $d (a parent dir with mode 0700?)"; return 1; }
  fi
  if [ ! -s "$d/data/PG_VERSION" ]; then
    printf '%s\n' "$DBPASS" > "$d/pw"; if [ "$(id -u)" = 0 ]; then chown postgres: "$d/pw"; fi
    as_pg "$PGBIN/initdb" -D "$d/data" -U postgres --pwfile="$d/pw" -E UTF8 --locale=C.UTF-8 \
      --auth-local=trust --auth-host=scram-sha-256 > "$d/initdb.log" 2>&1 || { cat "$d/initdb.log" >&2; return 1; }
  fi
  local opts="-p $PG_PORT -k $d -c listen_addresses=127.0.0.1 -c max_connections=400"
  [ "$PG_FAST" = 0 ] || opts="$opts -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
  as_pg "$PGBIN/pg_ctl" -D "$d/data" -l "$d/server.log" -w -t "$TIMEOUT" -o "$opts" start > /dev/null \
    || { tail -30 "$d/server.log" >&2; return 1; }
  head -1 "$d/data/postmaster.pid" > "$d/pid"
  "$PGBIN/psql" -h "$d" -p "$PG_PORT" -U postgres -d postgres -qAt -v ON_ERROR_STOP=1 <<SQL >/dev/null
SELECT 'CREATE ROLE $DBUSER LOGIN PASSWORD ''$DBPASS''' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname='$DBUSER')\gexec
ALTER ROLE $DBUSER CREATEDB;
SELECT 'CREATE DATABASE $DB OWNER $DBUSER' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname='$DB')\gexec
SQL
  log "postgres ready on :$PG_PORT in $(since "$t")s (pid $(cat "$d/pid"), PG_FAST=$PG_FAST)"
}

start_pgbouncer() { # after start_pg: it forwards to PG_PORT
  local d=$BASE/pgbouncer t; t=$(now)
  need "$PGBOUNCER" "PgBouncer (pgbouncer)"
  has pg || { log "pgbouncer needs pg in SERVICES"; return 1; }
  port_free "$PGB_PORT" || { log "port $PGB_PORT busy"; return 1; }
  mkdir -p "$d"
  # every database of the server (the tests make one per pytest process) under the app user;
  # the password in clear in auth_file lets PgBouncer log in to PostgreSQL with SCRAM too
  printf '"%s" "%s"\n' "$DBUSER" "$DBPASS" > "$d/userlist.txt"
  cat > "$d/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$PG_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGB_PORT
unix_socket_dir = $d
pidfile = $d/pgbouncer.pid
logfile = $d/pgbouncer.log
auth_type = scram-sha-256
auth_file = $d/userlist.txt
stats_users = $DBUSER
pool_mode = transaction
default_pool_size = 20
max_client_conn = 2000
INI
  if [ "$(id -u)" = 0 ]; then chown -R postgres: "$d"; chmod 600 "$d/userlist.txt"; fi
  rm -f "$d/pgbouncer.pid"
  # -d: daemonizes once listening, its pid in pidfile (PgBouncer refuses to run as root)
  as_pg "$PGBOUNCER" -d "$d/pgbouncer.ini" > "$d/stdout.log" 2>&1 \
    || { cat "$d/stdout.log" >&2; tail -30 "$d/pgbouncer.log" >&2 2>/dev/null; return 1; }
  local end=$(( $(date +%s) + TIMEOUT ))
  # ready: a query goes through to PostgreSQL (the listener opens before the first login works)
  until PGPASSWORD=$DBPASS PGCONNECT_TIMEOUT=2 "$PGBIN/psql" -h 127.0.0.1 -p "$PGB_PORT" -U "$DBUSER" \
      -d "$DB" -qAtc 'SELECT 1' > /dev/null 2>&1; do
    [ -s "$d/pgbouncer.pid" ] && alive "$(cat "$d/pgbouncer.pid")" \
      || { log "pgbouncer exited:"; tail -30 "$d/pgbouncer.log" >&2; return 1; }
    [ "$(date +%s)" -lt "$end" ] || { log "pgbouncer not ready after ${TIMEOUT}s"; tail -30 "$d/pgbouncer.log" >&2; return 1; }
    sleep 0.05
  done
  log "pgbouncer ready on :$PGB_PORT in $(since "$t")s (pid $(cat "$d/pgbouncer.pid"), transaction pooling)"
}

start_mariadb() {
  local d=$BASE/mariadb t; t=$(now)
  need /usr/sbin/mariadbd "MariaDB (mariadbd)"
  port_free "$MY_PORT" || { log "port $MY_PORT busy"; return 1; }
  mkdir -p "$d"
  local user=(); if [ "$(id -u)" = 0 ]; then user=(--user=root); fi   # mariadbd aborts as root without it
  # --no-defaults: ignore /etc/mysql (it points pid/socket files at /run/mysqld)
  local opts=(--no-defaults --datadir="$d/data" "${user[@]}" --skip-name-resolve
              --innodb-log-file-size="$MY_LOG_FILE" --innodb-data-file-path=ibdata1:10M:autoextend)
  [ "$MY_FAST" = 0 ] || opts+=(--innodb-flush-log-at-trx-commit=2)
  if [ ! -d "$d/data/mysql" ]; then
    mariadb-install-db "${opts[@]}" --auth-root-authentication-method=normal --skip-test-db \
      > "$d/install.log" 2>&1 || { cat "$d/install.log" >&2; return 1; }
  fi
  setsid /usr/sbin/mariadbd "${opts[@]}" --port="$MY_PORT" --bind-address=127.0.0.1 \
    --socket="$d/mysqld.sock" --pid-file="$d/mysqld.pid" --log-error="$d/error.log" \
    --max-connections=600 --innodb-buffer-pool-size="$MY_BUFFER_POOL" \
    --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci \
    < /dev/null > "$d/stdout.log" 2>&1 &
  echo $! > "$d/pid"
  local end=$(( $(date +%s) + TIMEOUT ))
  until mariadb-admin --no-defaults --socket="$d/mysqld.sock" -uroot ping > /dev/null 2>&1; do
    alive "$(cat "$d/pid")" || { log "mariadbd exited:"; tail -30 "$d/error.log" >&2; return 1; }
    [ "$(date +%s)" -lt "$end" ] || { log "mariadb not ready after ${TIMEOUT}s"; tail -30 "$d/error.log" >&2; return 1; }
    sleep 0.05
  done
  mariadb --no-defaults --socket="$d/mysqld.sock" -uroot <<SQL
CREATE DATABASE IF NOT EXISTS \`$DB\` CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS '$DBUSER'@'%' IDENTIFIED BY '$DBPASS';
CREATE USER IF NOT EXISTS '$DBUSER'@'localhost' IDENTIFIED BY '$DBPASS';
GRANT ALL ON \`$DB\`.* TO '$DBUSER'@'%';
GRANT ALL ON \`$DB\`.* TO '$DBUSER'@'localhost';
GRANT ALL ON \`txt\\_%\`.* TO '$DBUSER'@'%';
GRANT ALL ON \`txt\\_%\`.* TO '$DBUSER'@'localhost';
SQL
  log "mariadb ready on :$MY_PORT in $(since "$t")s (pid $(cat "$d/pid"), MY_FAST=$MY_FAST)"
}

launch_rabbitmq() { # returns immediately; readiness in wait_rabbitmq
  local d=$BASE/rabbitmq p
  need "$RMQBIN/rabbitmq-server" "RabbitMQ (rabbitmq-server)"
  command -v epmd > /dev/null || { log "epmd not found (Erlang); run tests/install-deps.sh"; return 1; }
  if [ "$RMQ_PORT" -lt 1024 ] || [ "$RMQ_PORT" -gt 65533 ]; then
    log "RMQ_PORT must be 1024..65533 (it uses RMQ_PORT..RMQ_PORT+2)"; return 1
  fi
  for p in "$RMQ_PORT" $((RMQ_PORT + 1)) $((RMQ_PORT + 2)); do port_free "$p" || { log "port $p busy"; return 1; }; done
  mkdir -p "$d/log" "$d/mnesia"
  ( rmq_env; cd "$d"
    [ -s "$d/.erlang.cookie" ] || { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F > "$d/.erlang.cookie"; chmod 400 "$d/.erlang.cookie"; }
    echo '[].' > "$RABBITMQ_ENABLED_PLUGINS_FILE"; : > "$RABBITMQ_CONF_ENV_FILE"; echo '[].' > "$RABBITMQ_ADVANCED_CONFIG_FILE"
    printf 'default_user = %s\ndefault_pass = %s\nloopback_users = none\n' "$DBUSER" "$DBPASS" > "$d/rabbitmq.conf"
    # our own epmd (known pid, private port) so nothing is left behind after stop
    setsid epmd -port "$ERL_EPMD_PORT" -address 127.0.0.1 < /dev/null > "$d/epmd.log" 2>&1 &
    echo $! > "$d/epmd.pid"
    # rabbitmq-server spawns a daemonized epmd of its own (never stopped) if ours is not up yet
    local n=100
    until (exec 3<>/dev/tcp/127.0.0.1/"$ERL_EPMD_PORT") 2>/dev/null; do
      if ! alive "$(cat "$d/epmd.pid")" || [ $n -le 0 ]; then log "epmd did not start:"; cat "$d/epmd.log" >&2; exit 1; fi
      sleep 0.05; n=$((n-1))
    done
    rm -f "$RABBITMQ_PID_FILE"
    setsid "$RMQBIN/rabbitmq-server" < /dev/null > "$d/stdout.log" 2>&1 &
    echo $! > "$d/launcher.pid" )
}

wait_rabbitmq() {
  local d=$BASE/rabbitmq t=$1
  local end=$(( $(date +%s) + TIMEOUT ))
  until (exec 3<>/dev/tcp/127.0.0.1/"$RMQ_PORT") 2>/dev/null; do   # AMQP listener opens last
    alive "$(cat "$d/launcher.pid")" || { log "rabbitmq-server exited:"; tail -30 "$d/stdout.log" >&2; return 1; }
    [ "$(date +%s)" -lt "$end" ] || { log "rabbitmq not ready after ${TIMEOUT}s"; tail -30 "$d/stdout.log" >&2; return 1; }
    sleep 0.1
  done
  log "rabbitmq ready on :$RMQ_PORT in $(since "$t")s (beam pid $(cat "$d/rabbitmq.pid" 2>/dev/null || echo ?))"
}

write_env() {
  local f=$BASE/services.env
  {
    echo "SVC_BASE=$BASE"
    if has pg; then echo "PG_DSN=postgresql://$DBUSER:$DBPASS@127.0.0.1:$PG_PORT/$DB"; echo "PG_SOCKET_DIR=$BASE/pg"; fi
    if has pgbouncer; then echo "PGB_DSN=postgresql://$DBUSER:$DBPASS@127.0.0.1:$PGB_PORT/$DB"; fi
    if has mariadb; then echo "MYSQL_DSN=mysql://$DBUSER:$DBPASS@127.0.0.1:$MY_PORT/$DB"; echo "MYSQL_SOCKET=$BASE/mariadb/mysqld.sock"; fi
    if has rabbitmq; then echo "AMQP_URL=amqp://$DBUSER:$DBPASS@127.0.0.1:$RMQ_PORT/"; echo "RMQ_PORT=$RMQ_PORT"; fi
  } > "$f.tmp"
  mv "$f.tmp" "$f"
}

stop_pid() { # pid timeout: SIGTERM, wait, SIGKILL as last resort
  local p=$1 n=$(( $2 * 10 ))
  [ -n "$p" ] || return 0
  alive "$p" || return 0
  kill -TERM "$p" 2>/dev/null || true
  while alive "$p" && [ $n -gt 0 ]; do sleep 0.1; n=$((n-1)); done
  if alive "$p"; then log "pid $p ignored SIGTERM, killing"; kill -KILL "$p" 2>/dev/null || true; fi
}

do_stop() {
  local t
  if [ -f "$BASE/pgbouncer/pgbouncer.pid" ]; then   # before postgres: its clients go first
    t=$(now); stop_pid "$(cat "$BASE/pgbouncer/pgbouncer.pid")" 10   # SIGTERM: immediate shutdown
    rm -f "$BASE/pgbouncer/pgbouncer.pid"; log "pgbouncer stopped in $(since "$t")s"
  fi
  if [ -f "$BASE/pg/data/postmaster.pid" ] || [ -f "$BASE/pg/pid" ]; then
    t=$(now)
    if [ -f "$BASE/pg/data/postmaster.pid" ]; then
      as_pg "$PGBIN/pg_ctl" -D "$BASE/pg/data" -m fast -w -t 30 stop > /dev/null 2>&1 || true
    fi
    [ -f "$BASE/pg/pid" ] && stop_pid "$(cat "$BASE/pg/pid")" 10
    rm -f "$BASE/pg/pid"; log "postgres stopped in $(since "$t")s"
  fi
  if [ -f "$BASE/mariadb/pid" ]; then
    t=$(now); stop_pid "$(cat "$BASE/mariadb/pid")" 30; rm -f "$BASE/mariadb/pid"; log "mariadb stopped in $(since "$t")s"
  fi
  if [ -f "$BASE/rabbitmq/launcher.pid" ]; then
    t=$(now)
    local lp n=100; lp=$(cat "$BASE/rabbitmq/launcher.pid")
    # beam writes its pid file ~0.4s after launch; if we stop very early, wait for it
    while [ ! -s "$BASE/rabbitmq/rabbitmq.pid" ] && alive "$lp" && [ $n -gt 0 ]; do sleep 0.1; n=$((n-1)); done
    # SIGTERM to the beam pid is a graceful stop (~1s)
    if [ -s "$BASE/rabbitmq/rabbitmq.pid" ]; then stop_pid "$(cat "$BASE/rabbitmq/rabbitmq.pid")" 30
    else kill -TERM -- "-$lp" 2>/dev/null || true; fi   # launcher was started with setsid: its own group
    stop_pid "$lp" 5
    rm -f "$BASE/rabbitmq/launcher.pid"; log "rabbitmq stopped in $(since "$t")s"
  fi
  if [ -f "$BASE/rabbitmq/epmd.pid" ]; then
    stop_pid "$(cat "$BASE/rabbitmq/epmd.pid")" 5; rm -f "$BASE/rabbitmq/epmd.pid"
  fi
}

case "$CMD" in
  start)
    mkdir -p "$BASE"; BASE=$(cd "$BASE" && pwd); chmod 755 "$BASE"   # postgres user must traverse it
    T=$(now); STARTED=0
    # any failure or signal before the end: stop whatever was already started
    on_exit() { local rc=$?; if [ "$STARTED" != 1 ]; then log "start failed, stopping"; do_stop; fi; exit "$rc"; }
    trap on_exit EXIT
    trap 'exit 130' INT; trap 'exit 143' TERM
    rm -f "$BASE/services.env"
    if has rabbitmq; then launch_rabbitmq; fi        # slowest (~4s): launch first, wait last
    if has pg; then start_pg; fi
    if has pgbouncer; then start_pgbouncer; fi
    if has mariadb; then start_mariadb; fi
    if has rabbitmq; then wait_rabbitmq "$T"; fi
    write_env; STARTED=1
    log "all ready in $(since "$T")s; env in $BASE/services.env" ;;
  stop)
    [ -d "$BASE" ] || exit 0
    BASE=$(cd "$BASE" && pwd); do_stop ;;
  env)  cat "$BASE/services.env" ;;
  vhost|vhost-drop)
    NAME=${3:-}; [[ "$NAME" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "usage: $0 $CMD BASE NAME ([A-Za-z0-9_.-])" >&2; exit 2; }
    BASE=$(cd "$BASE" && pwd)
    RMQ_PORT=$(sed -n 's/^RMQ_PORT=//p' "$BASE/services.env")
    [ -n "$RMQ_PORT" ] || { log "no RabbitMQ in $BASE/services.env"; exit 1; }
    rmq_env
    if [ "$CMD" = vhost ]; then
      "$RMQBIN/rabbitmqctl" -q add_vhost "$NAME" 2>/dev/null || "$RMQBIN/rabbitmqctl" -q list_vhosts | grep -qx "$NAME" \
        || { log "could not add vhost $NAME"; exit 1; }
      "$RMQBIN/rabbitmqctl" -q set_permissions -p "$NAME" "$DBUSER" '.*' '.*' '.*' > /dev/null
    else
      "$RMQBIN/rabbitmqctl" -q delete_vhost "$NAME" > /dev/null 2>&1 || true
    fi ;;
  *) echo "unknown command $CMD" >&2; exit 2 ;;
esac
