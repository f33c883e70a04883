#!/usr/bin/env bash
# Step 40: the series' NeMo-RL patches onto the base's NeMo-RL checkout (an
# editable install in the NeMo-RL image, so patching the tree patches every venv).
#   cuda: the checkout must be at the series' pin; each patch must apply.
#   cpu:  the base has no NeMo-RL checkout: the patches are listed, not applied.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_var GTP_FLAVOR GTP_WHEELHOUSE
dir="${GTP_NEMO_RL_DIR-/opt/nemo-rl}"
pin="${GTP_NEMO_RL_COMMIT:-$(series_json pins.nemo-rl.commit 2>/dev/null || true)}"
patches=()
if [ -d "$GTP_WHEELHOUSE/nemo-rl" ]; then
  while IFS= read -r p; do patches+=("$p"); done < <(find "$GTP_WHEELHOUSE/nemo-rl" -name '*.patch' | sort)
fi
if [ "${#patches[@]}" = 0 ]; then
  log "the series has no nemo-rl patches: nothing to apply"
  exit 0
fi
if [ -z "$dir" ]; then
  log "no NeMo-RL checkout given: ${#patches[@]} patch(es) not applied"
  exit 0
fi
if [ "$GTP_FLAVOR" = cpu ]; then
  log "check only (cpu flavour has no NeMo-RL checkout): ${#patches[@]} patch(es) would go onto $dir at ${pin:-the pin}:"
  for p in "${patches[@]}"; do log "  $(basename "$p")"; done
  exit 0
fi

[ -d "$dir/.git" ] || [ -f "$dir/.git" ] || die "$dir is not a git checkout of NeMo-RL (set GTP_NEMO_RL_DIR)"
command -v git >/dev/null || die "git is needed to apply the NeMo-RL patches"
g() { git -C "$dir" -c core.pager=cat -c advice.detachedHead=false "$@"; }
head=$(g rev-parse HEAD)
if [ -n "$pin" ] && [ "$head" != "$pin" ] && [ "${GTP_NEMO_RL_ANY_COMMIT:-0}" != 1 ]; then
  die "$dir is at $head, the series pins $pin (use a base built at the pin, or GTP_NEMO_RL_ANY_COMMIT=1)"
fi
# The series is one unit: a later patch may change a hunk an earlier one made, so
# "already applied" is judged for the whole series, never patch by patch. Each path
# the series touches is compared with the pin's and with the pin plus the series'
# (built in a throwaway index file: the checkout's own index is left alone); paths
# outside the series are not looked at.
tmp=$(mktemp -d -t gtp-nemo-rl.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
want() { GIT_INDEX_FILE="$tmp/want" g "$@"; }
want read-tree HEAD
for p in "${patches[@]}"; do
  want apply --cached "$p" 2>"$tmp/err" || {
    cat "$tmp/err" >&2
    die "$(basename "$p") does not apply to $dir at $head after the patches before it (nothing was changed)"
  }
done
at_pin=0; applied=0; other=()
for p in "${patches[@]}"; do g apply --numstat "$p" | cut -f3; done | sort -u > "$tmp/paths"
while IFS= read -r path; do
  pin_blob=$(g ls-tree HEAD -- "$path" | awk '{ print $3 }')
  want_blob=$(want ls-files --stage -- "$path" | awk '{ print $2 }')
  have_blob=""
  if [ -f "$dir/$path" ]; then have_blob=$(g hash-object -- "$path")
  elif [ -e "$dir/$path" ] || [ -L "$dir/$path" ]; then have_blob="not a file"; fi   # a folder or link stands there
  if [ "$have_blob" = "$want_blob" ]; then applied=$((applied + 1)); fi
  if [ "$have_blob" = "$pin_blob" ]; then at_pin=$((at_pin + 1)); fi
  if [ "$have_blob" != "$want_blob" ] && [ "$have_blob" != "$pin_blob" ]; then other+=("$path"); fi
done < "$tmp/paths"
total=$(wc -l < "$tmp/paths")
if [ "$applied" = "$total" ]; then
  log "already applied: the whole series (${#patches[@]} patch(es), $total file(s)) on $head; left as it is"
  exit 0
fi
if [ "$at_pin" != "$total" ]; then
  [ "${#other[@]}" -gt 0 ] || other=("(part of the series only)")
  die "$dir: the files this series patches are neither as at the pin nor as the series leaves them" \
      "(${other[*]:0:5}): nothing was applied. See them with: git -C $dir status;" \
      "to set them aside (kept in a stash) and start from the pin: git -C $dir stash push --include-untracked"
fi
# git apply is not atomic when a write fails (a patch may leave some of its files written), so undoing
# is not reversing patches: every path the series touches was as at the pin, and goes back to it.
to_pin() {
  while IFS= read -r path; do
    if [ -n "$(g ls-tree HEAD -- "$path")" ]; then g restore --source=HEAD --worktree -- "$path"
    elif [ -f "$dir/$path" ] || [ -L "$dir/$path" ]; then rm -f -- "$dir/$path"; fi
  done < "$tmp/paths"
}
for p in "${patches[@]}"; do
  if ! g apply "$p"; then
    to_pin
    die "$(basename "$p") did not apply to the working tree of $dir: every file the series touches is back as at the pin"
  fi
  log "applied $(basename "$p")"
done
