#!/usr/bin/env bash
# Full cluster test (`make cluster-test`): run config/quick.yaml on a real one-node SLURM cluster
# through profiles/slurm and check that its results equal a local run's, byte for byte.
#
#   1. install slurmctld, slurmd, slurm-client and munge if missing (slurm_install.sh);
#   2. start munged, slurmctld and slurmd on 127.0.0.1 (slurm_up.sh), with PID files in
#      $ATTNQ_SLURM_DIR (default /tmp/attnquery-slurm);
#   3. run the workflow locally (--cores 2) and through `--workflow-profile profiles/slurm`, each
#      in its own temporary directory, and check that the compute jobs went through sbatch;
#   4. compare every results/**/*.parquet except timing tables (compare_results.py);
#   5. on every exit (success, failure, SIGINT, SIGTERM) stop exactly the daemons it started
#      (slurm_down.sh, by their PID files) and remove the temporary directories (kept on failure).
#
# Environment: VENV (default .venv), ATTNQ_CONFIG (default config/quick.yaml),
# ATTNQ_CLUSTER_TIMEOUT (seconds per workflow run, default 1800), ATTNQ_KEEP=1 keeps the
# temporary directories. Must be run as root from anywhere; paths are resolved from the repo.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$REPO/$VENV" ;; esac
SNAKEMAKE="$VENV/bin/snakemake"
PYTHON="$VENV/bin/python"
CONFIG="${ATTNQ_CONFIG:-config/quick.yaml}"
case "$CONFIG" in /*) ;; *) CONFIG="$REPO/$CONFIG" ;; esac
STATE="${ATTNQ_SLURM_DIR:-/tmp/attnquery-slurm}"
TIMEOUT_S="${ATTNQ_CLUSTER_TIMEOUT:-1800}"
# The test cluster's partition is the profile's default partition.
PARTITION="$(sed -n 's/^ *slurm_partition: *"\{0,1\}\([A-Za-z0-9_-]*\)"\{0,1\}.*$/\1/p' \
    "$REPO/profiles/slurm/config.yaml" | head -n 1)"
export ATTNQ_SLURM_PARTITION="${PARTITION:?no slurm_partition in profiles/slurm/config.yaml}"

log() { echo "cluster-test: $*"; }
die() { echo "cluster-test: FAILED: $*" >&2; exit 1; }

[ -x "$SNAKEMAKE" ] || die "$SNAKEMAKE not found (run 'make install' or set VENV)"
[ -f "$CONFIG" ] || die "config $CONFIG not found"
[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts SLURM daemons)"

T0=$(date +%s)
# Results record the commit they were computed at (column git_commit): a commit made while the
# test runs makes the two runs differ, which is reported as such.
head_commit() { git -C "$REPO" rev-parse HEAD 2>/dev/null || echo none; }
HEAD_BEFORE="$(head_commit)"
"$HERE/slurm_install.sh"

WORK="$(mktemp -d /tmp/attnquery-cluster-test.XXXXXX)"
SMK_PID=""
started=0
status=1
cleanup() {
    trap - EXIT INT TERM
    if [ -n "$SMK_PID" ] && kill -0 "$SMK_PID" 2>/dev/null; then
        # Snakemake cancels its SLURM jobs and exits on SIGINT (it ignores SIGTERM).
        kill -INT "$SMK_PID" 2>/dev/null || true
        wait "$SMK_PID" 2>/dev/null || true
    fi
    if [ "$started" -eq 1 ]; then
        "$HERE/slurm_down.sh" "$STATE" || true
    fi
    if [ "$status" -eq 0 ] && [ "${ATTNQ_KEEP:-0}" != 1 ]; then
        rm -rf "$WORK"
    else
        log "runs kept in $WORK (SLURM logs: $STATE/log)"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

started=1
"$HERE/slurm_up.sh" "$STATE"
# shellcheck disable=SC1091
source "$STATE/env.sh"
T1=$(date +%s)

run_snakemake() {  # name, then snakemake arguments
    local name="$1"
    shift
    mkdir -p "$WORK/$name"
    log "$name run: snakemake $* (log: $WORK/$name.log)"
    # In the background, so that a signal to this script reaches the cleanup trap at once.
    (cd "$REPO" && exec timeout --signal=INT --kill-after=60 "$TIMEOUT_S" "$SNAKEMAKE" \
        -s "$REPO/Snakefile" --configfile "$CONFIG" --directory "$WORK/$name" "$@") \
        >"$WORK/$name.log" 2>&1 &
    SMK_PID=$!
    local rc=0
    wait "$SMK_PID" || rc=$?
    SMK_PID=""
    if [ "$rc" -ne 0 ]; then
        tail -n 40 "$WORK/$name.log" >&2
        die "$name run exited with status $rc"
    fi
}

run_snakemake local --cores 2
T2=$(date +%s)
run_snakemake slurm --workflow-profile profiles/slurm
T3=$(date +%s)

# The compute jobs must have gone through sbatch, and only they.
n_shards=$(find "$WORK/local/results" -path '*/shards/*.parquet' ! -name '*.timing.parquet' | wc -l)
n_submitted=$(grep -c "submitted with SLURM jobid" "$WORK/slurm.log" || true)
[ "$n_shards" -gt 0 ] || die "the local run produced no shard tables"
[ "$n_submitted" -eq "$n_shards" ] \
    || die "$n_submitted jobs submitted to SLURM, expected one per shard ($n_shards)"
log "$n_submitted run_shard jobs ran under SLURM; aggregation, merging and plots ran locally"

if ! "$PYTHON" "$HERE/compare_results.py" "$WORK/local" "$WORK/slurm"; then
    if [ "$(head_commit)" != "$HEAD_BEFORE" ]; then
        die "results of the SLURM run differ from the local run's; the repository's HEAD moved" \
            "from $HEAD_BEFORE to $(head_commit) during the test (see column git_commit): rerun"
    fi
    die "results of the SLURM run differ from the local run's"
fi

status=0
log "PASSED (cluster start $((T1 - T0)) s, local run $((T2 - T1)) s, SLURM run $((T3 - T2)) s, total $(($(date +%s) - T0)) s)"
