"""Launch a job through the code location, as the UI does, and wait for it.

`devchar run` used to call `execute_in_process`: such a run has no code-location origin, so the
UI left it out of Overview and Jobs and warned on "Re-execute" that the job snapshot differed.
Here the run is created from the code location's own job (a code server loads
`pipeline.definitions`, the module `dagster dev` serves through `[tool.dagster]`) and started by
the instance's run launcher, so it is the same run the UI's Launchpad would make.

Dagster 1.13.27 has no public call for "create a run of this job from a code location and
launch it": `dagster job launch` (dagster/_cli/job.py) does it with the internal pieces used
below, but it cannot take an asset selection (a reference calibration's subset) and it hands
the run to the run coordinator, which queues it for a daemon that `devchar run` does not start.
tests/test_launch.py pins the behaviour relied on.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from pipeline.core.config import REPO_ROOT

CODE_LOCATION_MODULE = "pipeline.definitions"


@dataclass
class LaunchedRun:
    """What `_report_run` reads from a finished run; the same names as dagster's
    ExecuteInProcessResult, so the verdict does not depend on how the run was executed."""
    run_id: str
    success: bool
    all_events: list = field(default_factory=list)
    location: str = ""


def launch(instance, job_name: str, *, partition_key: str | None, run_config: dict,
           asset_selection=None, module: str = CODE_LOCATION_MODULE, working_directory=REPO_ROOT,
           poll_s: float = 0.5) -> LaunchedRun:
    """Create `job_name`'s run from the code location `module`, launch it, and block until it
    finishes. Ctrl-C terminates the run (its steps record an interrupt) and waits for that."""
    from dagster._core.definitions.selector import JobSubsetSelector
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import ModuleTarget

    target = ModuleTarget(module, None, str(working_directory), None)
    with WorkspaceProcessContext(instance, target, version="", read_only=False) as process:
        context = process.create_request_context()
        (name,) = context.code_location_names
        location = context.get_code_location(name)
        (repo,) = location.get_repositories().values()
        selector = JobSubsetSelector(location_name=name, repository_name=repo.name, job_name=job_name,
                                     op_selection=None,
                                     asset_selection=list(asset_selection) if asset_selection else None)
        job = location.get_job(selector)
        plan = location.get_execution_plan(job, run_config, step_keys_to_execute=None, known_state=None,
                                           instance=instance).execution_plan_snapshot
        tags = {**job.tags, **({"dagster/partition": partition_key} if partition_key else {})}
        run = instance.create_run(
            job_name=job_name, run_id=None, run_config=run_config, resolved_op_selection=job.resolved_op_selection,
            step_keys_to_execute=plan.step_keys_to_execute, op_selection=None, status=None, root_run_id=None,
            parent_run_id=None, tags=tags, job_snapshot=job.job_snapshot, execution_plan_snapshot=plan,
            parent_job_snapshot=job.parent_job_snapshot, remote_job_origin=job.get_remote_origin(),
            job_code_origin=job.get_python_origin(),
            asset_selection=frozenset(asset_selection) if asset_selection else None,
            asset_check_selection=None, asset_graph=repo.asset_graph)
        # launch, not submit: submit goes through the run coordinator, whose queue only the
        # daemon of `dagster dev` drains
        instance.launch_run(run.run_id, context)
        try:
            finished = _wait(instance, run.run_id, poll_s)
        except KeyboardInterrupt:
            instance.run_launcher.terminate(run.run_id)
            finished = _wait(instance, run.run_id, poll_s)
    events = [e.dagster_event for e in instance.all_logs(run.run_id) if e.is_dagster_event]
    return LaunchedRun(run.run_id, finished.status.value == "SUCCESS", events, name)


def _wait(instance, run_id: str, poll_s: float):
    while True:
        run = instance.get_run_by_id(run_id)
        if run.is_finished:
            return run
        time.sleep(poll_s)
