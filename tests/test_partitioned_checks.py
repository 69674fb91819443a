"""Checks per device partition (issue 15): two devices' check results are two records, each
under its own partition, so one device's heldout_error never replaces the other's.

AssetCheckSpec(partitions_def=...) is a preview API in dagster 1.13.27 (assets/common.py,
device_check); these tests pin the behaviour devchar relies on. Stub resources: nothing is
measured or fitted for real."""
import dagster as dg
import pandas as pd

from assets.factories import FittedModel, model_asset, sample_asset
from pipeline.orchestration.partitions import devices
from test_factories import ScaleModel, StubRunner, StubStore, StubTracking, predict

GOOD, BAD = "cpu-good-2c", "cpu-bad-2c"


class PerDeviceWarehouse:
    """A held-out set the model fits well for GOOD and badly for BAD."""

    def __init__(self):
        self.written = {}

    def device_rows(self, table: str, device: str, where: str = "", params=None) -> pd.DataFrame:
        k = [1.0, 2.0, 4.0, 8.0]
        held = 2.0 if device == GOOD else 20.0
        return pd.DataFrame({"device": device, "op": "mm", "dtype": "float32", "k": k * 2,
                             "median_us": [2 * x for x in k] + [held * x for x in k],
                             "held_out": [False] * 4 + [True] * 4})

    def replace_partition(self, table: str, device: str, rows: pd.DataFrame, scope=None) -> int:
        self.written[table, device] = rows
        return len(rows)

    def replace_partitions(self, parts: list[tuple]) -> int:
        return sum(self.replace_partition(*part) for part in parts)


def _latest(instance: dg.DagsterInstance, key: dg.AssetCheckKey, device: str):
    from dagster._core.event_api import PartitionKeyFilter

    got = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [key], partition_filter=PartitionKeyFilter(key=device))
    return got.get(key)


def test_every_check_of_the_code_location_is_partitioned_by_device():
    from pipeline.definitions import defs

    specs = [s for a in defs.resolve_asset_graph().assets_defs for s in a.check_specs]
    assert specs and all(s.partitions_def == devices for s in specs), [s.key for s in specs
                                                                       if s.partitions_def != devices]


def test_two_devices_record_their_own_heldout_check(devchar_home, tmp_path):
    from pipeline.definitions import defs

    asset = model_asset(FittedModel("gemm_model", samples="gemm_samples", fit=ScaleModel.fit, predict=predict,
                                    doc="A stand-in."))
    key = dg.AssetCheckKey(asset.key, "heldout_error")
    resources = {**defs.resources, "warehouse": PerDeviceWarehouse(), "model_store": StubStore(tmp_path / "store"),
                 "tracking": StubTracking()}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(devices.name, [GOOD, BAD])
        results = {d: dg.materialize([asset], partition_key=d, instance=instance, raise_on_error=False,
                                     resources=resources) for d in (GOOD, BAD)}
        assert results[GOOD].success and not results[BAD].success
        for device, passed in ((GOOD, True), (BAD, False)):
            (evaluation,) = results[device].get_asset_check_evaluations()
            assert evaluation.partition == device and evaluation.passed is passed
            record = _latest(instance, key, device)  # what the UI shows for that partition
            assert record is not None and record.partition == device
            assert record.run_id == results[device].run_id
            assert record.event.asset_check_evaluation.passed is passed
        # the later (failing) device did not overwrite the first: GOOD still reads passed
        assert _latest(instance, key, GOOD).event.asset_check_evaluation.passed is True
        history = instance.event_log_storage.get_asset_check_execution_history(key, limit=10)
        assert sorted(r.partition for r in history) == sorted([GOOD, BAD])


def test_a_sample_assets_checks_carry_the_device_partition(devchar_home):
    from pipeline.definitions import defs

    @sample_asset(sweep="memory")
    def memory_samples(df, device):
        """Memory kernels."""
        return {}

    rows = pd.DataFrame({"device": GOOD, "median_us": [1.0, 2.0], "cv": [0.01, 0.01]})
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(devices.name, [GOOD, BAD])
        for d in (GOOD, BAD):
            result = dg.materialize([memory_samples], partition_key=d, instance=instance,
                                    resources={**defs.resources, "device_runner": StubRunner(rows),
                                               "warehouse": PerDeviceWarehouse()})
            assert result.success
            assert {(e.check_name, e.partition) for e in result.get_asset_check_evaluations()} == {
                ("finite_positive", d), ("drift", d)}
        for name in ("finite_positive", "drift"):
            key = dg.AssetCheckKey(memory_samples.key, name)
            assert {d: _latest(instance, key, d).partition for d in (GOOD, BAD)} == {GOOD: GOOD, BAD: BAD}
