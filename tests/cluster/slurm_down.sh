#!/usr/bin/env bash
# Stop the one-node SLURM cluster started by tests/cluster/slurm_up.sh.
#
# Usage: tests/cluster/slurm_down.sh [STATE_DIR]
#
# Cancels the cluster's remaining jobs, then stops exactly the daemons whose PID files lie in
# STATE_DIR (slurmd, slurmctld, munged, in that order): SIGTERM, then SIGKILL after 20 s. A PID
# whose process is not the expected program is left alone. Safe to run twice.
set -uo pipefail

STATE="${1:-${ATTNQ_SLURM_DIR:-/tmp/attnquery-slurm}}"

if [ -f "$STATE/slurm.conf" ] && [ -s "$STATE/slurmctld.pid" ] && command -v scancel >/dev/null; then
    export SLURM_CONF="$STATE/slurm.conf"
    if kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null; then
        timeout 20 scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
        for _ in $(seq 1 20); do
            [ -z "$(timeout 10 squeue -h -t PD,R,CG -o %i 2>/dev/null)" ] && break
            sleep 1
        done
    fi
fi

stop_daemon() {  # pidfile program
    local pidfile="$1" prog="$2" pid
    [ -s "$pidfile" ] || return 0
    pid="$(tr -dc '0-9' <"$pidfile")"
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
        rm -f "$pidfile"
        return 0
    fi
    if ! grep -q "$prog" "/proc/$pid/comm" 2>/dev/null; then
        echo "slurm_down: PID $pid in $pidfile is not $prog; left alone" >&2
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 200); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "slurm_down: $prog (PID $pid) ignored SIGTERM; sending SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$pidfile"
    echo "slurm_down: stopped $prog (PID $pid)"
}

stop_daemon "$STATE/slurmd.pid" slurmd
stop_daemon "$STATE/slurmctld.pid" slurmctld
stop_daemon "$STATE/munge/munged.pid" munged
exit 0
