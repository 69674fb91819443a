"""The DLRM paper's kernel tables and models (section III-B): embedding_samples ->
embedding_model (DRAM traffic over a fitted bandwidth, with the L2 hit-rate estimate) and
memory_samples -> memory_model (roofline for concat/memcpy, grid-searched MLP for transpose
and tril). Table IV's GMAE / mean / std per kernel go to the models' metadata."""
import dagster as dg
from assets.common import md_table
from assets.models import fit_and_register, heldout_check
from assets.samples import check_results, device_spec, sample_checks, store_sweep
from pipeline.orchestration.partitions import devices
from pipeline.predict import embedding, memory
from pipeline.predict.evaluate import embedding_predictions, memory_predictions
from resources.devices import DeviceRunner
from resources.model_store import ModelStore
from resources.quality import QualityGates
from resources.tracking import MLflowTracking
from resources.warehouse import DuckDBWarehouse


def _samples_asset(name: str, sweep: str, doc: str):
    @dg.asset(name=name, partitions_def=devices, group_name="characterize", kinds={"pytorch", "duckdb"},
              deps=[device_spec], check_specs=sample_checks(name), description=doc)
    def _asset(context: dg.AssetExecutionContext, device_runner: DeviceRunner, warehouse: DuckDBWarehouse,
               quality_gates: QualityGates) -> dg.MaterializeResult:
        df = store_sweep(context, device_runner, warehouse, sweep, name)
        key = "direction" if "direction" in df else "op"
        summary = df.groupby([key, "dtype", "held_out"]).agg(rows=("median_us", "size"),
                                                             median_us=("median_us", "median")).reset_index()
        return dg.MaterializeResult(metadata={"rows": len(df), "summary": md_table(summary)},
                                    check_results=check_results(df, "median_us", quality_gates.gates()))

    return _asset


embedding_samples = _samples_asset("embedding_samples", "embedding",
                                   "Batched EmbeddingBag (sum) forward and backward over B, E, T, L, D.")
memory_samples = _samples_asset("memory_samples", "memory",
                                "concat, memcpy (H2D on CUDA, D2D), batched transpose, tril forward/backward.")


def _model_asset(name: str, samples, fit, predict, table_iv, doc: str):
    @dg.asset(name=name, partitions_def=devices, group_name="fit", kinds={"numpy", "mlflow"}, deps=[samples],
              check_specs=heldout_check(name), description=doc)
    def _asset(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse, tracking: MLflowTracking,
               model_store: ModelStore, quality_gates: QualityGates) -> dg.MaterializeResult:
        result = fit_and_register(context, warehouse, tracking, model_store, name, samples.key.path[-1], fit, predict,
                                  quality_gates.gates())
        held = warehouse.device_rows(samples.key.path[-1], context.partition_key, "held_out")
        version = result.metadata["version"]  # the model just fitted, even if it failed its check
        version = getattr(version, "value", version)
        rows = table_iv(model_store.load(context.partition_key, name, version), held)
        return dg.MaterializeResult(metadata={**result.metadata, "table_iv": md_table(rows)},
                                    check_results=result.check_results)

    return _asset


embedding_model = _model_asset("embedding_model", embedding_samples, embedding.EmbeddingModel.fit,
                               embedding_predictions, embedding.table_iv_rows,
                               "The paper's embedding-lookup heuristic with the L2 hit-rate estimate.")
memory_model = _model_asset("memory_model", memory_samples, memory.MemoryModel.fit, memory_predictions,
                            memory.table_iv_rows, "Roofline for concat/memcpy; MLP for transpose and tril.")
