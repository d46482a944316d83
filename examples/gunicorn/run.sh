#!/usr/bin/env bash
# Runs the deployment shapes of docs/python.md with real gunicorn serving app.py,
# and Caddy with mcp_proxy in front on 127.0.0.1:8000. Stays up until Ctrl-C.
#
#   ./run.sh               ONE gunicorn with N workers and gunicorn.conf.py,
#                          whose hooks (mcp_affinity_hooks.py) give every
#                          worker a unix socket in $MCP_SOCKET_DIR; Caddy
#                          uses `dynamic unix_sockets` (Caddyfile.hooks)
#   ./run.sh --per-port    N single-worker gunicorns on 127.0.0.1:9001-900N
#   SOCKET_DIR=/tmp/mcp ./run.sh --per-port
#                          ... on unix sockets /tmp/mcp/1.sock ... instead
#   ./run.sh --shared      the shape that does NOT work: one gunicorn with
#                          N workers on one port, no hooks
#
# Environment: N (3), BASE_PORT (9000: ports BASE_PORT+1..BASE_PORT+N),
# MCP_PORT (8000), MCP_SOCKET_DIR (the hooks' sockets; default a temporary
# directory), SOCKET_DIR (--per-port: unset for TCP ports), CADDY (a Caddy
# binary with this plugin; unset: built from ../../cmd/caddy, which takes
# minutes the first time), GUNICORN (gunicorn).
set -euo pipefail
cd "$(dirname "$0")"
here=$(pwd)

n=${N:-3}
base_port=${BASE_PORT:-9000}
gunicorn=${GUNICORN:-gunicorn}
mode=hooks
case "${1:-}" in
--shared) mode=shared ;;
--per-port) mode=per-port ;;
"") ;;
*) echo "usage: $0 [--per-port|--shared]" >&2; exit 2 ;;
esac

command -v "$gunicorn" >/dev/null || { echo "run.sh: $gunicorn not found (Debian: apt-get install gunicorn python3-uvicorn)" >&2; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

caddy=${CADDY:-}
if [ -z "$caddy" ]; then
  caddy=$work/caddy
  echo "building Caddy with the plugin (../../cmd/caddy) ..."
  (cd ../.. && go build -o "$caddy" ./cmd/caddy)
fi

# start_gunicorn NAME WORKERS BIND [ARGS...]: starts one gunicorn master in the background.
start_gunicorn() {
  local name=$1 workers=$2 bind=$3
  shift 3
  # Started in $work, so that gunicorn does not read ./gunicorn.conf.py unless told to.
  (cd "$work" && MCP_SERVER_NAME=$name PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$here exec "$gunicorn" --chdir "$here" "$@" app:app \
    -k uvicorn.workers.UvicornWorker --workers "$workers" --bind "$bind") >"$work/$name.log" 2>&1 &
  pids+=($!)
}

# wait_ready NAME WORKERS: waits until every worker of gunicorn NAME has started the app.
wait_ready() {
  for _ in $(seq 200); do
    if [ "$(grep -c 'Application startup complete' "$work/$1.log" || true)" -ge "$2" ]; then return 0; fi
    sleep 0.05
  done
  echo "run.sh: gunicorn $1 did not start:" >&2
  cat "$work/$1.log" >&2
  exit 1
}

upstreams=()
config=Caddyfile
if [ "$mode" = hooks ]; then
  export MCP_SOCKET_DIR=${MCP_SOCKET_DIR:-$work/sockets}
  start_gunicorn hooks "$n" "127.0.0.1:$((base_port + 1))" -c "$here/gunicorn.conf.py"
  wait_ready hooks "$n"
  config=Caddyfile.hooks
  echo "started ONE gunicorn with $n workers (shared port 127.0.0.1:$((base_port + 1))), sockets: $(ls "$MCP_SOCKET_DIR" | tr "\n" " ")"
elif [ "$mode" = shared ]; then
  start_gunicorn shared "$n" "127.0.0.1:$((base_port + 1))"
  wait_ready shared "$n"
  upstreams+=("127.0.0.1:$((base_port + 1))")
  echo "started ONE gunicorn with $n workers on 127.0.0.1:$((base_port + 1)) (sessions will break)"
else
  [ -n "${SOCKET_DIR:-}" ] && mkdir -p "$SOCKET_DIR"
  for i in $(seq "$n"); do
    if [ -n "${SOCKET_DIR:-}" ]; then
      sock=$(cd "$SOCKET_DIR" && pwd)/$i.sock
      start_gunicorn "w$i" 1 "unix:$sock"
      upstreams+=("unix/$sock")
    else
      start_gunicorn "w$i" 1 "127.0.0.1:$((base_port + i))"
      upstreams+=("127.0.0.1:$((base_port + i))")
    fi
  done
  for i in $(seq "$n"); do wait_ready "w$i" 1; done
  echo "started $n single-worker gunicorns: ${upstreams[*]}"
fi

echo "MCP endpoint: http://127.0.0.1:${MCP_PORT:-8000}/mcp  (Ctrl-C to stop; gunicorn logs in $work)"
# Caddy runs in the background so that the traps above run on SIGTERM too
# (bash defers traps while a foreground command runs).
MCP_UPSTREAMS="${upstreams[*]}" "$caddy" run --config "$config" --adapter caddyfile &
caddy_pid=$!
pids+=("$caddy_pid")
wait "$caddy_pid"
