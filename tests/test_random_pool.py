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


def test_each_tensor_is_its_own_memory():
    a, b = random_pool.randn(64, 64), random_pool.randn(64, 64)
    assert a.data_ptr() != b.data_ptr()
    assert torch.equal(a, b)  # the same samples: only the memory is fresh
    a.add_(1.0)
    assert not torch.equal(a, b)  # writing one leaves the other, and the pool, as drawn
    assert torch.equal(random_pool.randn(64, 64), b)


def test_the_pool_grows_to_the_largest_request_and_is_released():
    small = random_pool.randn(4)
    big = random_pool.randn(random_pool.MIN_POOL + 10)
    assert big.numel() == random_pool.MIN_POOL + 10
    assert random_pool._POOLS[(str(torch.float32), "cpu")].numel() == random_pool.MIN_POOL + 10
    assert small.shape == (4,)
    random_pool.release()
    assert not random_pool._POOLS
