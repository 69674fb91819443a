"""Drift between two calibrations of a device (pipeline/analysis/drift.py, the sample factory's
`drift` check and table): an unchanged re-run is not flagged, a real change is."""
import dagster as dg
import numpy as np
import pandas as pd
import pytest

from pipeline.analysis.drift import ALL, DRIFT_KEYS, KEY_DEFAULTS, device_changed, is_drift, model_drift, summary, table_drift
from pipeline.analysis.quality import Gates

DEVICE = "cpu-test-2c"


def memory_rows(scale: float = 1.0, spread: float = 0.02, run_id: str = "aaaaaaaaaaaa", n: int = 12) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    t = np.geomspace(10, 1000, n) * scale
    return pd.DataFrame({"op": "copy", "dtype": "float32", "batch": 1, "m": np.arange(n) + 1, "n": 64, "k": 1,
                         "shape": "x", "median_us": t, "p20_us": t * (1 - spread), "p80_us": t * (1 + spread),
                         "cv": spread, "reps": 10, "noisy": False, "held_out": rng.random(n) < 0.3,
                         "device": DEVICE, "run_id": run_id})


def test_an_unchanged_rerun_within_its_spread_is_not_drift():
    got = table_drift(memory_rows(), memory_rows(scale=1.01, run_id="bbbbbbbbbbbb"), "memory_samples")
    (row, pooled) = got.itertuples()
    assert pooled.op == pooled.dtype == ALL and pooled.points == 12 and not device_changed(got)
    assert row.points == 12 and row.moved_share == 0.0 and not row.flagged
    assert row.median_ratio == pytest.approx(1.01) and row.previous_run_id == "aaaaaaaaaaaa"
    assert summary(got) == "none"


def test_twice_as_slow_everywhere_is_drift():
    got = table_drift(memory_rows(), memory_rows(scale=2.0), "memory_samples")
    (row, _) = got.itertuples()
    assert row.median_ratio == pytest.approx(2.0) and row.moved_share == 1.0 and row.flagged
    assert device_changed(got)
    assert summary(got, pooled=False) == "copy float32: x2.00, 100% of 12 points moved"
    assert summary(got, pooled=True) == "all all: x2.00, 100% of 12 points moved"


def test_one_op_moving_alone_is_flagged_in_the_table_but_is_not_a_changed_device():
    prev = pd.concat([memory_rows(), memory_rows().assign(op="transpose")])
    new = pd.concat([memory_rows(), memory_rows(scale=1.4).assign(op="transpose")])
    new = pd.concat([new, memory_rows().assign(op="concat")])
    prev = pd.concat([prev, memory_rows().assign(op="concat")])
    got = table_drift(prev, new, "memory_samples")
    assert got.set_index("op")["flagged"].to_dict() == {"concat": False, "copy": False, "transpose": True, ALL: False}
    assert not device_changed(got)


def test_a_shift_needs_both_a_large_median_and_most_points_moved():
    gates = Gates(max_drift_ratio=0.2, max_drift_moved_share=0.5)
    assert not is_drift(1.15, 1.0, gates)  # every point moved, but by less than the gate
    assert not is_drift(3.0, 0.25, gates)  # a few points far off: noise, not the device
    assert is_drift(0.5, 0.9, gates)  # faster counts too


def test_only_points_both_runs_measured_are_compared():
    new = memory_rows(scale=2.0)
    new.loc[new.index[:4], "m"] += 1000  # shapes the previous run never measured
    (row, _) = table_drift(memory_rows(), new, "memory_samples").itertuples()
    assert row.points == 8


def test_every_drift_table_has_its_key_columns_in_the_contract():
    from pipeline.core.tables import CONTRACT

    for table, (op_col, keys) in DRIFT_KEYS.items():
        assert op_col in keys and "dtype" in keys
        optional = {k for k in keys if k in KEY_DEFAULTS.get(table, {}) and k in CONTRACT[table].optional}
        assert set(keys) - optional <= set(CONTRACT[table].required), table


def test_embedding_rows_from_before_cold_timings_compare_as_hot():
    old = pd.DataFrame(dict(direction="forward", dtype="float32", B=[8, 16], E=100, T=1, L=4, D=16,
                            median_us=[10.0, 20.0], p20_us=[9.0, 19.0], p80_us=[11.0, 21.0]))
    new = pd.concat([old.assign(cold=False, median_us=[15.0, 30.0], p20_us=[14.0, 29.0], p80_us=[16.0, 31.0]),
                     old.assign(cold=True, median_us=[90.0, 90.0])], ignore_index=True)
    rows = table_drift(old, new, "embedding_samples")
    whole = rows[rows["op"] == ALL].iloc[0]
    assert whole.points == 2 and whole.median_ratio == 1.5  # the hot rows only, each x1.5


def test_a_model_that_mispredicts_the_previous_points_is_flagged():
    own = pd.DataFrame({"op": ["mm"], "dtype": ["float32"], "n": [5], "median_rel_err": [0.05]})
    old = pd.DataFrame({"op": ["mm"], "dtype": ["float32"], "n": [5], "median_rel_err": [0.48]})
    (row,) = model_drift("gemm_model", old, own, "aaaaaaaaaaaa").itertuples()
    assert row.flagged and row.error_previous_heldout == 0.48 and row.error_new_heldout == 0.05
    (same,) = model_drift("gemm_model", own, own, "aaaaaaaaaaaa").itertuples()
    assert not same.flagged


class Runner:
    def __init__(self, rows):
        self.rows = rows

    def run(self, context, sweep, device):
        return self.rows.assign(run_id=context.run.run_id[:12])


def test_the_sample_asset_records_drift_per_recalibration(devchar_home):
    """First calibration: no previous, check passes. Same device again: compared, not flagged.
    Twice as slow: flagged, a warning (the asset still materializes), rows in the drift table."""
    from assets.factories import sample_asset
    from pipeline.definitions import defs
    from pipeline.orchestration.partitions import devices
    from resources.warehouse import DuckDBWarehouse

    @sample_asset(sweep="memory")
    def memory_samples(df, device):
        return {}

    def materialize(rows):
        result = dg.materialize([memory_samples], partition_key=DEVICE, instance=instance,
                                resources={**defs.resources, "device_runner": Runner(rows)})
        (check,) = [e for e in result.get_asset_check_evaluations() if e.check_name == "drift"]
        return result, check

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(devices.name, [DEVICE])
        _, first = materialize(memory_rows())
        assert first.passed and "first calibration" in first.metadata["previous"].value
        _, same = materialize(memory_rows(scale=1.01))
        assert same.passed and same.metadata["points_compared"].value == 12
        result, slower = materialize(memory_rows(scale=2.0))
        assert result.success and not slower.passed and slower.severity == dg.AssetCheckSeverity.WARN
        assert "all all: x1.98" in slower.metadata["flagged"].value  # against the re-run before it
    drift = DuckDBWarehouse().device_rows("drift", DEVICE)
    assert len(drift) == 2 and drift["flagged"].all()  # the latest comparison replaced the earlier
    assert len(DuckDBWarehouse().device_rows("memory_samples", DEVICE)) == 12
    assert (devchar_home / "drift" / DEVICE / "memory_samples.previous.parquet").exists()


@pytest.mark.parametrize("flags, changed", [
    ({"gemm_samples": False, "utility_samples": False, "attention_samples": True, "memory_samples": False,
      "embedding_samples": False}, False),  # one short sweep in a slow spell (the EPYC VM, attention x1.37)
    ({"gemm_samples": True, "utility_samples": True, "attention_samples": True, "memory_samples": False,
      "embedding_samples": False}, True),  # most tables moved: threads, clocks, BLAS
    ({"gemm_samples": True, "utility_samples": False, "attention_samples": True, "memory_samples": False,
      "embedding_samples": False}, True),  # 1 -> 2 threads on the EPYC VM: two of five
    ({"gemm_samples": True}, False),  # one table compared: never enough to call a device changed
    ({}, False)])  # a first calibration compares nothing
def test_the_device_verdict_needs_most_tables_to_move(flags, changed):
    from pipeline.analysis.drift import devices_verdict

    pooled = pd.DataFrame({"source": list(flags), "flagged": list(flags.values()), "median_ratio": 1.0})
    got, flagged, compared = devices_verdict(pooled)
    assert got is changed and flagged == sorted(t for t, f in flags.items() if f) and compared == sorted(flags)
