#!/usr/bin/env bash
# A CPU calibration of the GPU machine's host (issue 14: validate on more than one CPU) in
# device-tool calls of at most 10 minutes each. Run from the repository root on that machine,
# one stage per call; the tables land under $OUT/ref, the log (lscpu and load included) in
# $OUT/<stage>.log:
#   bash scripts/cpu_calibrate.sh kernels   # device gemm utility attention memory embedding
#                                           # (16-core Xeon, 2026-11-26: ~7 min)
#   USUAL_PROBES=G,H bash scripts/cpu_calibrate.sh graphs
#                                           # workloads traces + the HF configs' runs (~5 min)
# USUAL_PROBES: the kernels stage's usual probe times (`scripts/usual_probes.py` on its
# gemm_samples, back here), which the workloads and traces sweeps test spells against, as
# they do when the runner takes the GEMM sweep in the same process. Unset: their own readings.
# The bare node has torch and numpy only: `python -m pipeline.runner` needs nothing else (it
# writes .jsonl where pyarrow is missing). Back here: copy $OUT/ref/* into
# models_store/reference/<slug>/ (the slug is the `device` column; the loader passes over the
# .json), then `DEVCHAR_HOME=$(mktemp -d) devchar run --device <slug>`; docs/gpu.md has the rest.
# Both stages and a machine start come to ~13 min of a 15-minute device budget: check `status`.
# The device tool brings back at most 8 files a call: a stage writes 6 tables at most, its
# hf_measured.json and one log, and says so when $OUT holds more.
# scripts/probe_thread_wake.py (~20 s, into a log only) is left to a session with time to spare.
set -euo pipefail
OUT="${OUT:?run through the device tool, which sets OUT}"
PROFILE="${DEVCHAR_PROFILE:-quick}"
case "${1:?stage: kernels or graphs}" in
  kernels) sweeps=(device gemm utility attention memory embedding) ;;
  graphs)  sweeps=(workloads traces) ;;
  *) echo "unknown stage $1; expected kernels or graphs" >&2; exit 2 ;;
esac
mkdir -p "$OUT/ref"
log="$OUT/$1.log"
{ lscpu; uptime; } > "$log" 2>&1 || true  # a busy host shows in the load first
start=$(date +%s)
usual=()
[ "$1" = graphs ] && [ -n "${USUAL_PROBES:-}" ] && usual=(--usual-probes "$USUAL_PROBES")
python3 -m pipeline.runner "${sweeps[@]}" --device cpu --profile "$PROFILE" --out "$OUT/ref" "${usual[@]}" 2>&1 | tee -a "$log"
if [ "$1" = graphs ]; then  # unseen configs for `devchar predict --hf-config` to be checked against
  python3 scripts/measure_hf.py --out "$OUT/ref/hf_measured.json" 2>&1 | tee -a "$log"
fi
echo "cpu_calibrate $1: $(( $(date +%s) - start )) s" | tee -a "$log"
n=$(find "$OUT" -type f | wc -l)
[ "$n" -le 8 ] || echo "warning: $n files under \$OUT; the device tool brings back 8" | tee -a "$log"
