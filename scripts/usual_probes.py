"""Print the usual spell-probe times of a GEMM sweep's table as the runner's `--usual-probes`
takes them (GEMM_US,HOST_US), so a later runner call (another device-tool call, say) tests its
workload steps and traces for spells against the same calibration:

    python scripts/usual_probes.py out/gemm_samples.parquet     # -> e.g. 23.1,2.07

Exit 2, with one line saying why, where the file is missing or unreadable or holds no probe
readings (a GPU's rows, or a table from before the probes).
"""
from __future__ import annotations

import sys
from pathlib import Path

PROBES = ("probe_us", "host_probe_us")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pipeline.harness.spells import usual_of_rows
    from pipeline.runner import read_rows, usual_probes_args

    path = Path(argv[0])
    try:
        rows = read_rows(path, PROBES)
    except (OSError, ValueError) as exc:  # missing, not parquet, bad JSON (pyarrow's errors are ValueErrors)
        print(f"error: {path}: cannot read its rows ({exc})", file=sys.stderr)
        return 2
    usual = usual_of_rows(rows)
    if usual is None:
        print(f"error: {path}: no probe readings ({', '.join(PROBES)})", file=sys.stderr)
        return 2
    print(usual_probes_args(usual)[1])  # the runner's own spelling, which parse_usual_probes reads back
    return 0


if __name__ == "__main__":
    sys.exit(main())
