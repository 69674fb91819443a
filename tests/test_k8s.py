"""The device runner's Kubernetes mode (issue 15). No cluster: the pod body PipesK8sClient would
create is built (dagster_k8s' own build_pod_body) and inspected; the launch is replaced by a
stand-in that does what the pod does (write the tables under --out, report them as Pipes
messages); the results path is also run for real through the subprocess Pipes client."""
from __future__ import annotations

import sys
from pathlib import Path

import dagster as dg
import pytest

from resources import devices as devices_mod
from resources.devices import DeviceRunner, read_results
from resources.k8s import CONTAINER, K8sDevicePod, K8sSettings, sweep_pod

GPU = "cuda-nvidia-h100-80gb-hbm3"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def _settings(tmp_path: Path, **more) -> K8sSettings:
    return K8sSettings(image="registry.example/devchar:1.0", namespace="devchar",
                       results_dir=str(tmp_path / "runner-out"), results_claim="devchar-results",
                       devices={GPU: K8sDevicePod(node_selector=H100, gpus=1, cpu="16", memory="64Gi"),
                                "cpu-epyc-9654-96c": K8sDevicePod(image="registry.example/devchar-cpu:1.0",
                                                                  node_selector={"node-pool": "cpu"}, gpus=0)},
                       **more)


def _pod_body(pod):
    """The V1Pod PipesK8sClient.run would create from these arguments (its own function)."""
    from dagster_k8s.pipes import build_pod_body

    bootstrap = {"DAGSTER_PIPES_CONTEXT": "ctx", "DAGSTER_PIPES_MESSAGES": "msgs"}
    return build_pod_body(pod_name="dagster-run-x", image=pod.image, command=pod.command,
                          env_vars={**bootstrap, **pod.env}, base_pod_meta=pod.base_pod_meta,
                          base_pod_spec=pod.base_pod_spec)


def test_the_pod_for_a_gpu_sweep(tmp_path):
    out = tmp_path / "runner-out" / "run-1" / "gemm-abc"
    pod = sweep_pod(_settings(tmp_path, env={"HF_HOME": "/cache"}), GPU, "gemm", "full", "0123456789ab", out)
    body = _pod_body(pod)
    (c,) = body.spec.containers
    assert c.name == CONTAINER and c.image == "registry.example/devchar:1.0"
    assert c.command == ["python", "-m", "pipeline.runner", "gemm", "--device", GPU, "--profile", "full",
                         "--out", str(out), "--run-id", "0123456789ab", "--timing-scale", "1.0"]
    scaled = sweep_pod(_settings(tmp_path), GPU, "gemm", "full", "0123456789ab", out, timing_scale=0.25)
    assert _pod_body(scaled).spec.containers[0].command[-2:] == ["--timing-scale", "0.25"]
    assert body.spec.node_selector == H100
    assert c.resources.limits == {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "1"}
    assert c.resources.requests == {"cpu": "16", "memory": "64Gi"}
    env = {e.name: e.value for e in c.env}
    assert env["DEVCHAR_PROFILE"] == "full" and env["HF_HOME"] == "/cache" and env["PYTHONUNBUFFERED"] == "1"
    assert env["DAGSTER_PIPES_CONTEXT"] == "ctx" and env["DAGSTER_PIPES_MESSAGES"] == "msgs"  # Pipes bootstrap
    # the results volume, mounted where the run pod reads them
    (mount,) = c.volume_mounts
    (vol,) = body.spec.volumes
    assert mount.mount_path == str(tmp_path / "runner-out") and vol.name == mount.name
    assert vol.persistent_volume_claim.claim_name == "devchar-results"
    assert str(out).startswith(mount.mount_path)
    assert [(t.key, t.effect) for t in body.spec.tolerations] == [("nvidia.com/gpu", "NoSchedule")]
    assert body.spec.restart_policy == "Never"
    assert body.metadata.labels["devchar/device"] == GPU and body.metadata.labels["devchar/sweep"] == "gemm"
    assert pod.namespace == "devchar"


def test_a_cpu_device_pod_asks_for_no_gpu_and_uses_its_own_image(tmp_path):
    pod = sweep_pod(_settings(tmp_path), "cpu-epyc-9654-96c", "utility", "quick", "r", tmp_path / "o")
    body = _pod_body(pod)
    (c,) = body.spec.containers
    assert c.image == "registry.example/devchar-cpu:1.0" and "nvidia.com/gpu" not in c.resources.limits
    assert body.spec.tolerations is None and body.spec.node_selector == {"node-pool": "cpu"}
    assert "--usual-probes" not in c.command
    runs = _pod_body(sweep_pod(_settings(tmp_path), "cpu-epyc-9654-96c", "workloads", "quick", "r", tmp_path / "o",
                               usual_probes=(23.5, 2.25)))
    assert runs.spec.containers[0].command[-2:] == ["--usual-probes", "23.5,2.25"]


def test_an_unconfigured_or_bad_device_is_refused(tmp_path):
    with pytest.raises(KeyError, match="no Kubernetes pod configured"):
        sweep_pod(_settings(tmp_path), "cuda-other", "gemm", "quick", "r", tmp_path)
    with pytest.raises(Exception, match="partition key"):
        sweep_pod(_settings(tmp_path), "../etc", "gemm", "quick", "r", tmp_path)
    with pytest.raises(ValueError, match="no image"):
        sweep_pod(K8sSettings(devices={GPU: K8sDevicePod()}), GPU, "gemm", "quick", "r", tmp_path)


def test_k8s_mode_is_chosen_by_resource_config_and_reads_the_pods_files(devchar_home, tmp_path, monkeypatch):
    """mode: k8s in run config; the pod launch replaced by what the runner in the pod does."""
    from assets.factories import sample_asset
    from pipeline.orchestration.partitions import devices
    from pipeline.runner import write_rows
    from resources.quality import QualityGates
    from test_factories import StubWarehouse

    @sample_asset(sweep="utility")
    def utility_samples(df, device):
        """Utility ops (a stand-in report)."""
        return {}

    launched = []

    def fake_run_pod(context, settings, pod):
        launched.append(pod)
        out = Path(pod.command[pod.command.index("--out") + 1])
        rows = [{"op": "add", "dtype": "float32", "rows": 1, "cols": 64, "median_us": 2.0, "cv": 0.01,
                 "held_out": False, "device": GPU, "run_id": "r"}]
        path = write_rows(rows, out, "utility_samples")
        return [{"table": "utility_samples", "path": str(path), "rows": 1}]

    monkeypatch.setattr(devices_mod, "run_pod", fake_run_pod)
    results = tmp_path / "shared"
    config = {"mode": "k8s", "profile": "tiny",
              "k8s": {"image": "registry.example/devchar:1.0", "results_dir": str(results),
                      "devices": {GPU: {"node_selector": H100, "gpus": 1}}}}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(devices.name, [GPU])
        warehouse = StubWarehouse()
        result = dg.materialize([utility_samples], partition_key=GPU, instance=instance,
                                resources={"device_runner": DeviceRunner(), "warehouse": warehouse,
                                           "quality_gates": QualityGates()},
                                run_config={"resources": {"device_runner": {"config": config}}})
        assert result.success
    (pod,) = launched
    assert pod.base_pod_spec["node_selector"] == H100 and pod.command[3:6] == ["utility", "--device", GPU]
    assert pod.command[pod.command.index("--out") + 1].startswith(str(results / result.run_id))
    assert warehouse.written["utility_samples", GPU]["median_us"].tolist() == [2.0]
    assert not any((results / result.run_id).iterdir())  # the sweep's directory is removed once read


def test_the_results_path_through_the_subprocess_pipes_client(devchar_home, monkeypatch):
    """The same read_results, fed by a real runner's Pipes messages (subprocess mode, device sweep)."""
    from assets.samples import device_spec
    from pipeline.device.discover import identify
    from pipeline.orchestration.partitions import devices
    from resources.quality import QualityGates
    from resources.warehouse import DuckDBWarehouse

    seen = []

    def spy(messages, out_dir, sweep):
        seen.append((messages, Path(out_dir), sweep))
        return read_results(messages, out_dir, sweep)

    monkeypatch.setattr(devices_mod, "read_results", spy)
    slug = identify("cpu").slug
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(devices.name, [slug])
        result = dg.materialize([device_spec], partition_key=slug, instance=instance,
                                resources={"device_runner": DeviceRunner(profile="tiny", mode="subprocess"),
                                           "warehouse": DuckDBWarehouse(), "quality_gates": QualityGates()})
    assert result.success
    ((messages, out, sweep),) = seen
    (msg,) = [m for m in messages if m.get("table") == "devices"]
    assert sweep == "device" and Path(msg["path"]).parent == out and msg["rows"] == 1


def test_read_results_refuses_what_the_runner_did_not_write(tmp_path):
    from pipeline.runner import write_rows

    out = tmp_path / "out"
    path = write_rows([{"a": 1}, {"a": 2}], out, "devices")
    assert len(read_results([{"table": "devices", "path": str(path), "rows": 2}], out, "device")["devices"]) == 2
    assert len(read_results([], out, "device")["devices"]) == 2  # no messages: the file under out
    with pytest.raises(RuntimeError, match="holds 2"):
        read_results([{"table": "devices", "path": str(path), "rows": 3}], out, "device")
    outside = write_rows([{"a": 1}], tmp_path / "elsewhere", "devices")
    with pytest.raises(RuntimeError, match="not a file under"):
        read_results([{"table": "devices", "path": str(outside), "rows": 1}], out, "device")
    with pytest.raises(RuntimeError, match="wrote no devices"):
        read_results([], tmp_path / "empty", "device")


def test_dagster_k8s_matches_the_pinned_dagster():
    import dagster_k8s

    assert dagster_k8s.__version__ == "0.29.27" and dg.__version__ == "1.13.27", sys.version
