"""MLflow tracking: one run per fit, with params, held-out metrics and device / data-hash / git-sha /
Dagster-run tags, and the MLflow model registry: one registered model per (model, device),
`devchar-<model>-<device>`, one version per saved fit recording its model-store version, and
the alias `champion` on the newest version that passed its held-out check (see
pipeline/analysis/champion.py, which `devchar predict` resolves through)."""
from __future__ import annotations

import fcntl
import re
import subprocess
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
from pydantic import PrivateAttr

from pipeline.analysis.champion import CHAMPION, STORE_PATH_TAG, STORE_VERSION_TAG, registered_name
from pipeline.core.config import REPO_ROOT, mlflow_artifacts, mlflow_uri

EXPERIMENT = "devchar-fits"
# MLflow 3's experiment type: the UI opens an experiment tagged custom_model_development in its
# model-training view (runs, models), not the GenAI one (traces). The tag and its values are
# mlflow.experimentKind in the installed mlflow 3.x (its UI bundle's ExperimentKind enum).
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"


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
    # where the MLflow UI serves this store (`make mlflow`): the base of the run links in metadata
    ui_url: str = "http://127.0.0.1:5000"
    _dagster_run_id: str = PrivateAttr(default="")
    _experiment_id: str = PrivateAttr(default="")

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Every MLflow run a Dagster run logs is tagged with it (dagster_run_id), whichever asset logs.
        self._dagster_run_id = context.run.run_id if context.run is not None else ""

    def _setup(self):
        import mlflow

        uri = self.tracking_uri or mlflow_uri()
        mlflow.set_tracking_uri(uri)
        # Two devchar runs (two devices) starting at once would both create the sqlite store's
        # tables ("table ... already exists" killed one of them): set-up holds a file lock.
        with _setup_lock(uri):
            experiment = mlflow.get_experiment_by_name(EXPERIMENT)
            if experiment is None:
                root = Path(self.artifact_root) if self.artifact_root else mlflow_artifacts()
                root.mkdir(parents=True, exist_ok=True)
                mlflow.create_experiment(EXPERIMENT, artifact_location=root.as_uri(),
                                         tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
            elif experiment.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:  # made before the tag
                mlflow.MlflowClient().set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG,
                                                         EXPERIMENT_KIND)
        self._experiment_id = mlflow.set_experiment(EXPERIMENT).experiment_id
        return mlflow

    def run_url(self, run_id: str) -> str:
        """The MLflow UI's page of a run log_fit logged."""
        return f"{self.ui_url.rstrip('/')}/#/experiments/{self._experiment_id or '0'}/runs/{run_id}"

    def log_fit(self, model_name: str, device: str, params: dict, metrics: dict, tags: dict,
                artifacts: list[Path], *, store_version: str | None = None, store_path: Path | None = None,
                passed: bool | None = None, dagster_run_id: str | None = None) -> str:
        """One MLflow run for a fit; its id. With `store_version` (the model-store version the fit
        was saved as) it is also a new version of the registered model devchar-<model>-<device>,
        and `champion` moves to it unless `passed` is False (a failed held-out check: the run and
        the version are tagged heldout_check=failed and the alias stays where it was). `passed`
        None: the model has no held-out gate, usable like the store's `latest` uses it."""
        mlflow = self._setup()
        run_tags = {"device": device, "model": model_name, "git_sha": git_sha(),
                    "dagster_run_id": dagster_run_id or self._dagster_run_id or "none", **tags}
        if passed is not None:
            run_tags["heldout_check"] = "passed" if passed else "failed"
        with mlflow.start_run(run_name=f"{model_name}@{device}") as run:
            mlflow.set_tags(run_tags)
            mlflow.log_params(params)
            mlflow.log_metrics({metric_name(k): float(v) for k, v in metrics.items() if v == v})  # drop NaN
            for path in artifacts:
                mlflow.log_artifact(str(path))
            run_id = run.info.run_id
        if store_version is not None:
            self._register(mlflow, model_name, device, run_id, store_version, store_path, passed, run_tags)
        return run_id

    def _register(self, mlflow, model_name: str, device: str, run_id: str, store_version: str,
                  store_path: Path | None, passed: bool | None, run_tags: dict) -> str:
        """A version of devchar-<model>-<device> for the run; `champion` on it unless it failed.
        No MLflow model is logged: the JSON model store stays the artifact format, and the
        version records which store version it is (and points at its directory)."""
        from mlflow.exceptions import MlflowException

        client, name = mlflow.MlflowClient(), registered_name(model_name, device)
        try:
            client.create_registered_model(name, tags={"device": device, "model": model_name},
                                           description=f"devchar {model_name} fitted on {device}")
        except MlflowException as exc:  # registered by an earlier fit (or a concurrent one)
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        source = store_path.resolve().as_uri() if store_path is not None else f"runs:/{run_id}"
        version_tags = {STORE_VERSION_TAG: store_version, "dagster_run_id": run_tags["dagster_run_id"],
                        "heldout_check": run_tags.get("heldout_check", "none")}
        if store_path is not None:
            version_tags[STORE_PATH_TAG] = str(store_path)
        mv = client.create_model_version(name, source=source, run_id=run_id, tags=version_tags)
        if passed is not False:
            client.set_registered_model_alias(name, CHAMPION, mv.version)
        return mv.version
