"""Jobs: everything for one device, and the re-calibration subset the schedule runs."""
import dagster as dg


characterize_device = dg.define_asset_job(
    "characterize_device", selection=dg.AssetSelection.all(),
    description="Measure, fit, predict and report for one device partition.")

# Samples and models only: drift in drivers or clocks shows up as new model versions;
# the predictions downstream follow through their eager automation condition.
recalibrate = dg.define_asset_job(
    "recalibrate", selection=dg.AssetSelection.groups("characterize", "fit"),
    description="Re-measure the sample tables and re-fit the models of a device.")

# The asset that runs each sweep (runner.SWEEPS); `reference` has none (`devchar reference`
# reads its table directly).
SWEEP_ASSETS = {
    "device": ["device_spec"], "gemm": ["gemm_samples"], "utility": ["utility_samples"],
    "attention": ["attention_samples"], "embedding": ["embedding_samples"], "memory": ["memory_samples"],
    "workloads": ["workload_runs"], "traces": ["overhead_samples", "workload_graphs"],
    "gemm_configs": ["gemm_config_samples", "gemm_config_choices"], "opencl": ["opencl_launches"],
}


def selection_without(sweeps: set[str]) -> dg.AssetSelection:
    """Every asset except those the given sweeps fill and everything downstream of them: what a
    reference calibration that lacks those tables (an H100 has no OpenCL sweep) can materialize."""
    keys = [k for sweep in sorted(sweeps) for k in SWEEP_ASSETS.get(sweep, [])]
    return dg.AssetSelection.all() - dg.AssetSelection.assets(*keys).downstream() if keys else dg.AssetSelection.all()
