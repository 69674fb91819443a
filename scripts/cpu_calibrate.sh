#!/usr/bin/env bash
# A CPU calibration of the GPU machine's host (issue 14: validate on more than one CPU) in
# device-tool calls of at most 10 minutes each. Run from the repository root on that machine,
# one stage per call; the tables land under $OUT/ref, the log (lscpu and load included) in
# $OUT/<stage>.log. Measured on the 16-core Xeon (2026-11-30; the others' sweeps 2026-11-26):
#   bash scripts/cpu_calibrate.sh gemm      # device gemm (494 s); ends by printing USUAL_PROBES
#   USUAL_PROBES=G,H bash scripts/cpu_calibrate.sh graphs
#                                           # workloads traces (194 s) + the HF configs' runs (55 s)
#   bash scripts/cpu_calibrate.sh kernels   # utility attention memory embedding (~210 s)
# All three and a machine start come to ~17 min: more than one session's 15-minute device
# budget (check `status`). gemm and graphs belong in one session, since the end-to-end check
# compares the GEMM model, the traces and the timed steps of one boot; kernels can come from
# another session's take of the same machine (the reference's README says which tables are whose).
# USUAL_PROBES: the gemm stage's usual probe times (the line it prints last), which the
# workloads and traces sweeps test spells against, as they do when the runner takes the GEMM
# sweep in the same process. Unset: their own readings.
# The bare node has torch and numpy only: `python -m pipeline.runner` needs nothing else (it
# writes .jsonl where pyarrow is missing). Back here: copy $OUT/ref/* into
# models_store/reference/<slug>/ (the slug is the `device` column; the loader passes over the
# .json), then `DEVCHAR_HOME=$(mktemp -d) devchar run --device <slug>`; docs/gpu.md has the rest.
# The device tool brings back at most 8 files a call: a stage writes 4 tables at most, its
# hf_measured.json and one log, and says so when $OUT holds more.
# scripts/probe_thread_wake.py (~20 s, into a log only) is left to a session with time to spare.
set -euo pipefail
OUT="${OUT:?run through the device tool, which sets OUT}"
PROFILE="${DEVCHAR_PROFILE:-quick}"
case "${1:?stage: gemm, graphs or kernels}" in
  gemm)    sweeps=(device gemm) ;;
  kernels) sweeps=(utility attention memory embedding) ;;
  graphs)  sweeps=(workloads traces) ;;
  *) echo "unknown stage $1; expected gemm, graphs or kernels" >&2; exit 2 ;;
esac
mkdir -p "$OUT/ref"
log="$OUT/$1.log"
{ lscpu; uptime; } > "$log" 2>&1 || true  # a busy host shows in the load first
start=$(date +%s)
usual=()
if [ -n "${USUAL_PROBES:-}" ]; then
  if [ "$1" = graphs ]; then
    usual=(--usual-probes "$USUAL_PROBES")
    echo "cpu_calibrate graphs: spells tested against USUAL_PROBES=$USUAL_PROBES" | tee -a "$log"
  else
    echo "warning: USUAL_PROBES is for the graphs stage; $1 ignores it" | tee -a "$log"
  fi
fi
python3 -m pipeline.runner "${sweeps[@]}" --device cpu --profile "$PROFILE" --out "$OUT/ref" ${usual[@]+"${usual[@]}"} 2>&1 | tee -a "$log"
if [ "$1" = graphs ]; then  # unseen configs for `devchar predict --hf-config` to be checked against
  python3 scripts/measure_hf.py --out "$OUT/ref/hf_measured.json" 2>&1 | tee -a "$log"
fi
echo "cpu_calibrate $1: $(( $(date +%s) - start )) s" | tee -a "$log"
if [ "$1" = gemm ]; then  # for the graphs stage's USUAL_PROBES, read off the call's output
  echo "USUAL_PROBES=$(python3 scripts/usual_probes.py "$OUT"/ref/gemm_samples.*)" | tee -a "$log"
fi
n=$(find "$OUT" -type f | wc -l)
[ "$n" -le 8 ] || echo "warning: $n files under \$OUT; the device tool brings back 8" | tee -a "$log"
