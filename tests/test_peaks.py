"""Measured peaks: the CPU peak's size follows what one call costs."""
from pipeline.device.peaks import PEAK_MAX_CALL_S, cpu_peak_size


def test_a_fast_dtype_reaches_the_target_size():
    rate = 1e11  # hardware float32: 1024^3 in ~20 ms
    assert cpu_peak_size(lambda n: 2 * n**3 / rate) == 1024


def test_a_dtype_run_in_software_stops_before_a_call_passes_the_limit():
    rate = 1.3e9  # ATen's bf16 loop on the AVX2 EPYC: 256^3 in 26 ms, 512^3 in 0.2 s
    sizes = []

    def call_s(n):
        sizes.append(n)
        return 2 * n**3 / rate

    assert cpu_peak_size(call_s) == 256 and sizes == [256]
    assert 8 * call_s(256) > PEAK_MAX_CALL_S


def test_the_size_stops_where_the_next_one_would_pass_the_limit():
    rate = 2e10  # 512^3 in 13 ms: 1024^3 would take ~0.11 s
    assert cpu_peak_size(lambda n: 2 * n**3 / rate) == 512
