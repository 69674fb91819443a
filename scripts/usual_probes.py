"""Print the usual spell-probe times of a GEMM sweep's table as the runner's `--usual-probes`
takes them (GEMM_US,HOST_US), so a later runner call (another device-tool call, say) tests its
workload steps and traces for spells against the same calibration:

    python scripts/usual_probes.py out/gemm_samples.parquet     # -> e.g. 23.1,2.07

Exit 2, with one line saying why, where the table has no probe readings (a GPU's rows).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def read_rows(path: Path) -> list[dict]:
    """The rows of a runner output file, .parquet or .jsonl."""
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=["probe_us", "host_probe_us"]).to_pylist()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pipeline.harness.spells import usual_of_rows

    path = Path(argv[0])
    if not path.is_file():
        print(f"error: {path}: no such file", file=sys.stderr)
        return 2
    usual = usual_of_rows(read_rows(path))
    if usual is None:
        print(f"error: {path}: no probe readings (probe_us, host_probe_us)", file=sys.stderr)
        return 2
    print(",".join("" if u is None else f"{u:.4g}" for u in usual))
    return 0


if __name__ == "__main__":
    sys.exit(main())
