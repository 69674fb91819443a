"""Two devchar runs at once (two devices): both must land (issue 11, concurrency)."""
import multiprocessing as mp


def _fit(home: str, device: str, barrier, out) -> None:
    import os

    os.environ["DEVCHAR_HOME"] = home
    from resources.tracking import MLflowTracking

    barrier.wait()  # both create the fresh tracking store at the same moment
    try:
        out.put((device, MLflowTracking().log_fit("gemm_model", device, {"rows": 1}, {"err": 0.1}, {}, [])))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which asserts on it
        out.put((device, f"error: {type(exc).__name__}: {exc}"))


def test_two_processes_set_up_one_fresh_tracking_store(tmp_path):
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_fit, args=(str(tmp_path), d, barrier, out)) for d in ("cpu-a-2c", "cpu-b-2c", "cpu-c-2c")]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert not [v for v in got.values() if v.startswith("error")], got
    assert len(set(got.values())) == 3  # three MLflow runs, one per device
