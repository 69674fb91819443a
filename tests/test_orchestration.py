"""The re-calibration schedule and the device-registering sensor."""
from datetime import datetime, timezone

import dagster as dg

from pipeline.device.discover import identify
from pipeline.orchestration.partitions import devices
from pipeline.orchestration.schedules import weekly_recalibration
from pipeline.orchestration.sensors import local_device_sensor

WHEN = datetime(2026, 11, 23, 3, 0, tzinfo=timezone.utc)


def test_schedule_requests_one_run_per_registered_device():
    # Each context closed (`with`): the instance a schedule context opens sets Dagster's current
    # state storage and only its exit unsets it; left open, a later test that loads definitions
    # finds that storage with its instance gone ("undefined DagsterInstance weakref").
    with dg.instance_for_test() as instance:
        with dg.build_schedule_context(instance=instance, scheduled_execution_time=WHEN) as ctx:
            assert isinstance(weekly_recalibration(ctx), dg.SkipReason)
        instance.add_dynamic_partitions(devices.name, ["cpu-a-2c", "cuda-b"])
        with dg.build_schedule_context(instance=instance, scheduled_execution_time=WHEN) as ctx:
            requests = weekly_recalibration(ctx)
        assert sorted(r.partition_key for r in requests) == ["cpu-a-2c", "cuda-b"]
        assert all(r.run_key.endswith("20261123") for r in requests)  # one run per device per week
        assert weekly_recalibration.job_name == "recalibrate"


def test_sensor_registers_the_local_device_once():
    slug = identify("cpu").slug
    with dg.instance_for_test() as instance:
        result = local_device_sensor(dg.build_sensor_context(instance=instance))
        assert isinstance(result, dg.SensorResult)
        assert slug in result.dynamic_partitions_requests[0].partition_keys
        instance.add_dynamic_partitions(devices.name, [slug])
        assert isinstance(local_device_sensor(dg.build_sensor_context(instance=instance)), dg.SkipReason)


def test_recalibration_job_covers_samples_and_models_only():
    from pipeline.definitions import defs

    job = defs.resolve_job_def("recalibrate")
    keys = {k.to_user_string() for k in job.asset_layer.executable_asset_keys}
    assert keys == {"device_spec", "gemm_samples", "utility_samples", "attention_samples", "embedding_samples",
                    "memory_samples", "overhead_samples", "workload_graphs", "opencl_launches", "workload_runs",
                    "gemm_model", "utility_model", "attention_model", "embedding_model", "memory_model",
                    "overhead_model", "opencl_models", "mlp_baselines", "gemm_config_samples", "gemm_config_choices",
                    "gemm_config_model", "sweep_quality"}  # no predictions, no evaluation


def test_schedule_leaves_out_the_opencl_sweep_where_this_machines_opencl_cannot_build(monkeypatch):
    """A Zen 5 EPYC's PoCL cannot build a kernel: the local device's weekly run re-measures and
    re-fits everything else, as `devchar run` does there; other devices keep the whole job."""
    import pipeline.opencl.sweep.execute as execute
    from pipeline.definitions import defs

    slug = identify("cpu").slug
    repo = defs.get_repository_def()
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(devices.name, [slug, "cuda-b"])
        monkeypatch.setattr(execute, "opencl_unusable", lambda kind: "the OpenCL cpu device cannot build a kernel: "
                            "unknown target CPU 'generic'")
        with dg.build_schedule_context(instance=instance, scheduled_execution_time=WHEN, repository_def=repo) as ctx:
            requests = {r.partition_key: r for r in weekly_recalibration(ctx)}
        assert requests["cuda-b"].asset_selection is None
        local = {k.to_user_string() for k in requests[slug].asset_selection}
        assert {"gemm_samples", "gemm_model", "embedding_model"} <= local
        assert not local & {"opencl_launches", "opencl_models", "model_evaluation"}
        monkeypatch.setattr(execute, "opencl_unusable", lambda kind: None)
        with dg.build_schedule_context(instance=instance, scheduled_execution_time=WHEN, repository_def=repo) as ctx:
            assert all(r.asset_selection is None for r in weekly_recalibration(ctx))
