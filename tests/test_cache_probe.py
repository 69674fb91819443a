"""The CPU flush size is measured: doubled from the reported last-level cache until a cold
gather stops slowing (harness/cache_probe.py)."""
import numpy as np

from pipeline.harness.cache_probe import MAX_DOUBLINGS, cpu_flush, effective_flush_bytes

MB = 1 << 20


def test_the_flush_grows_while_a_cold_gather_still_slows():
    # the EPYC VM's figures: 243, 315, 455, 469 us after 32, 64, 128, 256 MB
    seen = {32 * MB: 243.0, 64 * MB: 315.0, 128 * MB: 455.0, 256 * MB: 469.0, 512 * MB: 470.0}
    asked = []

    def gather_us(size):
        asked.append(size)
        return seen[size]

    assert effective_flush_bytes(32 * MB, gather_us=gather_us) == 128 * MB
    assert asked == [32 * MB, 64 * MB, 128 * MB, 256 * MB]


def test_a_reported_cache_that_holds_is_kept_and_the_doubling_is_bounded():
    assert effective_flush_bytes(32 * MB, gather_us=lambda size: 100.0) == 32 * MB
    assert effective_flush_bytes(MB, gather_us=lambda size: float(size)) == MB << MAX_DOUBLINGS


def test_the_cpu_flush_reads_and_writes_its_buffer():
    flush = cpu_flush(4096)
    flush()
    flush()
    buf = flush()  # add_ returns the buffer it updated in place
    assert np.allclose(buf.numpy(), 4.0)
