#!/usr/bin/env bash
# Install Slurm and start munge for the `slurm` tests; safe to run again.
#
# Debian's packages: slurmctld, slurmd, the client commands (sbatch, srun, scancel, ...) and munge,
# the authentication every Slurm daemon and command needs. munged runs here in the background (as
# the munge user, with the key the package made); the tests start their own one-node cluster
# (slurmctld + slurmd on localhost, CPUs only, a slurm.conf of their own) and stop it afterwards
# (tests/minislurm.py). pyxis is not installed: the tests check what the nightly says without it.
set -euo pipefail

WAIT_S="${MUNGED_WAIT_S:-20}"
t0=$SECONDS

if [ "$(id -u)" != 0 ]; then
  echo "slurm.sh: needs root (apt-get, munged)" >&2
  exit 2
fi

need=()
for prog in slurmctld slurmd sbatch munged; do
  command -v "$prog" >/dev/null 2>&1 || { need=(slurmctld slurmd slurm-client munge); break; }
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "== installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # An index another script refreshed moments ago is reused; a fresh machine has none.
  if ! apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi

if [ ! -s /etc/munge/munge.key ]; then
  echo "== making /etc/munge/munge.key"
  mkdir -p /etc/munge
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
fi

if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  echo "== munged already answering ($((SECONDS - t0)) s)"
  exit 0
fi

mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
echo "== starting munged"
# Not answering is what counts (pgrep would count a dead daemon's zombie where nothing reaps
# it); --force takes over the socket a dead one left. munged puts itself in the background;
# setsid keeps it out of this script's process group.
setsid runuser -u munge -- /usr/sbin/munged --force </dev/null || true
for _ in $(seq 1 "$WAIT_S"); do
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    echo "== munged up, $(slurmd -V) installed ($((SECONDS - t0)) s)"
    exit 0
  fi
  sleep 1
done
echo "slurm.sh: munged did not answer within ${WAIT_S}s; last lines of its log:" >&2
tail -n 20 /var/log/munge/munged.log >&2 || true
exit 1
