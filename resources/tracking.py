"""MLflow tracking: one run per fit, with params, held-out metrics and device / data-hash / git-sha tags."""
from __future__ import annotations

import fcntl
import re
import subprocess
from contextlib import contextmanager
from pathlib import Path

import dagster as dg

from pipeline.core.config import REPO_ROOT, mlflow_artifacts, mlflow_uri

EXPERIMENT = "devchar-fits"


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def metric_name(key: str) -> str:
    """MLflow accepts letters, digits and `_ - . / : space` in a metric name; a problem key
    such as 'linear:TN+bias' would be refused for its '+'."""
    return re.sub(r"[^\w\-./: ]", "_", key)


@contextmanager
def _setup_lock(uri: str):
    """An exclusive lock beside a sqlite store while it is created; nothing for a server URI."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.parent / f".{db.name}.setup-lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class MLflowTracking(dg.ConfigurableResource):
    tracking_uri: str = ""  # empty: sqlite under $DEVCHAR_HOME
    artifact_root: str = ""

    def _setup(self):
        import mlflow

        uri = self.tracking_uri or mlflow_uri()
        mlflow.set_tracking_uri(uri)
        # Two devchar runs (two devices) starting at once would both create the sqlite store's
        # tables ("table ... already exists" killed one of them): set-up holds a file lock.
        with _setup_lock(uri):
            if mlflow.get_experiment_by_name(EXPERIMENT) is None:
                root = Path(self.artifact_root) if self.artifact_root else mlflow_artifacts()
                root.mkdir(parents=True, exist_ok=True)
                mlflow.create_experiment(EXPERIMENT, artifact_location=root.as_uri())
        mlflow.set_experiment(EXPERIMENT)
        return mlflow

    def log_fit(self, model_name: str, device: str, params: dict, metrics: dict, tags: dict,
                artifacts: list[Path]) -> str:
        mlflow = self._setup()
        with mlflow.start_run(run_name=f"{model_name}@{device}") as run:
            mlflow.set_tags({"device": device, "model": model_name, "git_sha": git_sha(), **tags})
            mlflow.log_params(params)
            mlflow.log_metrics({metric_name(k): float(v) for k, v in metrics.items() if v == v})  # drop NaN
            for path in artifacts:
                mlflow.log_artifact(str(path))
            return run.info.run_id
