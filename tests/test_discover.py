"""CPU slugs: the family and model numbers keep two CPUs that report the same name apart."""
import pytest

from pipeline.core.errors import UnknownDeviceError
from pipeline.device import discover
from pipeline.device.discover import cpu_signature, cpu_stem


def test_same_name_different_models_get_different_slugs():
    name = "Intel(R) Xeon(R) Processor"  # what a VM reports for more than one Xeon
    a = cpu_stem(name, cpu_signature({"cpu family": "6", "model": "167"}))
    b = cpu_stem(name, cpu_signature({"cpu family": "6", "model": "207"}))
    assert (a, b) == ("cpu-intel-xeon-processor-f6m167", "cpu-intel-xeon-processor-f6m207")


def test_arm_and_unknown_signatures():
    assert cpu_signature({"CPU implementer": "0x41", "CPU part": "0xd0c"}) == "i41pd0c"
    assert cpu_signature({"model name": "Some CPU"}) == ""
    assert cpu_stem("Some CPU", "") == "cpu-some-cpu"


def test_the_signature_is_read_from_the_first_processor_block(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n\n"
                    "processor\t: 1\ncpu family\t: 6\nmodel\t\t: 85\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(info if p == "/proc/cpuinfo" else p, *a, **k))
    fields = discover._cpuinfo()
    assert cpu_signature(fields) == "f25m17"
    assert discover._cpu_model(fields) == "AMD EPYC"
    assert discover.identify_cpu().slug == f"cpu-amd-epyc-f25m17-{discover.cpu_threads()}c"


def test_measure_takes_only_this_cpus_slugs():
    from pipeline.workloads.two_stage import local_cpu_threads

    me = discover.identify_cpu()
    stem = me.slug.rsplit("-", 1)[0]
    assert local_cpu_threads(f"{stem}-1c") == 1
    with pytest.raises(UnknownDeviceError, match="not one of"):
        local_cpu_threads(f"{stem}0-1c")  # another model number: another CPU
