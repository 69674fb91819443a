#!/usr/bin/env bash
# A GPU calibration in device-tool calls of at most 10 minutes each (issue 10). Run from the
# repository root on the GPU machine, one stage per call; everything lands under $OUT:
#   bash scripts/gpu_calibrate.sh tests     # test_gpu.py: graph timer vs CUPTI, kernel names, cuBLASLt
#   bash scripts/gpu_calibrate.sh kernels   # device gemm utility attention embedding memory
#   bash scripts/gpu_calibrate.sh graphs    # workloads traces reference gemm_configs
# Back here: copy $OUT/ref/* into models_store/reference/<slug>/ (the slug is the `device`
# column), then `devchar run --device <slug>` and `devchar reference --device <slug>`.
set -euo pipefail
OUT="${OUT:?run through the device tool, which sets OUT}"
PROFILE="${DEVCHAR_PROFILE:-quick}"
mkdir -p "$OUT/ref"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/ref/nvidia-smi.csv" || true
case "${1:?stage: tests, kernels or graphs}" in
  tests)   python3 -m pytest -q -s -rA tests/test_gpu.py 2>&1 | tee "$OUT/test_gpu.log" ;;
  kernels) python3 -m pipeline.runner device gemm utility attention embedding memory --device cuda \
             --profile "$PROFILE" --out "$OUT/ref" 2>&1 | tee "$OUT/kernels.log" ;;
  graphs)  python3 -m pipeline.runner workloads traces reference gemm_configs --device cuda \
             --profile "$PROFILE" --out "$OUT/ref" 2>&1 | tee "$OUT/graphs.log" ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
# The device tool brings back 8 files a call (kernels: 6 tables, nvidia-smi.csv and the log):
# say so where a change made a stage write more, rather than lose a table silently.
n=$(find "$OUT" -type f | wc -l)
[ "$n" -le 8 ] || echo "warning: $n files under \$OUT; the device tool brings back 8" >&2
