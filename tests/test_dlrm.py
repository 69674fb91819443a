"""DLRM specs (Table III) and the trainable torch model: shapes, training, batched lookup, timing."""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

from pipeline.core.errors import BadShapeError  # noqa: E402
from pipeline.workloads.dlrm import (  # noqa: E402
    FULL_CONFIGS, QUICK_CONFIGS, TINY_CONFIGS, DLRMSpec, configs_for,
)
from pipeline.workloads.dlrm_run import build_dlrm, make_batch, measure_training_step, train_step  # noqa: E402

SPEC = TINY_CONFIGS[0]
BATCH = 6


def spec_with(**changes) -> DLRMSpec:
    fields = dict(name="t", dense_features=4, bottom_mlp=(8, 4), num_tables=2, rows_per_table=10,
                  embedding_dim=4, pooling=2, top_mlp=(8, 1))
    return DLRMSpec(**{**fields, **changes})


@pytest.mark.parametrize("changes, named", [
    (dict(bottom_mlp=(8, 6)), "bottom_mlp[-1]=6"),
    (dict(top_mlp=(8, 2)), "top_mlp[-1]=2"),
    (dict(pooling=0), "pooling=0"),
    (dict(embedding_dim=-3, bottom_mlp=(8, -3)), "embedding_dim=-3"),
    (dict(rows_per_table=(10, 0)), "rows_per_table[1]=0"),
    (dict(rows_per_table=(10, 10, 10)), "has 3 entries"),
    (dict(top_mlp=()), "top_mlp=()"),
    (dict(bottom_mlp=(8, 0, 4)), "bottom_mlp[1]=0"),
])
def test_bad_spec_names_the_value(changes, named):
    with pytest.raises(BadShapeError, match=re.escape(named)):
        spec_with(**changes)


def test_config_sets():
    assert [s.name for s in FULL_CONFIGS] == ["DLRM_default", "DLRM_MLPerf", "DLRM_DDP"]
    mlperf = FULL_CONFIGS[1]
    assert len(mlperf.table_rows) == 26 and max(mlperf.table_rows) == 14_000_000
    for full, quick in zip(FULL_CONFIGS, QUICK_CONFIGS):  # the quick ones keep their shape
        assert (len(quick.bottom_mlp), len(quick.top_mlp), quick.num_tables, quick.pooling) == \
               (len(full.bottom_mlp), len(full.top_mlp), full.num_tables, full.pooling)
    assert configs_for("tiny") == TINY_CONFIGS
    with pytest.raises(BadShapeError, match="'huge'"):
        configs_for("huge")


@pytest.fixture(scope="module")
def batch():
    return make_batch(SPEC, BATCH)


def test_forward_is_a_probability_per_sample(batch):
    out = build_dlrm(SPEC)(batch.dense, batch.indices, batch.offsets)
    assert out.shape == (BATCH, 1)
    assert bool(((out > 0) & (out < 1)).all())


def test_interaction_width(batch):
    model = build_dlrm(SPEC)
    n = SPEC.num_tables + 1
    width = SPEC.bottom_mlp[-1] + n * (n - 1) // 2
    assert SPEC.interaction_dim == width
    assert model.interact(batch.dense, batch.indices, batch.offsets).shape == (BATCH, width)
    assert model.top[0].in_features == width
    # the same pairs, in the same order, as dlrm_s_pytorch's interact_features (dot, no self-pairs)
    with torch.no_grad():
        x = model.bottom(batch.dense)
        t = torch.cat([x] + [tb(batch.indices[i], batch.offsets[i]) for i, tb in enumerate(model.tables)], dim=1)
        t = t.view(BATCH, -1, SPEC.embedding_dim)
        z = torch.bmm(t, t.transpose(1, 2))
        li = torch.tensor([i for i in range(n) for j in range(i)])
        lj = torch.tensor([j for i in range(n) for j in range(i)])
        expected = torch.cat([x, z[:, li, lj]], dim=1)
        torch.testing.assert_close(model.interact(batch.dense, batch.indices, batch.offsets), expected)


def test_train_step_changes_weights_and_lowers_loss(batch):
    model = build_dlrm(SPEC, lr=0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    losses = [float(train_step(model, batch)) for _ in range(5)]
    after = model.state_dict()
    assert not torch.equal(before["bottom.0.weight"], after["bottom.0.weight"])
    assert not torch.equal(before["top.0.weight"], after["top.0.weight"])
    # sparse SGD: looked-up rows move, rows never looked up stay as they were
    table0, used = after["tables.0.weight"], batch.indices[0].unique()
    assert not torch.equal(before["tables.0.weight"][used], table0[used])
    unused = torch.ones(SPEC.table_rows[0], dtype=torch.bool)
    unused[used] = False
    assert torch.equal(before["tables.0.weight"][unused], table0[unused])
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_batched_lookup_matches_per_table(batch):
    per_table, batched = build_dlrm(SPEC), build_dlrm(SPEC, batched=True)
    with torch.no_grad():
        batched.table.weight.copy_(torch.cat([t.weight for t in per_table.tables]))
        for name in ("bottom", "top"):
            getattr(batched, name).load_state_dict(getattr(per_table, name).state_dict())
    args = (batch.dense, batch.indices, batch.offsets)
    torch.testing.assert_close(batched.embed(batch.indices, batch.offsets),
                               per_table.embed(batch.indices, batch.offsets))
    torch.testing.assert_close(batched(*args), per_table(*args))


def test_inputs_are_valid_rows():
    b = make_batch(SPEC, BATCH, seed=1)
    assert b.indices.shape == (SPEC.num_tables, BATCH * SPEC.pooling)
    assert b.offsets.shape == (SPEC.num_tables, BATCH)
    for t, rows in enumerate(SPEC.table_rows):
        assert 0 <= int(b.indices[t].min()) and int(b.indices[t].max()) < rows
    with pytest.raises(BadShapeError, match="batch=0"):
        make_batch(SPEC, 0)


def test_the_pool_covers_the_tables_once_over_never_more_than_its_cap():
    from pipeline.workloads.dlrm_run import MAX_POOL, pool_size

    big = spec_with(rows_per_table=1_000_000, embedding_dim=32, pooling=1, bottom_mlp=(8, 32))
    table_bytes, per_batch = 2 * 1_000_000 * 32 * 4, 2 * 16 * 32 * 4  # two tables; 16 rows a table per batch
    assert pool_size(spec_with(), 64) == 1  # one batch's rows outnumber the tables' own
    assert pool_size(big, 16) == min(MAX_POOL, -(-table_bytes // per_batch)) == MAX_POOL
    assert pool_size(big, 4096) == -(-table_bytes // (256 * per_batch))  # the tables' bytes, rounded up
    assert pool_size(big, 10**6) == 1
    huge = spec_with(rows_per_table=10_000_000, embedding_dim=32, pooling=1, bottom_mlp=(8, 32))  # 2.5 GB of tables
    assert pool_size(huge, 4096) == -(-(1 << 30) // (256 * per_batch))  # 1 GiB of lookups, not the tables


def test_every_built_step_feeds_the_pool(monkeypatch):
    from pipeline.sweeps.catalog import WorkloadEntry
    from pipeline.workloads import dlrm_run

    seeds, make = [], dlrm_run.make_batch
    monkeypatch.setattr(dlrm_run, "make_batch", lambda *a, seed=0, **k: seeds.append(seed) or make(*a, seed=seed, **k))
    WorkloadEntry("dlrm", SPEC.name, 2, 0, "train", SPEC).build()
    assert seeds == list(range(dlrm_run.pool_size(SPEC, 2))) and len(seeds) > 1
    seeds.clear()
    measure_training_step(SPEC, 2, warmup=1, reps=3)
    assert seeds == list(range(dlrm_run.pool_size(SPEC, 2)))


def test_steps_cycle_through_distinct_batches_the_first_as_before(monkeypatch):
    from pipeline.workloads import dlrm_run

    pool = dlrm_run.make_batches(SPEC, BATCH, count=3)
    torch.testing.assert_close(pool[0].indices, make_batch(SPEC, BATCH).indices)
    assert not torch.equal(pool[1].indices, pool[2].indices)
    seen = []
    monkeypatch.setattr(dlrm_run, "train_step", lambda model, b: seen.append(b))
    step = dlrm_run.training_steps(object(), pool)
    for _ in range(7):
        step()
    assert [[id(p) for p in pool].index(id(b)) for b in seen] == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError, match="count=0"):
        dlrm_run.make_batches(SPEC, BATCH, count=0)


def test_measure_training_step_tiny():
    m = measure_training_step(SPEC, 4, warmup=1, reps=3)
    assert m.reps == 3 and bool((m.times_us > 0).all())


def test_what_if_measure_times_training_steps_in_blocks_the_quickest_kept():
    from pipeline.workloads.dlrm_run import measure_training_blocks

    kept, medians = measure_training_blocks(SPEC, 4, warmup=1, reps=3)
    assert len(medians) in (2, 3) and kept.reps == 3 and kept.median_us == min(medians)
    with pytest.raises(BadShapeError, match="batch=0"):
        measure_training_blocks(SPEC, 0)


def test_full_configs_build_on_meta():
    """Table III sizes without memory: the top MLP input matches dlrm's ln_top[0] (479 for MLPerf)."""
    for spec, width in zip(FULL_CONFIGS, (100, 479, 164)):
        model = build_dlrm(spec, device="meta", batched=spec.num_tables > 8)
        b = make_batch(spec, 2, device="meta")
        assert model.top[0].in_features == width
        assert model(b.dense, b.indices, b.offsets).shape == (2, 1)
