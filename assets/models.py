"""Fitted predictors, declared in one place: each is fitted on the training rows of one
sample table (assets/samples.py), scored on its held-out random shapes, saved to the model
store, logged to MLflow, and blocked by its `heldout_error` check when the held-out error is
too high (assets/factories.py builds them from the declarations below).

Fitted elsewhere: mlp_baselines (assets/evaluation.py), overhead_model (assets/overheads.py),
gemm_config_model (assets/gemm_configs.py), opencl_models (assets/opencl_models.py).
"""
from assets.factories import FittedModel, model_asset
from pipeline.predict import embedding, memory
from pipeline.predict.attention import AttentionModel, on_base_grid
from pipeline.predict.evaluate import (attention_predictions, embedding_predictions, gemm_predictions,
                                       memory_predictions, utility_predictions)
from pipeline.predict.gemm import GemmModel
from pipeline.predict.utility import UtilityModel

# name, the sample table it is fitted on, fit(train) -> model, predict(model, held-out rows)
# Not probe_scaled: a few large rows price the big GEMMs a model spends most of its time in, and
# scaling them by their own probe reading moved GPT-2's LM head away from its traced time while
# the held-out mean barely moved (docs/methods.md, "Why the GEMM model is not scaled").
gemm_model = model_asset(FittedModel(
    "gemm_model", samples="gemm_samples", fit=GemmModel.fit, predict=gemm_predictions,
    doc="Per (op, dtype) kernel: throughput over (waves, K), interpolated (PM2Lat eq. 1-2)."))
utility_model = model_asset(FittedModel(
    "utility_model", samples="utility_samples", fit=UtilityModel.fit, predict=utility_predictions,
    probe_scaled=True,
    doc="Per (op, dtype): latency = non-negative linear function of bytes moved, flops and rows."))
attention_model = model_asset(FittedModel(
    "attention_model", samples="attention_samples", fit=AttentionModel.fit, predict=attention_predictions,
    probe_scaled=True, probe_scored=on_base_grid,
    doc="Per (backend, dtype, head_dim, causal): throughput over (bh, seq), interpolated; head dims between."))
# The DLRM paper's kernels (section III-B), with its Table IV in the metadata.
embedding_model = model_asset(FittedModel(
    "embedding_model", samples="embedding_samples", fit=embedding.EmbeddingModel.fit,
    predict=embedding_predictions, table_iv=embedding.table_iv_rows,
    doc="The paper's embedding-lookup heuristic with the L2 hit-rate estimate."))
memory_model = model_asset(FittedModel(
    "memory_model", samples="memory_samples", fit=memory.MemoryModel.fit,
    predict=memory_predictions, table_iv=memory.table_iv_rows,
    doc="Roofline for concat/memcpy (an MLP where it validates better); MLP for transpose and tril."))
