#!/usr/bin/env bash
# rolling-deploy.sh: replace the MCP servers behind caddy-mcp-affinity one at
# a time without breaking a session.
#
# For each upstream given on the command line, in turn:
#
#   1. drain    POST /mcp_sessions/drain: the upstream gets no new sessions,
#               its pinned sessions keep working;
#   2. wait     poll GET /mcp_sessions/upstream until live_sessions is 0 on
#               two polls in a row ("drain done"), or until --timeout expires;
#   3. stop     run the --stop command, then wait until the port is closed;
#   4. start    run the --start command, then wait until the port accepts
#               TCP connections again;
#   5. undrain  POST /mcp_sessions/undrain: new sessions go to it again.
#
# Needs bash, curl, sed and grep; no jq. See README.md next to this script.
#
# Usage:
#   rolling-deploy.sh [options] --stop CMD --start CMD UPSTREAM...
#
# UPSTREAM is a dial address exactly as written in the Caddy config, such as
# 127.0.0.1:9001, [::1]:9001 or unix//run/mcp/1.sock.
#
# Options (also accepted as --name=value):
#   --admin ADDR         Caddy admin endpoint (default: localhost:2019)
#   --table NAME         session table (default: default)
#   --stop CMD           command that stops the upstream (required)
#   --start CMD          command that starts the new version (required)
#   --timeout SECS       longest wait for the drain to be done (default: 300)
#   --on-timeout ACTION  what to do when --timeout expires (default: proceed)
#                          failover: drain with a deadline of --timeout
#                                   (needs `failover reinitialize` in the
#                                   table): past it, each remaining session
#                                   moves to another upstream on its next
#                                   request; replace the upstream at the
#                                   deadline without evicting anything, so no
#                                   session is lost and each upstream takes
#                                   at most --timeout to drain
#                          proceed: say so, evict the upstream's remaining
#                                   sessions (POST /mcp_sessions/evict) and
#                                   replace it anyway; their clients get 404
#                                   and re-initialize on another upstream
#                          abort:   undrain the upstream (still the old
#                                   version) and exit 3
#   --poll SECS          interval between polls, fractions allowed (default: 0.5)
#   --port-timeout SECS  longest wait for the port to close after --stop and to
#                        open after --start (default: 60)
#   -h, --help           show this help
#
# CMD is run with `bash -c` after replacing {upstream} (the dial address),
# {host}, {port} and {socket} (the path of a unix// upstream) in it, e.g.
#   --stop 'systemctl stop mcp@{port}' --start 'systemctl start mcp@{port}'
# A --start command that backgrounds a process must redirect its output
# (`cmd >log 2>&1 &`), or whoever reads this script's output waits for it.
#
# Exit status: 0 when every upstream was replaced and undrained; 1 when an
# admin call or a command failed (the upstream being replaced is left drained:
# the message says how to undrain it); 2 on a usage error; 3 on a drain
# timeout with --on-timeout abort.
set -euo pipefail

admin=localhost:2019
table=default
stop_cmd=
start_cmd=
timeout=300
on_timeout=proceed
poll=0.5
port_timeout=60
upstreams=()

usage() {
	sed -n '2,/^set -euo pipefail/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

usage_error() {
	echo "rolling-deploy: $*" >&2
	echo "run 'rolling-deploy.sh --help' for usage" >&2
	exit 2
}

is_number() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }

while (($#)); do
	opt=$1
	val=
	has_val=false
	case $opt in
	--*=*)
		val=${opt#*=}
		opt=${opt%%=*}
		has_val=true
		;;
	esac
	case $opt in
	-h | --help)
		usage
		exit 0
		;;
	--admin | --table | --stop | --start | --timeout | --on-timeout | --poll | --port-timeout)
		if ! $has_val; then
			(($# >= 2)) || usage_error "$opt needs a value"
			val=$2
			shift
		fi
		case $opt in
		--admin) admin=$val ;;
		--table) table=$val ;;
		--stop) stop_cmd=$val ;;
		--start) start_cmd=$val ;;
		--timeout) timeout=$val ;;
		--on-timeout) on_timeout=$val ;;
		--poll) poll=$val ;;
		--port-timeout) port_timeout=$val ;;
		esac
		;;
	--)
		shift
		upstreams+=("$@")
		break
		;;
	-*) usage_error "unknown option $opt" ;;
	*) upstreams+=("$opt") ;;
	esac
	shift
done

((${#upstreams[@]} > 0)) || usage_error "no upstream given"
[[ -n $stop_cmd ]] || usage_error "--stop is required"
[[ -n $start_cmd ]] || usage_error "--start is required"
[[ $timeout =~ ^[0-9]+$ ]] || usage_error "--timeout must be whole seconds, got '$timeout'"
[[ $port_timeout =~ ^[0-9]+$ ]] || usage_error "--port-timeout must be whole seconds, got '$port_timeout'"
is_number "$poll" || usage_error "--poll must be a number of seconds, got '$poll'"
[[ $on_timeout == proceed || $on_timeout == abort || $on_timeout == failover ]] ||
	usage_error "--on-timeout must be 'failover', 'proceed' or 'abort', got '$on_timeout'"
command -v curl >/dev/null || usage_error "curl is required"

case $admin in
http://* | https://*) admin_url=${admin%/} ;;
*) admin_url=http://${admin%/} ;;
esac

# clock sets $now to the time in microseconds: from EPOCHREALTIME on bash 5,
# else whole seconds from SECONDS.
now=0
clock() {
	if [[ -n ${EPOCHREALTIME:-} ]]; then
		now=${EPOCHREALTIME//[!0-9]/}
		now=$((10#$now))
	else
		now=$((SECONDS * 1000000))
	fi
}

# secs prints a duration in microseconds as seconds with one decimal.
secs() { printf '%d.%d' $(($1 / 1000000)) $(($1 / 100000 % 10)); }

# log prints one line of progress, with the time.
log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*"; }

fail() {
	log "ERROR: $*" >&2
	exit 1
}

# json_escape escapes a string for a JSON string literal.
json_escape() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g'; }

# json_field prints the value of a scalar field of the one JSON object in $2.
json_field() {
	printf '%s' "$2" | sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\{0,1\}\([^,\"}]*\).*/\1/p" | head -n 1
}

# admin_call METHOD PATH [CURL ARGS...] calls the admin API and sets $code
# to the HTTP status and $body to the answer; anything but 200 is fatal
# unless $admin_may_fail is true.
body= code= admin_may_fail=false
admin_call() {
	local method=$1 path=$2 out rc=0
	shift 2
	out=$(curl --noproxy '*' -s -X "$method" --max-time 10 -w '\n%{http_code}' "$@" "$admin_url$path") || rc=$?
	((rc == 0)) || fail "admin API $method $path: cannot reach Caddy's admin endpoint at $admin_url (curl exit status $rc)"
	code=${out##*$'\n'}
	body=${out%$'\n'*}
	body=${body%$'\n'}
	[[ $code == 200 ]] || $admin_may_fail || fail "admin API $method $path: HTTP $code: $body"
}

# set_draining UPSTREAM drain|undrain [DEADLINE]
set_draining() {
	local want=true deadline=
	[[ $2 == undrain ]] && want=false
	[[ -n ${3:-} ]] && deadline=",\"deadline\":\"$3\""
	admin_call POST "/mcp_sessions/$2" -H 'Content-Type: application/json' \
		--data-binary "{\"table\":\"$(json_escape "$table")\",\"upstream\":\"$(json_escape "$1")\"$deadline}"
	[[ $code == 200 ]] || fail "admin API POST /mcp_sessions/$2: HTTP $code: $body"
	[[ $(json_field draining "$body") == "$want" ]] ||
		fail "admin API $2 $1: the answer does not say draining=$want: $body"
}

# live_sessions UPSTREAM sets $live and $draining from the admin API. With
# a shared store (several Caddy replicas), $live counts the sessions on
# every replica.
live= draining=
live_sessions() {
	admin_call GET /mcp_sessions/upstream -G --data-urlencode "table=$table" --data-urlencode "upstream=$1"
	live=$(json_field cluster_live_sessions "$body")
	[[ -n $live ]] || live=$(json_field live_sessions "$body")
	draining=$(json_field draining "$body")
	[[ $live =~ ^[0-9]+$ ]] || fail "admin API: no live_sessions in the answer: $body"
}

# accepting UPSTREAM reports whether the upstream accepts connections. The
# probe is one HTTP GET of /; any answer, even garbage, counts.
accepting() {
	local up=$1 t rc=0 args
	if [[ $up == unix/* ]]; then
		args=(--unix-socket "${up#unix/}" http://localhost/)
	else
		args=("http://$up/")
	fi
	t=$(curl --noproxy '*' -s -o /dev/null -w '%{time_connect}' --connect-timeout 1 --max-time 2 "${args[@]}") || rc=$?
	case $rc in
	0) return 0 ;;
	6 | 7) return 1 ;;            # cannot resolve, connection refused
	28) [[ $t =~ [1-9] ]] ;;      # timed out: connected or not?
	*) return 0 ;;                # connected, then an HTTP-level error
	esac
}

# wait_port UPSTREAM open|closed
wait_port() {
	local up=$1 want=$2 start
	clock
	start=$now
	while :; do
		if accepting "$up"; then
			[[ $want == open ]] && return 0
		else
			[[ $want == closed ]] && return 0
		fi
		clock
		((now - start < port_timeout * 1000000)) || return 1
		sleep 0.1
	done
}

# expand CMD UPSTREAM replaces the placeholders in CMD.
expand() {
	local cmd=$1 up=$2 host= port= socket=
	if [[ $up == unix/* ]]; then
		socket=${up#unix/}
	else
		host=${up%:*}
		port=${up##*:}
		host=${host#[}
		host=${host%]}
	fi
	cmd=${cmd//"{upstream}"/"$up"}
	cmd=${cmd//"{host}"/"$host"}
	cmd=${cmd//"{port}"/"$port"}
	cmd=${cmd//"{socket}"/"$socket"}
	printf '%s' "$cmd"
}

# run_step UPSTREAM WHAT CMD runs a stop or start command.
run_step() {
	local up=$1 what=$2 cmd rc=0
	cmd=$(expand "$3" "$up")
	log "$up: $what: $cmd"
	bash -c "$cmd" || rc=$?
	((rc == 0)) || left_drained "$up" "$what command exited with status $rc"
}

left_drained() {
	fail "$1: $2; the upstream is left drained. Once it serves again, undrain it with:
  curl -X POST -H 'Content-Type: application/json' -d '{\"table\":\"$table\",\"upstream\":\"$1\"}' $admin_url/mcp_sessions/undrain"
}

for up in "${upstreams[@]}"; do
	[[ $up =~ ^unix/.+$ || $up =~ ^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):[0-9]+$ ]] ||
		usage_error "'$up' is not a dial address such as 127.0.0.1:9001, [::1]:9001 or unix//run/mcp.sock"
done

# A typo in an upstream would drain an address that serves nothing: warn
# when it is not in Caddy's running config (dynamic upstreams are not).
admin_call GET /config/
config=$body
in_config() { grep -qF "\"dial\":\"$1\"" <<<"$config"; }
for up in "${upstreams[@]}"; do
	if ! in_config "$up"; then
		log "warning: $up is not a dial address in Caddy's running config (a typo, or dynamic upstreams?)"
	fi
done

n=${#upstreams[@]}
i=0
for up in "${upstreams[@]}"; do
	i=$((i + 1))
	if [[ $on_timeout == failover ]]; then
		log "[$i/$n] $up: drain, deadline ${timeout}s"
		set_draining "$up" drain "${timeout}s"
	else
		log "[$i/$n] $up: drain"
		set_draining "$up" drain
	fi

	# Drain done is live_sessions 0 on two polls in a row: an initialize that
	# was balanced to the upstream just before the drain may still be learned.
	clock
	start=$now
	zeros=0
	timed_out=false
	while :; do
		live_sessions "$up"
		[[ $draining == true ]] || fail "$up: no longer draining (was it undrained by someone else?)"
		if ((live == 0)); then
			zeros=$((zeros + 1))
			((zeros >= 2)) && break
		else
			zeros=0
		fi
		clock
		log "[$i/$n] $up: draining, $live live sessions ($(secs $((now - start)))s/${timeout}s)"
		if ((now - start >= timeout * 1000000)); then
			((live == 0)) || timed_out=true
			break
		fi
		sleep "$poll"
	done
	if $timed_out; then
		if [[ $on_timeout == failover ]]; then
			log "[$i/$n] $up: drain deadline of ${timeout}s passed with $live live sessions; replacing it: they fail over to other upstreams on their next request"
		elif [[ $on_timeout == abort ]]; then
			log "[$i/$n] $up: drain timed out after ${timeout}s with $live live sessions; undraining it and aborting"
			set_draining "$up" undrain
			exit 3
		else
			log "[$i/$n] $up: drain timed out after ${timeout}s; replacing it anyway: forgetting its $live remaining sessions (their clients get 404 and re-initialize)"
			admin_call POST /mcp_sessions/evict -H 'Content-Type: application/json' \
				--data-binary "{\"table\":\"$(json_escape "$table")\",\"upstream\":\"$(json_escape "$up")\"}"
		fi
	else
		clock
		log "[$i/$n] $up: drain done, 0 live sessions after $(secs $((now - start)))s"
	fi

	run_step "$up" stop "$stop_cmd"
	log "[$i/$n] $up: waiting for the old process to close the port"
	wait_port "$up" closed || left_drained "$up" "still accepting connections ${port_timeout}s after the stop command"

	run_step "$up" start "$start_cmd"
	log "[$i/$n] $up: waiting for the new process to accept connections"
	wait_port "$up" open || left_drained "$up" "not accepting connections ${port_timeout}s after the start command"

	set_draining "$up" undrain
	log "[$i/$n] $up: undrained, replaced"
done
log "all $n upstreams replaced"
