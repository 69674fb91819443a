"""Weekly re-calibration of every registered device."""
import dagster as dg

from pipeline.orchestration.jobs import recalibrate
from pipeline.orchestration.partitions import devices

# A schedule's cron is part of its definition, fixed when the code location loads: no run
# config or resource reaches it, so the variable is read here, once, with its default.
RECALIBRATE_CRON = dg.EnvVar("DEVCHAR_RECALIBRATE_CRON").get_value("0 3 * * 1")


@dg.schedule(job=recalibrate, cron_schedule=RECALIBRATE_CRON,
             default_status=dg.DefaultScheduleStatus.STOPPED)
def weekly_recalibration(context: dg.ScheduleEvaluationContext):
    keys = devices.get_partition_keys(dynamic_partitions_store=context.instance)
    if not keys:
        return dg.SkipReason("no device registered yet: run `devchar run` or turn on local_device_sensor")
    stamp = context.scheduled_execution_time.strftime("%Y%m%d")
    return [dg.RunRequest(partition_key=k, run_key=f"recalibrate-{k}-{stamp}") for k in keys]
