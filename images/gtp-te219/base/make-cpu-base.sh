#!/usr/bin/env bash
# Make the local base image of the cpu flavour: a minimal Debian with Python,
# built with debootstrap and imported into the Docker engine (no registry needed).
#
#   make-cpu-base.sh [--name NAME] [--suite SUITE] [--force]
#
# The Debian mirror is the one this machine's apt uses (read at run time from
# /etc/apt/sources.list or /etc/apt/sources.list.d/*.sources); DEBIAN_MIRROR
# overrides it. The default suite is trixie: its Python (3.13) is the one the
# NeMo-RL image runs, so the cpu flavour installs the same cp313 wheels.
# Needs root, debootstrap and a running engine (.ci/docker-engine.sh sets both up).
set -euo pipefail

NAME=gtp-carry/debian-minbase:trixie
SUITE=trixie
FORCE=0
DOCKER="${DOCKER:-/usr/bin/docker}"
while [ $# -gt 0 ]; do
  case "$1" in
    --name) NAME="$2"; shift 2 ;;
    --suite) SUITE="$2"; shift 2 ;;
    --force) FORCE=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "make-cpu-base.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [ "$FORCE" = 0 ] && "$DOCKER" image inspect "$NAME" >/dev/null 2>&1; then
  echo "base $NAME exists ($("$DOCKER" image inspect --format '{{.Id}}' "$NAME"))"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "make-cpu-base.sh: debootstrap is not installed (bash .ci/docker-engine.sh)" >&2; exit 2; }

mirror_from_apt() {
  # One-line format: "deb [options] URI suite component..."
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    awk '$1 == "deb" { sub(/\[[^]]*\]/, ""); if ($2 !~ /-security/) { u = $2; sub(/\/$/, "", u); print u; exit } }' "$f" \
      | grep . && return 0
  done
  # deb822 format: "URIs: ..." within a stanza whose Types include deb.
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk 'BEGIN{RS=""; FS="\n"} {
           deb=0; uri="";
           for (i=1;i<=NF;i++) { if ($i ~ /^Types:.*(^|[ \t])deb([ \t]|$)/) deb=1;
                                 if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); uri=a[2] } }
           if (deb && uri != "" && uri !~ /-security/) { sub(/\/$/, "", uri); print uri; exit }
         }' "$f" | head -n 1 | grep . && return 0
  done
  return 1
}

MIRROR="${DEBIAN_MIRROR:-$(mirror_from_apt || true)}"
[ -n "$MIRROR" ] || { echo "make-cpu-base.sh: no Debian mirror in the apt sources; set DEBIAN_MIRROR" >&2; exit 2; }

root=$(mktemp -d -t gtp-cpu-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "== debootstrap $SUITE (minbase + python3, python3-venv) from the apt mirror"
start=$SECONDS
debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$root" "$MIRROR" > "$root.log" 2>&1 || {
  tail -n 20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# Nothing of the bootstrap's package cache or lists belongs in the image.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log
echo "== importing as $NAME"
tar --numeric-owner -C "$root" -c . \
  | "$DOCKER" import --change 'CMD ["/bin/bash"]' \
      --message "debootstrap --variant=minbase $SUITE (gtp-carry cpu base)" - "$NAME" >/dev/null
echo "base $NAME made in $((SECONDS - start))s ($("$DOCKER" image inspect --format '{{.Id}}' "$NAME"))"
