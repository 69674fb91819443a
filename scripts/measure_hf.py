"""Measure the committed Hugging Face configs' forward passes on a machine without devchar's
full environment (the GPU machine's host: torch, numpy, pandas and transformers, no dagster
or duckdb), so `devchar predict --hf-config ...` can be checked against another CPU.

    python3 scripts/measure_hf.py --out $OUT/hf_measured.json [--batch 1 --seq 128]

Each config is built with random weights (nothing is downloaded) and timed as
`devchar predict --measure` times it here: PM2Lat's protocol, 5 warm-up and 25 timed calls,
median, with torch's thread count pinned as the runner pins it for the calibration. Back on
the development machine: `devchar predict --device <slug> --hf-config <config> ...` without
--measure, and compare its prediction with `median_us` in the written file. The file is
.json, which the reference loader passes over.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ("smollm2-135m", "qwen2.5-0.5b", "qwen3-0.6b")


def _repo_relative(path: str) -> str:
    """A fixture's path as the repository names it, wherever the script was run from."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--configs", nargs="+", default=[str(ROOT / "tests" / "fixtures" / "hf" / f"{name}.json") for name in FIXTURES],
                    help="config.json files (default: the three committed fixtures)")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))  # the repo's pipeline: it is not installed on the GPU machine
    import torch
    import transformers

    from pipeline.device.discover import identify_cpu
    from pipeline.runner import fix_threads
    from pipeline.workloads import predict_callable as pc

    dev = identify_cpu()
    fix_threads(dev)  # the calibration's parallelism: a prediction from it assumes the same
    rows = []
    for path in args.configs:
        config = pc.check_hf_config(path, args.batch, args.seq, args.dtype)
        model = pc.build_causal_lm(path, args.dtype, config=config)
        t0 = time.perf_counter()
        m, blocks = pc.measure_call(model, pc.causal_lm_inputs(model, args.batch, args.seq))
        row = {"device": dev.slug, "config": _repo_relative(path), "batch": args.batch, "seq": args.seq, "dtype": args.dtype,
               "median_us": m.median_us, "block_medians_us": blocks, "iqr_us": m.iqr_us, "cpu_util": m.cpu_util, "threads": torch.get_num_threads(),
               "torch": torch.__version__, "transformers": transformers.__version__,
               "taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        rows.append(row)
        print(f"{path}: {m.median_us / 1e3:.2f} ms median ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        del model
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
