"""Weekly re-calibration of every registered device."""
import dagster as dg

from pipeline.orchestration.jobs import recalibrate
from pipeline.orchestration.partitions import devices

# A schedule's cron is part of its definition, fixed when the code location loads: no run
# config or resource reaches it, so the variable is read here, once, with its default.
RECALIBRATE_CRON = dg.EnvVar("DEVCHAR_RECALIBRATE_CRON").get_value("0 3 * * 1")
OPENCL_ASSETS = dg.AssetSelection.assets("opencl_launches").downstream()


@dg.schedule(job=recalibrate, cron_schedule=RECALIBRATE_CRON,
             default_status=dg.DefaultScheduleStatus.STOPPED)
def weekly_recalibration(context: dg.ScheduleEvaluationContext):
    keys = devices.get_partition_keys(dynamic_partitions_store=context.instance)
    if not keys:
        return dg.SkipReason("no device registered yet: run `devchar run` or turn on local_device_sensor")
    stamp = context.scheduled_execution_time.strftime("%Y%m%d")
    without = _without_opencl(context, keys)
    return [dg.RunRequest(partition_key=k, run_key=f"recalibrate-{k}-{stamp}",
                          **({"asset_selection": without[k]} if k in without else {})) for k in keys]


def _without_opencl(context: dg.ScheduleEvaluationContext, keys: list[str]) -> dict[str, list[dg.AssetKey]]:
    """For each registered device of this machine whose OpenCL device cannot run the launch
    sweep (no pyopencl, no device, or a compiler that cannot build for the CPU: PoCL 3.0 on a
    Zen 5 EPYC), the re-calibration's assets less that sweep and its model, as `devchar run`
    leaves them out; the reason goes to the tick's log. Without the code location's asset graph
    (a bare test context), nothing is left out."""
    try:
        graph = context.repository_def.asset_graph
    except dg.DagsterInvariantViolationError:  # built without definitions
        return {}
    from pipeline.device.discover import local_devices
    from pipeline.opencl.sweep.execute import opencl_device_type, opencl_unusable

    out = {}
    for slug in sorted(set(local_devices()) & set(keys)):
        why = opencl_unusable(opencl_device_type(slug))
        if why:
            context.log.info(f"{slug}: {why}; its re-calibration leaves out the OpenCL sweep")
            out[slug] = sorted((recalibrate.selection - OPENCL_ASSETS).resolve(graph), key=lambda k: k.path)
    return out
