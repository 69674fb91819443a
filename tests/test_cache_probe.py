"""The CPU flush size is measured: doubled from the reported last-level cache until a cold
gather stops slowing (harness/cache_probe.py)."""
import numpy as np

from pipeline.harness.cache_probe import MAX_DOUBLINGS, cpu_flush, effective_flush_bytes

MB = 1 << 20


def test_the_flush_is_the_smallest_that_makes_a_gather_nearly_as_slow_as_any():
    # the EPYC VM's figures: 243, 315, 455, 469 us after 32, 64, 128, 256 MB
    seen = {32 * MB: 243.0, 64 * MB: 315.0, 128 * MB: 455.0, 256 * MB: 469.0, 512 * MB: 470.0}
    assert effective_flush_bytes(32 * MB, gather_us=seen.__getitem__) == 128 * MB
    noisy = {**seen, 64 * MB: 250.0}  # one step that barely moved must not stop the search there
    assert effective_flush_bytes(32 * MB, gather_us=noisy.__getitem__) == 128 * MB


def test_a_reported_cache_that_holds_is_kept_and_the_search_is_bounded():
    assert effective_flush_bytes(32 * MB, gather_us=lambda size: 100.0) == 32 * MB
    assert effective_flush_bytes(MB, gather_us=lambda size: float(size)) == MB << MAX_DOUBLINGS


def test_the_cpu_flush_reads_and_writes_its_buffer():
    flush = cpu_flush(4096)
    flush()
    flush()
    buf = flush()  # add_ returns the buffer it updated in place
    assert np.allclose(buf.numpy(), 4.0)


def test_no_flush_size_takes_more_than_a_quarter_of_the_memory():
    # a VM reporting its host's 480 MB L3 on a 24 GB machine: 16x would be a 7.7 GB buffer
    tried = []
    size = effective_flush_bytes(480 * MB, gather_us=lambda s: tried.append(s) or float(s), memory_bytes=8 << 30)
    assert max(tried) <= 2 << 30 and size == max(tried) == 1920 * MB
    # a reported cache bigger than the cap is still tried alone, not skipped
    assert effective_flush_bytes(4096 * MB, gather_us=lambda s: 1.0, memory_bytes=8 << 30) == 4096 * MB
