"""The device runner's Kubernetes mode: one pod per sweep on the partition's GPU node, launched
with dagster-k8s' PipesK8sClient (docs/kubernetes.md).

The pod runs the same entry point as the subprocess mode, `python -m pipeline.runner <sweep>
--device <slug> --profile <p> --out <dir> --run-id <id>`, in the devchar image, pinned to the
device's nodes by a node selector, with the device's GPUs as a resource limit. Its logs and
Pipes messages come back through the pod's log stream (PipesK8sClient's default reader). The
tables come back as files: the runner writes them under a per-sweep directory on a volume that
the Dagster run's pod mounts at the same path (a ReadWriteMany claim), and reports each file's
path and row count as a Pipes custom message; the run reads exactly those files
(resources/devices.read_results, the path the subprocess mode uses too).

Nothing here needs a cluster: `sweep_pod` is plain data, and dagster_k8s is imported only when
a pod is launched. No cluster was reachable where this was written: the pod body is tested, the
launch is not (see docs/kubernetes.md).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from pipeline.core.slugs import check_slug
from pipeline.runner import usual_probes_args

CONTAINER = "devchar-runner"


class K8sDevicePod(dg.Config):
    """Where one device partition's sweeps run."""
    image: str = ""  # empty: K8sSettings.image
    # the device's nodes, e.g. {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"} (GPU feature discovery)
    node_selector: dict[str, str] = {}
    gpus: int = 1  # nvidia.com/gpu limit; 0 for a CPU device
    cpu: str = "8"
    memory: str = "32Gi"
    # GPU nodes are commonly tainted nvidia.com/gpu:NoSchedule; tolerate it where gpus > 0
    tolerate_gpu_taint: bool = True


class K8sSettings(dg.Config):
    """The Kubernetes mode's settings (DeviceRunner.k8s)."""
    namespace: str = ""  # empty: the run pod's own namespace, else "default"
    image: str = ""  # the devchar image: torch, numpy, pyarrow, dagster-pipes and this repository
    devices: dict[str, K8sDevicePod] = {}  # by device slug (the partition key)
    # the shared volume the results come back on: a PersistentVolumeClaim (ReadWriteMany) that
    # the Dagster run pods mount at results_dir too
    results_claim: str = "devchar-runner-results"
    results_dir: str = "/devchar/runner-out"
    service_account: str = ""
    env: dict[str, str] = {}  # extra environment for the runner container
    pod_wait_timeout_s: float = 6 * 3600.0  # a full GPU calibration runs for hours


@dataclass(frozen=True)
class SweepPod:
    """What PipesK8sClient.run is given for one sweep (its bootstrap env is added by the client)."""
    namespace: str | None
    image: str
    command: list[str]
    env: dict[str, str]
    base_pod_meta: dict
    base_pod_spec: dict


def _label(value: str) -> str:
    """A Kubernetes label value: <= 63 characters of [A-Za-z0-9._-], alphanumeric at both ends."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", value)[:63].strip("-_.") or "none"


def sweep_pod(settings: K8sSettings, device: str, sweep: str, profile: str, run_id: str, out_dir: Path,
              timing_scale: float = 1.0, usual_probes: tuple[float | None, float | None] | None = None) -> SweepPod:
    """The pod that runs `sweep` for `device` and writes its tables under `out_dir` (on the shared
    volume); `usual_probes` as the runner's --usual-probes (a CPU node's workload runs and traces)."""
    check_slug(device, "partition key")
    if device not in settings.devices:
        raise KeyError(f"no Kubernetes pod configured for device {device!r}; have {sorted(settings.devices)}")
    pod = settings.devices[device]
    image = pod.image or settings.image
    if not image:
        raise ValueError(f"no image for device {device!r}: set device_runner.k8s.image or its devices entry")
    command = ["python", "-m", "pipeline.runner", sweep, "--device", device, "--profile", profile,
               "--out", str(out_dir), "--run-id", run_id, "--timing-scale", repr(float(timing_scale)),
               *usual_probes_args(usual_probes)]
    env = {"DEVCHAR_PROFILE": profile, "PYTHONUNBUFFERED": "1", **settings.env}
    limits = {"cpu": pod.cpu, "memory": pod.memory}
    if pod.gpus:
        limits["nvidia.com/gpu"] = str(pod.gpus)
    container = {
        "name": CONTAINER,
        "resources": {"requests": {"cpu": pod.cpu, "memory": pod.memory}, "limits": limits},
        "volume_mounts": [{"name": "results", "mount_path": settings.results_dir}],
    }
    spec: dict = {
        "containers": [container],
        "restart_policy": "Never",
        "node_selector": dict(pod.node_selector),
        "volumes": [{"name": "results", "persistent_volume_claim": {"claim_name": settings.results_claim}}],
    }
    if pod.gpus and pod.tolerate_gpu_taint:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if settings.service_account:
        spec["service_account_name"] = settings.service_account
    meta = {"labels": {"app.kubernetes.io/name": "devchar-runner", "devchar/device": _label(device),
                       "devchar/sweep": _label(sweep), "devchar/run-id": _label(run_id)}}
    return SweepPod(settings.namespace or None, image, command, env, meta, spec)


def run_pod(context: dg.AssetExecutionContext, settings: K8sSettings, pod: SweepPod) -> list:
    """Launch the pod through Pipes, wait for it, and return the runner's custom messages."""
    from dagster_k8s import PipesK8sClient

    invocation = PipesK8sClient().run(
        context=context, image=pod.image, command=pod.command, namespace=pod.namespace, env=pod.env,
        base_pod_meta=pod.base_pod_meta, base_pod_spec=pod.base_pod_spec,
        pod_wait_timeout=settings.pod_wait_timeout_s)
    return list(invocation.get_custom_messages())
