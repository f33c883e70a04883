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
for p in "${patches[@]}"; do
  name=$(basename "$p")
  if g apply --check "$p" 2>/dev/null; then
    g apply "$p"
    log "applied $name"
  elif g apply --reverse --check "$p" 2>/dev/null; then
    log "already applied: $name"
  else
    g apply --check "$p" || true
    die "$name does not apply to $dir at $head"
  fi
done
