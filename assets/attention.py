"""Fused attention: attention_samples (torch SDPA backends) and attention_model (PM2Lat IV-C).

The sweep and the model live in the engine (pipeline.sweeps.attention,
pipeline.predict.attention); these assets only run, store, fit, check and report.
"""

import dagster as dg
from assets.common import image_md, md_table, save_plot
from assets.models import fit_and_register, heldout_check
from assets.samples import check_results, device_spec, sample_checks, store_sweep
from pipeline.orchestration.partitions import devices
from pipeline.analysis.plots import attention_throughput_vs_seq
from pipeline.predict.attention import AttentionModel
from pipeline.predict.evaluate import attention_predictions
from resources.devices import DeviceRunner
from resources.model_store import ModelStore
from resources.quality import QualityGates
from resources.tracking import MLflowTracking
from resources.warehouse import DuckDBWarehouse


@dg.asset(partitions_def=devices, group_name="characterize", kinds={"pytorch", "duckdb"}, deps=[device_spec],
          check_specs=sample_checks("attention_samples"))
def attention_samples(context: dg.AssetExecutionContext, device_runner: DeviceRunner, warehouse: DuckDBWarehouse,
                      quality_gates: QualityGates) -> dg.MaterializeResult:
    """SDPA timings per backend (flash, math; efficient and cudnn on CUDA): seq x batch*heads grid per
    head_dim and causal flag, plus held-out random shapes."""
    df = store_sweep(context, device_runner, warehouse, "attention", "attention_samples")
    train = df[~df["held_out"]]
    png = attention_throughput_vs_seq(train)
    save_plot(png, context.partition_key, "attention_throughput_vs_seq")
    summary = (df.assign(tflops=df["flops"] / df["median_us"] / 1e6)
               .groupby(["backend", "dtype", "held_out"])
               .agg(rows=("seq_q", "size"), best_tflops=("tflops", "max"), median_us=("median_us", "median"))
               .reset_index())
    return dg.MaterializeResult(
        metadata={"rows": len(df), "held_out_rows": int(df["held_out"].sum()),
                  "backends": ", ".join(sorted(df["backend"].unique())), "summary": md_table(summary),
                  "throughput_vs_seq": image_md(png, "Attention throughput vs seq (smallest batch)")},
        check_results=check_results(df, "median_us", quality_gates.gates()))


@dg.asset(partitions_def=devices, group_name="fit", kinds={"numpy", "mlflow"}, deps=[attention_samples],
          check_specs=heldout_check("attention_model"))
def attention_model(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse, tracking: MLflowTracking,
                    model_store: ModelStore, quality_gates: QualityGates) -> dg.MaterializeResult:
    """Per (backend, dtype, head_dim, causal): throughput over (bh, seq), interpolated; head dims between."""
    return fit_and_register(context, warehouse, tracking, model_store, "attention_model", "attention_samples",
                            AttentionModel.fit, attention_predictions, quality_gates.gates())
