"""shape_advice: the co-design paper's shape advice for a catalog of public causal LMs,
priced with the partition's device models (docs/advise.md)."""

import dagster as dg

from assets.common import image_md, md_table, save_plot
from pipeline.analysis.advice import catalog_rows
from pipeline.analysis.plots import advice_plot
from pipeline.core.config import REPO_ROOT
from pipeline.orchestration.partitions import devices
from pipeline.predict.shape_catalog import CASES, fixture_cases
from resources.model_store import ModelStore
from resources.warehouse import DuckDBWarehouse

BATCH, SEQ = 1, 1024  # every catalog model has at least 1024 positions
TOLERANCE = 0.02


@dg.asset(partitions_def=devices, group_name="predict", kinds={"numpy", "duckdb"},
          deps=["gemm_model", "utility_model"], automation_condition=dg.AutomationCondition.eager())
def shape_advice(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse,
                 model_store: ModelStore) -> dg.MaterializeResult:
    """For each catalog model (GPT-3 2.7B, nanoGPT, Llama-2-7B, Pythia-410M/1B, the configs in
    tests/fixtures/hf): the best in-budget shape of each searched dimension (heads, hidden, MLP
    size, vocabulary, micro-batch; ±2 % parameters), the paper's own proposals, predicted
    speed-up per token and parameter change. Predicted only: `devchar advise --measure` times
    advice on the local device."""
    device = context.partition_key
    kind = warehouse.device_kind(device) if warehouse.has_table("devices") else "cpu"
    dtype = "float32" if kind == "cpu" else "float16"  # the paper's GPU dtype; the CPU's calibrated one
    gemm, utility = model_store.load(device, "gemm_model"), model_store.load(device, "utility_model")
    cases = [*CASES, *fixture_cases(REPO_ROOT / "tests" / "fixtures" / "hf")]
    rows, tables = catalog_rows(cases, gemm, utility, dtype, BATCH, SEQ, TOLERANCE, progress=context.log.info)
    rows = rows.assign(device=device, run_id=context.run.run_id[:12])
    written = warehouse.replace_partition("shape_advice", device, rows)
    plots = {}
    for name in [n for n in ("gpt3-2.7b", "nanogpt-124m", "llama-2-7b") if n in tables]:
        png = advice_plot(tables[name], name)
        save_plot(png, device, f"shape_advice_{name}")
        plots[f"plot_{name}"] = image_md(png, f"{name}: predicted throughput vs each searched dimension ({dtype})")
    shown = rows[["model", "dimension", "original", "proposed", "params_change", "predicted_speedup", "source",
                  "note"]]
    return dg.MaterializeResult(metadata={
        "dagster/row_count": dg.MetadataValue.int(int(written)), "dtype": dtype, "batch": BATCH, "seq": SEQ,
        "advice": md_table(shown, floatfmt=".4g"), **plots})
