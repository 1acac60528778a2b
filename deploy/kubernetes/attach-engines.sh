#!/bin/sh
# attach-engines.sh: entry point of the infertrace DaemonSet.
#
# `infertrace attach` needs explicit pids today, so this loop supplies them. Every
# INFERTRACE_RESCAN_SECONDS (default 30) it runs `infertrace discover --json`, keeps the
# processes whose role is "api_server" (vLLM's API server, SGLang's main process; the agent
# follows their engine processes by itself) and:
#   - while none runs on this node: waits and looks again;
#   - when the set of API-server pids changes (an engine started, restarted or stopped):
#     stops the running `infertrace attach` and starts one for the new set;
#   - when `infertrace attach` has exited on its own (its engines exited, or an error):
#     starts it again at the next scan.
# SIGTERM/SIGINT are passed on to `infertrace attach` (as SIGTERM), which detaches cleanly.
# Planned: a built-in `infertrace attach --all-engines` mode will replace this script.
#
# Usage: attach-engines.sh [extra `infertrace attach` arguments, e.g. --cap-bytes 8192]
# Environment: INFERTRACE_BIN (default: infertrace), INFERTRACE_RESCAN_SECONDS (default: 30),
#              INFERTRACE_LOG (read by infertrace itself: error, warn, info, debug, trace).
# Plain POSIX sh + awk/sort/tr/sleep: the image has no bash, jq or python.
set -u

bin=${INFERTRACE_BIN:-infertrace}
interval=${INFERTRACE_RESCAN_SECONDS:-30}
case $interval in '' | *[!0-9]* | 0) interval=30 ;; esac

attach_pid= # the running `infertrace attach`, if any
attached=   # the API-server pids it was started for, sorted, space-separated
sleeper=    # the running `sleep` between scans
waiting=    # set while no API server is found, to say so once rather than every scan

log() { printf 'attach-engines: %s\n' "$*" >&2; }

# API-server pids from `infertrace discover --json` on stdin: sorted, space-separated.
# That JSON is serde's pretty output (one field per line, "pid" before "role" in each
# object), so no JSON parser is needed. Lines are matched whole: a quote inside a string
# value is escaped by serde, so a model name cannot fake a "role" line.
api_server_pids() {
    awk '
        /^[ \t]*\{[ \t]*$/ { pid = "" }
        /^[ \t]*"pid":[ \t]*[0-9]+,?[ \t]*$/ { pid = $0; gsub(/[^0-9]/, "", pid) }
        /^[ \t]*"role":[ \t]*"api_server",?[ \t]*$/ { if (pid != "") print pid; pid = "" }
    ' | sort -n -u | tr '\n' ' ' | sed 's/ *$//'
}

# start_attach PIDS [EXTRA_ARGS...]
start_attach() {
    pids=$1
    shift
    for p in $pids; do set -- "$@" --pid "$p"; done
    log "attaching to API server pid(s): $pids"
    "$bin" attach "$@" &
    attach_pid=$!
}

stop_attach() {
    [ -n "$attach_pid" ] || return 0
    kill -TERM "$attach_pid" 2>/dev/null
    # It detaches within a second or two; never hang on a stuck one.
    (sleep 20 && kill -KILL "$attach_pid" 2>/dev/null) &
    watchdog=$!
    wait "$attach_pid"
    status=$?
    kill "$watchdog" 2>/dev/null
    log "stopped attach (pid $attach_pid, exit status $status)"
    attach_pid=
}

on_signal() {
    log "stopping"
    [ -z "$sleeper" ] || kill "$sleeper" 2>/dev/null
    stop_attach
    exit 0
}
trap on_signal TERM INT

log "looking for vLLM/SGLang API servers every ${interval}s"
while :; do
    # An attach that ended by itself (the waits below reap it, so `kill -0` then fails).
    if [ -n "$attach_pid" ] && ! kill -0 "$attach_pid" 2>/dev/null; then
        wait "$attach_pid"
        log "attach (pid $attach_pid) exited with status $?; will start again"
        attach_pid=
        attached=
    fi

    if out=$("$bin" discover --json); then
        pids=$(printf '%s\n' "$out" | api_server_pids)
        if [ "$pids" != "$attached" ] || { [ -n "$pids" ] && [ -z "$attach_pid" ]; }; then
            if [ -n "$attach_pid" ]; then
                log "API server pids changed: '$attached' -> '$pids'"
                stop_attach
            fi
            attached=$pids
            [ -z "$pids" ] || start_attach "$pids" "$@"
        fi
        if [ -n "$pids" ]; then
            waiting=
        elif [ -z "$waiting" ]; then
            waiting=1
            log "no vLLM/SGLang API server on this node yet; looking again every ${interval}s"
        fi
    else
        log "infertrace discover failed (exit status $?); keeping the current state"
    fi

    sleep "$interval" &
    sleeper=$!
    wait "$sleeper"
    sleeper=
done
