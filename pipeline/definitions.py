"""The Dagster code location: assets, checks, resources, jobs, schedules and sensors."""
import dagster as dg

from assets.attention import attention_model, attention_samples
from assets.dlrm_kernels import embedding_model, embedding_samples, memory_model, memory_samples
from assets.evaluation import mlp_baselines, model_evaluation
from assets.gemm_configs import gemm_config_model, gemm_config_sweep
from assets.models import gemm_model, utility_model
from assets.opencl import opencl_launches
from assets.opencl_models import opencl_models
from assets.graph_predictions import dlrm_predictions
from assets.overheads import overhead_model, overhead_traces
from assets.predictions import accuracy_report, transformer_predictions
from assets.samples import device_spec, gemm_samples, utility_samples, workload_runs
from pipeline.orchestration.jobs import characterize_device, recalibrate
from pipeline.orchestration.schedules import weekly_recalibration
from pipeline.orchestration.sensors import local_device_sensor
from resources.devices import DeviceRunner
from resources.env import from_env
from resources.model_store import ModelStore
from resources.quality import QualityGates
from resources.tracking import MLflowTracking
from resources.warehouse import DuckDBWarehouse

defs = dg.Definitions(
    assets=[device_spec, gemm_samples, utility_samples, attention_samples, embedding_samples, memory_samples,
            workload_runs, gemm_model, utility_model, attention_model, embedding_model, memory_model, mlp_baselines,
            model_evaluation, overhead_traces, overhead_model, transformer_predictions, dlrm_predictions,
            accuracy_report, opencl_launches, opencl_models, gemm_config_sweep, gemm_config_model],
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
