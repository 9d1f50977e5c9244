#!/usr/bin/env bash
# Start a one-node SLURM cluster on 127.0.0.1 (munged, slurmctld, slurmd), without systemd.
#
# Usage: tests/cluster/slurm_up.sh [STATE_DIR]
#
# STATE_DIR (default $ATTNQ_SLURM_DIR, else /tmp/attnquery-slurm) receives slurm.conf, the munge
# key and socket, the daemons' PID, state and log files, and env.sh, which sets SLURM_CONF for
# the client commands (sinfo, sbatch, squeue, ...) and puts an srun shim first on PATH. Each
# daemon writes a PID file there; tests/cluster/slurm_down.sh STATE_DIR stops exactly those
# daemons. No cgroup.conf is needed: no cgroup plugin is used (the machine may lack systemd). Must be run as root (the
# daemons run as root, munged as the munge user). The partition is named $ATTNQ_SLURM_PARTITION
# (default "batch", the partition of profiles/slurm). Returns once the node is idle.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${1:-${ATTNQ_SLURM_DIR:-/tmp/attnquery-slurm}}"
PARTITION="${ATTNQ_SLURM_PARTITION:-batch}"
CTLD_PORT="${ATTNQ_SLURMCTLD_PORT:-16817}"
SLURMD_PORT="${ATTNQ_SLURMD_PORT:-16818}"
NODE="attnq"
WAIT_S="${ATTNQ_SLURM_WAIT_S:-90}"

die() { echo "slurm_up: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (it starts slurmctld, slurmd and munged)"
for exe in munged slurmctld slurmd sinfo; do
    command -v "$exe" >/dev/null 2>&1 || die "$exe not found: run tests/cluster/slurm_install.sh"
done
id munge >/dev/null 2>&1 || die "user 'munge' does not exist (it comes with the munge package)"
case "$STATE" in /*) ;; *) die "STATE_DIR must be an absolute path, got '$STATE'" ;; esac

# Daemons left by an earlier run of this script in the same state directory are stopped first
# (only those: found by their PID files).
if ls "$STATE"/*.pid "$STATE"/munge/munged.pid >/dev/null 2>&1; then
    echo "slurm_up: stopping daemons left by an earlier run in $STATE"
    "$HERE/slurm_down.sh" "$STATE"
fi

# The state directory is emptied, so it must be one this script created (marker file) or a new
# or empty one: never a directory holding anything else.
MARKER="$STATE/.attnquery-slurm-state"
if [ -e "$STATE" ] && [ ! -e "$MARKER" ] && [ -n "$(ls -A "$STATE" 2>/dev/null)" ]; then
    die "$STATE exists and was not created by slurm_up.sh; choose another ATTNQ_SLURM_DIR"
fi
rm -rf "$STATE"
mkdir -p "$STATE"/{slurmctld,slurmd,log,munge}
chmod 755 "$STATE"
touch "$MARKER"

HOST="$(hostname -s)"
CPUS="$(nproc)"
# RealMemory: 80% of the physical memory (slurmd drains a node that has less than declared).
MEM_MB=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) * 8 / 10 / 1024 ))

sed -e "s|@STATE@|$STATE|g" -e "s|@HOST@|$HOST|g" -e "s|@CTLD_PORT@|$CTLD_PORT|g" \
    -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" -e "s|@NODE@|$NODE|g" -e "s|@CPUS@|$CPUS|g" \
    -e "s|@MEM_MB@|$MEM_MB|g" -e "s|@PARTITION@|$PARTITION|g" \
    "$HERE/slurm.conf.in" >"$STATE/slurm.conf"
export SLURM_CONF="$STATE/slurm.conf"
# srun shim: the SLURM executor plugin runs each job's command through `srun` with every SLURM_*
# variable removed from the environment, SLURM_CONF included, so srun inside a job would look
# for /etc/slurm/slurm.conf. The shim, first on PATH, points srun at this cluster's slurm.conf
# instead, which leaves /etc alone.
mkdir -p "$STATE/bin"
printf '#!/bin/sh\nSLURM_CONF=%s exec %s "$@"\n' "$SLURM_CONF" "$(command -v srun)" >"$STATE/bin/srun"
chmod 755 "$STATE/bin/srun"
printf 'export SLURM_CONF=%s\nexport PATH=%s:"$PATH"\n' "$SLURM_CONF" "$STATE/bin" >"$STATE/env.sh"

# munged, as the munge user, with its own key and socket in the state directory.
dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
chown -R munge:munge "$STATE/munge"
chmod 400 "$STATE/munge/munge.key"
chmod 711 "$STATE/munge"   # others may reach the socket, not list the directory
runuser -u munge -- munged \
    --socket="$STATE/munge/munge.socket" \
    --key-file="$STATE/munge/munge.key" \
    --pid-file="$STATE/munge/munged.pid" \
    --log-file="$STATE/munge/munged.log" \
    --seed-file="$STATE/munge/munged.seed" \
    || die "munged did not start; see $STATE/munge/munged.log"

wait_for_file() {  # path seconds
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        [ -s "$1" ] && return 0
        sleep 0.1
    done
    return 1
}
wait_for_file "$STATE/munge/munged.pid" 10 || die "munged wrote no PID file"

slurmctld -f "$SLURM_CONF" || die "slurmctld did not start; see $STATE/log/slurmctld.log"
wait_for_file "$STATE/slurmctld.pid" 20 || die "slurmctld wrote no PID file; see $STATE/log/slurmctld.log"
slurmd -f "$SLURM_CONF" -N "$NODE" || die "slurmd did not start; see $STATE/log/slurmd.log"
wait_for_file "$STATE/slurmd.pid" 20 || die "slurmd wrote no PID file; see $STATE/log/slurmd.log"

# Wait for the node to register and become idle.
for ((i = 0; i < WAIT_S; i++)); do
    state="$(sinfo -h -n "$NODE" -o %t 2>/dev/null || true)"
    if [ "$state" = "idle" ]; then
        echo "slurm_up: node $NODE idle in partition $PARTITION ($CPUS CPUs, ${MEM_MB} MB); SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 1
done
echo "slurm_up: node $NODE not idle after ${WAIT_S}s (state '${state:-}')" >&2
tail -n 20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
exit 1
