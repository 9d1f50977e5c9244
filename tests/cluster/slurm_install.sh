#!/usr/bin/env bash
# Install the Debian packages of a one-node SLURM test cluster, if they are missing.
#
# Idempotent: does nothing when every package is already installed. Needs root (or sudo) and
# a reachable Debian mirror. Package maintainer scripts are stopped from starting any daemon
# (a temporary /usr/sbin/policy-rc.d), so installing leaves nothing running: the test cluster
# starts and stops its own daemons (tests/cluster/slurm_up.sh, slurm_down.sh).
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge)

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -eq 0 ]; then
    echo "slurm_install: ${PACKAGES[*]} already installed"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "slurm_install: packages ${missing[*]} are missing; installing them needs root" >&2
        exit 1
    fi
fi

echo "slurm_install: installing ${missing[*]}"
POLICY=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$POLICY" ]; then
    # exit status 101: "action forbidden", so no init script starts a daemon during install.
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    created_policy=1
fi
cleanup() {
    if [ "$created_policy" -eq 1 ]; then
        $SUDO rm -f "$POLICY"
    fi
}
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
