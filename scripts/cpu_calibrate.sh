#!/usr/bin/env bash
# A CPU calibration of the GPU machine's host (issue 14: validate on more than one CPU) in
# device-tool calls of at most 10 minutes each. Run from the repository root on that machine,
# one stage per call; everything lands under $OUT/ref:
#   bash scripts/cpu_calibrate.sh kernels   # device gemm utility attention (16-core Xeon: ~9 min)
#   bash scripts/cpu_calibrate.sh graphs    # workloads traces memory embedding (~3 min)
# The bare node has torch and numpy only: `python -m pipeline.runner` needs nothing else (it
# writes .jsonl where pyarrow is missing). Back here: copy $OUT/ref/* into
# models_store/reference/<slug>/ (the slug is the `device` column; the loader skips the .txt),
# then `DEVCHAR_HOME=$(mktemp -d) devchar run --device <slug>`; docs/gpu.md has the rest.
# Both stages and a machine start come to ~14 min of a 15-minute device budget: check `status`.
set -euo pipefail
OUT="${OUT:?run through the device tool, which sets OUT}"
PROFILE="${DEVCHAR_PROFILE:-quick}"
mkdir -p "$OUT/ref"
case "${1:?stage: kernels or graphs}" in
  kernels) sweeps=(device gemm utility attention) ;;
  graphs)  sweeps=(workloads traces memory embedding) ;;
  *) echo "unknown stage $1; expected kernels or graphs" >&2; exit 2 ;;
esac
lscpu > "$OUT/ref/lscpu.txt" 2>&1 || true
uptime > "$OUT/ref/uptime-$1.txt" 2>&1 || true  # a busy host shows here first
start=$(date +%s)
python3 -m pipeline.runner "${sweeps[@]}" --device cpu --profile "$PROFILE" --out "$OUT/ref" 2>&1 | tee "$OUT/$1.log"
echo "cpu_calibrate $1: $(( $(date +%s) - start )) s" | tee -a "$OUT/$1.log"
