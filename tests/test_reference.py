"""Peer H100 references (pipeline/analysis/reference.py): parsing, the committed shape list, comparison."""
import numpy as np
import pandas as pd
import pytest

from pipeline.analysis import reference
from pipeline.sweeps.profiles import get_profile


def _peer_dir(tmp_path):
    k = tmp_path / "neusight-h100" / "kernels"
    k.mkdir(parents=True)
    cols = "OPName,Latency,Kernel Name,B,M,N,K\n"
    (k / "linear.csv").write_text(cols + "linear,0.5,sm90_gemm,1,1024,2560,2560\n")
    (k / "bmm.csv").write_text(cols + "bmm,0.25,sm90_gemm,16,128,128,64\n")
    v = tmp_path / "vidur-h100"
    v.mkdir()
    stats = [f"time_stats.{op}.{s}" for op in ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
             for s in ("min", "median")]
    shape = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
             "num_tensor_parallel_workers"]
    row = [0.1, 0.2, 0.05, 0.06, 0.3, 0.4, 0.2, 0.25] + [32, 32, 4096, 11008, 32000, True, 512, 2]
    for name in ("llama-2-7b-mlp", "phi-2-mlp"):
        pd.DataFrame([row], columns=stats + shape).to_csv(v / f"{name}.csv", index=False)
    return tmp_path


def test_peer_parsing_units_and_tp_split(tmp_path):
    peers = reference.peers(_peer_dir(tmp_path))
    ns = peers[peers.source == "neusight"].set_index("op")
    assert ns.loc["linear", "peer_us"] == 500.0 and ns.loc["bmm", "batch"] == 16  # ms -> µs
    v = peers[peers.source == "vidur-llama-2-7b-mlp"].set_index("layer")
    assert v.loc["mlp_up_proj", ["m", "n", "k"]].tolist() == [512, 2 * 11008 // 2, 4096]  # gated, TP 2 splits n
    assert v.loc["mlp_down_proj", ["n", "k"]].tolist() == [4096, 11008 // 2]  # row-parallel splits k
    assert v.loc["attn_pre_proj", "peer_us"] == 200.0 and set(v["dtype"]) == {"float16"}


def test_compare_separates_prediction_error_from_lab_difference(tmp_path, synthetic_gemm_model):
    peers = reference.peers(_peer_dir(tmp_path))
    peers = peers[peers.source == "neusight"].assign(op="mm")  # the synthetic model knows mm only
    pred = synthetic_gemm_model.predict("mm", "float32", peers["m"], peers["n"], peers["k"], peers["batch"])
    ours = peers[reference.SHAPE_COLS].assign(median_us=pred * 2)  # our lab: exactly 2x the prediction
    got = reference.compare(synthetic_gemm_model, peers, ours).iloc[0]
    assert got["devchar_vs_ours"] == pytest.approx(0.5)
    assert np.isfinite(got["ours_vs_peer"]) and np.isfinite(got["devchar_vs_peer"])
    none = reference.compare(synthetic_gemm_model, peers.assign(dtype="float16"))  # no fp16 calibration
    assert none["devchar_vs_peer"].isna().all()


def test_missing_peer_files_name_the_path(tmp_path):
    with pytest.raises(reference.DevcharError, match="DEVCHAR_REFERENCE_DIR"):
        reference.neusight_kernels(tmp_path)


def test_committed_shape_list_and_profile_sample():
    from pipeline.sweeps.reference_gemms import reference_points

    shapes = pd.read_csv(reference.REFERENCE_SHAPES)
    assert list(shapes.columns) == reference.SHAPE_COLS
    assert set(shapes["source"]) == {"neusight", "vidur-llama-2-7b-mlp", "vidur-phi-2-mlp"}
    assert (shapes[["batch", "m", "n", "k"]] > 0).all().all()
    pts = reference_points(get_profile("tiny"))
    assert len(pts) == 2 * shapes.groupby(["source", "op"]).ngroups
    assert len(reference_points(get_profile("full"))) == len(shapes)


def test_reference_sweep_times_each_peer_shape_on_the_cpu(monkeypatch):
    """Each shape is built from its own row's columns (a row Series' .dtype is not its dtype column)."""
    import pandas as pd

    from pipeline.device.discover import identify
    from pipeline.sweeps import reference_gemms
    from pipeline.sweeps.profiles import get_profile

    shapes = pd.DataFrame([("neusight", "bmm", "float32", 2, 8, 16, 32), ("vidur", "linear", "bfloat16", 1, 4, 8, 16)],
                          columns=reference.SHAPE_COLS)
    monkeypatch.setattr(reference_gemms, "reference_points", lambda profile: shapes)
    rows = reference_gemms.sweep_reference(identify("cpu"), get_profile("tiny"), log=lambda m: None)
    assert [(r["op"], r["dtype"], r["m"]) for r in rows] == [("bmm", "float32", 8), ("linear", "bfloat16", 4)]
    assert all(r["median_us"] > 0 and r["kernel"] for r in rows)
