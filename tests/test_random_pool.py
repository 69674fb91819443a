"""Random sweep inputs from a kept pool (harness/random_pool.py): randn's distribution, fresh memory."""
import pytest

torch = pytest.importorskip("torch")

from pipeline.harness import random_pool  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_pools():
    random_pool.release()
    yield
    random_pool.release()


def test_shape_dtype_and_normal_values():
    x = random_pool.randn(300, 500, dtype=torch.bfloat16)
    assert x.shape == (300, 500) and x.dtype == torch.bfloat16 and x.is_contiguous()
    f = x.float()
    assert abs(float(f.mean())) < 0.05 and abs(float(f.std()) - 1.0) < 0.05
    assert torch.isfinite(f).all() and (f != 0).float().mean() > 0.99


def test_two_inputs_are_their_own_memory_and_values():
    a, b = random_pool.randn(64, 64), random_pool.randn(64, 64)
    assert a.data_ptr() != b.data_ptr()
    assert not torch.equal(a, b)  # another offset of the pool: x + y is not x + x
    before = b.clone()
    a.add_(1.0)
    assert torch.equal(b, before)  # writing one leaves the other, and the pool, as drawn


def test_a_sweep_gets_the_same_inputs_after_a_release():
    first = [random_pool.randn(32, 8) for _ in range(3)]
    random_pool.release()
    again = [random_pool.randn(32, 8) for _ in range(3)]
    assert all(torch.equal(x, y) for x, y in zip(first, again))


def test_the_pool_grows_past_the_largest_request_and_is_released():
    small = random_pool.randn(4)
    big = random_pool.randn(random_pool.MIN_POOL + 10)
    assert big.numel() == random_pool.MIN_POOL + 10 and small.shape == (4,)
    assert random_pool._POOLS[str(torch.float32)].numel() == random_pool.MIN_POOL + 10 + random_pool.SPARE
    random_pool.release()
    assert not random_pool._POOLS


def test_past_the_cap_a_tensor_is_drawn_fresh_and_no_pool_is_kept(monkeypatch):
    monkeypatch.setattr(random_pool, "MAX_POOL", 100)
    x = random_pool.randn(20, 10)
    assert x.shape == (20, 10) and not random_pool._POOLS
