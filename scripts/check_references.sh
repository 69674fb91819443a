#!/usr/bin/env bash
# Fit, predict and check every committed reference calibration (models_store/reference/<slug>/),
# each in a data directory of its own: nothing is measured, the blocking held-out checks gate.
# A reference that lists known failures in `expected_check_failures` passes only while exactly
# those checks fail (devchar run --expect-failing).
#
# $CHECK_REFERENCES_SKIP (default opencl_models) names assets the replays leave out, with what
# depends on them (devchar run --skip): the OpenCL models' check warns and never gates, their fit
# took ~55 s of each replay, and the slow tier fits them from a fresh sweep. Set it empty to
# replay everything.
#
# The replays measure nothing, so they share the cores: $CHECK_REFERENCES_JOBS at a time
# (default: the core count). Each one's output is kept in a log and printed whole once it ends.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${DEVCHAR_HOME:?set DEVCHAR_HOME (make check-references does)}"
DEVCHAR=${DEVCHAR:-.venv/bin/devchar}
JOBS=${CHECK_REFERENCES_JOBS:-$(nproc 2>/dev/null || echo 1)}
if ! [[ $JOBS =~ ^[1-9][0-9]*$ ]]; then
  echo "check-references: CHECK_REFERENCES_JOBS must be a whole number >= 1, not '$JOBS'" >&2
  exit 2
fi
REFERENCES=${REFERENCES:-models_store/reference}
SKIP=${CHECK_REFERENCES_SKIP-opencl_models}
LOGS="$DEVCHAR_HOME/references/logs"
mkdir -p "$LOGS"

replay() {  # replay DIR: one reference, its output to $LOGS/<slug>.log, its exit status to .rc
  local dir=$1 slug expect=() skip=() names=() asset
  read -ra names <<< "$SKIP"  # words, never glob patterns
  for asset in ${names[@]+"${names[@]}"}; do skip+=(--skip "$asset"); done
  slug=$(basename "$dir")
  if [ -f "$dir/expected_check_failures" ]; then
    # `|| [ -n ... ]`: a last line without its newline still counts
    while read -r check || [ -n "$check" ]; do expect+=(--expect-failing "$check"); done < <(
      sed -n 's/^\([a-z_]*\.[a-z_]*\).*/\1/p' "$dir/expected_check_failures")
  fi
  local start=$SECONDS
  DEVCHAR_HOME="$DEVCHAR_HOME/references/$slug" "$DEVCHAR" run --device "$slug" --log-level WARNING \
    ${expect[@]+"${expect[@]}"} ${skip[@]+"${skip[@]}"} > "$LOGS/$slug.log" 2>&1
  echo $? > "$LOGS/$slug.rc"
  echo "check-references: $slug exit $(cat "$LOGS/$slug.rc") in $((SECONDS - start)) s"
}
export -f replay
export DEVCHAR LOGS SKIP

dirs=()
for d in "$REFERENCES"/*/; do
  [ -f "$d/devices.parquet" ] && dirs+=("${d%/}")
done
if [ ${#dirs[@]} -eq 0 ]; then
  echo "check-references: no committed calibration under $REFERENCES/"
  exit 0
fi
if ! command -v "$DEVCHAR" > /dev/null; then
  echo "check-references: no devchar at '$DEVCHAR' (make check-references installs the venv first)" >&2
  exit 2
fi
[ "$JOBS" -le "${#dirs[@]}" ] || JOBS=${#dirs[@]}
if [ "$JOBS" -gt 1 ]; then
  # replays side by side each keep to one thread: two that each spin up a thread per core
  # (torch's and BLAS's pools) took longer together on the 2-core VM than one after the other
  export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
  export DEVCHAR_FIT_JOBS=${DEVCHAR_FIT_JOBS:-1}  # nor a process per core for the MLP searches
fi
rm -f "$LOGS"/*.log "$LOGS"/*.rc
printf '%s\0' "${dirs[@]}" | xargs -0 -n 1 -P "$JOBS" bash -c 'replay "$1"' _

failed=()
for d in "${dirs[@]}"; do
  slug=$(basename "$d")
  echo "=== $slug ==="
  cat "$LOGS/$slug.log"
  [ "$(cat "$LOGS/$slug.rc" 2>/dev/null)" = 0 ] || failed+=("$slug")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "check-references: FAILED: ${failed[*]} (logs under $LOGS)"
  exit 1
fi
echo "check-references: all ${#dirs[@]} calibrations passed"
