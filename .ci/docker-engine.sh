#!/usr/bin/env bash
# Install and start a Docker engine for the `docker` tests; safe to run again.
#
# The engine is Debian's package (dockerd + its own CLI at /usr/bin/docker,
# which has BuildKit built in; a newer /usr/local/bin/docker may shadow it on
# PATH and lacks buildx, so callers use /usr/bin/docker). Also installs what
# building the cpu base and exporting squashfs need: debootstrap and
# squashfs-tools. dockerd runs as root in the background and logs to
# $DOCKERD_LOG (default: /var/log/gtp-carry-dockerd.log).
set -euo pipefail

DOCKER=/usr/bin/docker
LOG="${DOCKERD_LOG:-/var/log/gtp-carry-dockerd.log}"
WAIT_S="${DOCKERD_WAIT_S:-60}"

if [ "$(id -u)" != 0 ]; then
  echo "docker-engine.sh: needs root (apt-get and dockerd)" >&2
  exit 2
fi

need=()
[ -x "$DOCKER" ] && command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v mksquashfs >/dev/null 2>&1 || need+=(squashfs-tools)
if [ "${#need[@]}" -gt 0 ]; then
  echo "== installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # The engine package's recommends are not needed here.
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if "$DOCKER" info >/dev/null 2>&1; then
  echo "== docker engine already answering ($("$DOCKER" version --format '{{.Server.Version}}'))"
  exit 0
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
  echo "== starting dockerd (log: $LOG)"
  # containerd is started by dockerd itself when none runs; setsid keeps the
  # daemon out of this script's process group so it outlives the caller.
  setsid dockerd >>"$LOG" 2>&1 < /dev/null &
fi

for _ in $(seq 1 "$WAIT_S"); do
  if "$DOCKER" info >/dev/null 2>&1; then
    echo "== docker engine up ($("$DOCKER" version --format '{{.Server.Version}}'), storage $("$DOCKER" info --format '{{.Driver}}'))"
    exit 0
  fi
  sleep 1
done
echo "docker-engine.sh: dockerd did not answer within ${WAIT_S}s; last lines of $LOG:" >&2
tail -n 20 "$LOG" >&2 || true
exit 1
