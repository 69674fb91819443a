"""scripts/check_references.sh: every reference replayed in its own home, known failures passed
on, one failure fails the whole, each log printed whole (a stand-in `devchar` records its calls)."""
import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_references.sh"

FAKE = """#!/usr/bin/env bash
echo "home=$DEVCHAR_HOME args=$*"
case "$*" in *cpu-bad*) exit 2;; esac
"""


def _run(tmp_path, slugs, expected=None, **env_extra):
    refs = tmp_path / "reference"
    for slug in slugs:
        (refs / slug).mkdir(parents=True)
        (refs / slug / "devices.parquet").write_bytes(b"")
    (refs / "no-devices-row").mkdir()  # not a calibration: skipped
    if expected:
        (refs / slugs[0] / "expected_check_failures").write_text(expected)
    fake = tmp_path / "devchar"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    env = {**os.environ, "DEVCHAR_HOME": str(tmp_path / "home"), "DEVCHAR": str(fake), "REFERENCES": str(refs),
           "CHECK_REFERENCES_JOBS": "2", **env_extra}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)


def test_each_reference_is_replayed_in_its_own_home_with_its_known_failures(tmp_path):
    out = _run(tmp_path, ["cpu-a", "cpu-b"], "utility_model.heldout_error  # copy_bcast bf16, 51.5 %\n")
    assert out.returncode == 0, out.stdout + out.stderr
    home = tmp_path / "home" / "references"
    assert f"home={home}/cpu-a args=run --device cpu-a --log-level WARNING --expect-failing " \
           "utility_model.heldout_error --skip opencl_models" in out.stdout
    # the OpenCL models' fit is left out by default (their check never gates)
    assert f"home={home}/cpu-b args=run --device cpu-b --log-level WARNING --skip opencl_models\n" in out.stdout
    assert "no-devices-row" not in out.stdout
    assert "all 2 calibrations passed" in out.stdout


def test_one_failing_reference_fails_the_check_and_is_named(tmp_path):
    out = _run(tmp_path, ["cpu-a", "cpu-bad"])
    assert out.returncode == 1
    assert "FAILED: cpu-bad" in out.stdout and "=== cpu-a ===" in out.stdout


def test_no_reference_is_not_a_failure(tmp_path):
    (tmp_path / "reference").mkdir()
    env = {**os.environ, "DEVCHAR_HOME": str(tmp_path), "REFERENCES": str(tmp_path / "reference")}
    out = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "no committed calibration" in out.stdout


def test_a_known_failure_on_a_last_line_without_its_newline_still_counts(tmp_path):
    out = _run(tmp_path, ["cpu-a"], "attention_model.heldout_error\nutility_model.heldout_error")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "--expect-failing attention_model.heldout_error --expect-failing utility_model.heldout_error" in out.stdout


def test_a_bad_job_count_or_a_missing_devchar_is_one_clear_error(tmp_path):
    refs = tmp_path / "reference" / "cpu-a"
    refs.mkdir(parents=True)
    (refs / "devices.parquet").write_bytes(b"")
    env = {**os.environ, "DEVCHAR_HOME": str(tmp_path), "REFERENCES": str(tmp_path / "reference")}
    bad_jobs = subprocess.run(["bash", str(SCRIPT)], env={**env, "CHECK_REFERENCES_JOBS": "0"},
                              capture_output=True, text=True)
    assert bad_jobs.returncode == 2 and "'0'" in bad_jobs.stderr
    no_devchar = subprocess.run(["bash", str(SCRIPT)], env={**env, "DEVCHAR": str(tmp_path / "nowhere")},
                                capture_output=True, text=True)
    assert no_devchar.returncode == 2 and "no devchar" in no_devchar.stderr


def test_the_replays_skip_what_they_are_told_and_nothing_when_told_nothing(tmp_path):
    out = _run(tmp_path / "none", ["cpu-a"], CHECK_REFERENCES_SKIP="")
    assert out.returncode == 0 and "args=run --device cpu-a --log-level WARNING\n" in out.stdout
    out = _run(tmp_path / "two", ["cpu-a"], CHECK_REFERENCES_SKIP="opencl_models mlp_baselines")
    assert "--skip opencl_models --skip mlp_baselines\n" in out.stdout
