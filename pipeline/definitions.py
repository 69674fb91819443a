"""The Dagster code location: assets, checks, resources, jobs, schedules and sensors."""
import dagster as dg

from assets import (advice, evaluation, gemm_configs, graph_predictions, models, opencl_models, overheads,
                    predictions, samples)
from pipeline.orchestration.jobs import characterize_device, recalibrate
from pipeline.orchestration.schedules import weekly_recalibration
from pipeline.orchestration.sensors import local_device_sensor
from resources.devices import DeviceRunner
from resources.env import from_env
from resources.model_store import ModelStore
from resources.quality import QualityGates
from resources.tracking import MLflowTracking
from resources.warehouse import DuckDBWarehouse

# The modules that define assets: every sample table in samples.py, every fitted model in
# models.py (both built by assets/factories.py), the multi-table sweeps, baselines,
# evaluation and predictions in the rest. An asset imported into another module is loaded once.
ASSET_MODULES = [samples, models, overheads, gemm_configs, opencl_models, evaluation, graph_predictions, predictions,
                 advice]

defs = dg.Definitions(
    assets=dg.load_assets_from_modules(ASSET_MODULES),
    # Checks declared with their assets (check_specs) come with them; this picks up any
    # stand-alone @dg.asset_check a module defines.
    asset_checks=dg.load_asset_checks_from_modules(ASSET_MODULES),
    # The DEVCHAR_* variables that are set feed their fields as dg.EnvVar (resources/env.py);
    # run config overrides them (`devchar run --profile`).
    resources={"warehouse": from_env(DuckDBWarehouse), "tracking": MLflowTracking(),
               "device_runner": from_env(DeviceRunner), "model_store": ModelStore(),
               "quality_gates": from_env(QualityGates)},
    jobs=[characterize_device, recalibrate],
    schedules=[weekly_recalibration],
    sensors=[local_device_sensor],
    # Benchmarks must never share the device with each other, and DuckDB has one writer:
    # run a job's steps one after another in one process.
    executor=dg.in_process_executor,
)
