"""Registers this machine's devices as partitions, so the UI can materialize them."""
import dagster as dg

from pipeline.orchestration.partitions import devices


@dg.sensor(minimum_interval_seconds=3600, default_status=dg.DefaultSensorStatus.STOPPED)
def local_device_sensor(context: dg.SensorEvaluationContext):
    from pipeline.device.discover import local_devices

    known = set(devices.get_partition_keys(dynamic_partitions_store=context.instance))
    new = sorted(set(local_devices()) - known)
    if not new:
        return dg.SkipReason(f"local devices already registered: {sorted(known)}")
    return dg.SensorResult(dynamic_partitions_requests=[devices.build_add_request(new)])
