"""`devchar run` on a machine whose OpenCL device cannot run the launch sweep (PoCL 3.0 on a
Zen 5 EPYC): what it leaves out and what it says."""


def test_run_leaves_out_an_opencl_device_that_cannot_build(monkeypatch, capsys):
    """`devchar run` on a machine whose OpenCL compiler refuses the CPU: the launch sweep (and
    with it the OpenCL models) is skipped with the compiler's reason, not failed mid-run."""
    import pipeline.opencl.sweep.execute as execute
    from pipeline.cli import main as cli

    monkeypatch.setattr(execute, "opencl_unusable", lambda kind: f"the OpenCL {kind} device cannot build a kernel: "
                        "unknown target CPU 'generic'")
    assert cli._unusable_opencl("cpu-some-2c") == ["opencl_launches"]
    assert "cpu device cannot build a kernel: unknown target CPU 'generic'" in capsys.readouterr().out
    assert cli._unusable_opencl("cuda-some-gpu") == ["opencl_launches"]
    assert "the OpenCL gpu device" in capsys.readouterr().out
    monkeypatch.setattr(execute, "opencl_unusable", lambda kind: None)
    assert cli._unusable_opencl("cpu-some-2c") == []


def test_an_expected_failure_of_an_opencl_check_is_dropped_where_opencl_cannot_run(monkeypatch, capsys):
    from types import SimpleNamespace

    import pipeline.opencl.sweep.execute as execute
    from pipeline.cli import main as cli

    monkeypatch.setattr(execute, "opencl_unusable", lambda kind: "pyopencl is not installed here")
    args = SimpleNamespace(skip=[], expect_failing=["opencl_models.validation_mape", "gemm_model.heldout_error"])
    assert cli._unusable_opencl("cpu-some-2c", args) == ["opencl_launches"]
    assert args.expect_failing == ["gemm_model.heldout_error"]
    assert "--expect-failing opencl_models.validation_mape: not run here, dropped" in capsys.readouterr().out
    clash = SimpleNamespace(skip=["opencl_models"], expect_failing=["opencl_models.validation_mape"])
    cli._unusable_opencl("cpu-some-2c", clash)  # the user's own clash is left for `skipping` to name
    assert clash.expect_failing == ["opencl_models.validation_mape"]
    asked = []
    monkeypatch.setattr(execute, "opencl_unusable", lambda kind: asked.append(kind))
    assert cli._unusable_opencl("cpu-some-2c", SimpleNamespace(skip=["opencl_launches"])) == [] and not asked
