"""docs/tables.md documents exactly the table contract (pipeline/core/tables.py): every table,
every column, its kind and whether it is required. A column added to the contract without a
line in the doc (or the other way round) fails here, so the doc cannot drift."""
import inspect
import re
from pathlib import Path

import pytest

from pipeline.analysis import grid_cache
from pipeline.core.tables import CONTRACT

DOC = Path(__file__).resolve().parents[1] / "docs" / "tables.md"
OUTSIDE_CONTRACT = "layer_grid_predictions"  # written by `devchar predict-grid` only
ROW = re.compile(r"^\| `([^`]+)` \| (\w+) \| (yes|no) \| .+ \|$")
SQL_KIND = {"VARCHAR": "str", "BIGINT": "int", "DOUBLE": "float", "BOOLEAN": "bool"}


def documented() -> dict[str, dict[str, tuple[str, bool]]]:
    """table -> column -> (kind, required), from each `## `table`` section's markdown table."""
    tables, current = {}, None
    for line in DOC.read_text().splitlines():
        head = re.fullmatch(r"## `(\w+)`", line.strip())
        if head:
            current = tables.setdefault(head.group(1), {})
            continue
        row = ROW.match(line.strip())
        if row and current is not None:
            name, kind, required = row.groups()
            assert name not in current, f"{name} listed twice"
            current[name] = (kind, required == "yes")
    return tables


def test_every_table_is_documented_once():
    assert set(documented()) == set(CONTRACT) | {OUTSIDE_CONTRACT}


@pytest.mark.parametrize("table", sorted(CONTRACT))
def test_columns_kinds_and_required_match_the_contract(table):
    spec, doc = CONTRACT[table], documented()[table]
    want = {c: (k, True) for c, k in spec.required.items()} | {c: (k, False) for c, k in spec.optional.items()}
    pattern = {c: v for c, v in doc.items() if "<" in c}  # e.g. pred_<layer type>_ms
    if spec.optional_pattern:  # one row stands for the pattern: a float, optional, named like it
        assert list(pattern.values()) == [("float", False)]
        assert re.fullmatch(spec.optional_pattern, re.sub(r"<[^>]+>", "x", next(iter(pattern))))
    else:
        assert not pattern
    assert {c: v for c, v in doc.items() if c not in pattern} == want


def test_layer_grid_predictions_matches_the_grid_cache():
    create = re.search(r"CREATE TABLE IF NOT EXISTS \{TABLE\} \((.*?)\)\"\)", inspect.getsource(grid_cache.write_grid),
                       re.S).group(1)
    cols = re.findall(r"(\w+) (VARCHAR|BIGINT|DOUBLE|BOOLEAN)", create.replace('"', ""))
    assert grid_cache.TABLE == OUTSIDE_CONTRACT
    assert documented()[OUTSIDE_CONTRACT] == {c: (SQL_KIND[t], True) for c, t in cols}


def _row(table: str, **values) -> "pd.DataFrame":
    """One row holding every required column of `table` (1, 1.0, "x", True by kind), then `values`."""
    import pandas as pd

    fill = {"int": 1, "float": 1.0, "str": "x", "bool": True}
    row = {c: fill[k] for c, k in CONTRACT[table].required.items()} | {"device": "cpu-x-2c"} | values
    return pd.DataFrame([row])


def test_a_backward_call_time_is_positive_or_missing():
    """The embedding fit subtracts backward_call_us from backward rows: 0 or a negative time is refused."""
    from pipeline.core.errors import ContractError
    from pipeline.core.tables import validate

    validate("embedding_samples", _row("embedding_samples", backward_call_us=12.5))
    validate("embedding_samples", _row("embedding_samples", backward_call_us=float("nan")))  # forward rows
    for bad in (0.0, -3.0):
        with pytest.raises(ContractError, match=rf"backward_call_us row 0: {bad!r} is not a finite number > 0"):
            validate("embedding_samples", _row("embedding_samples", backward_call_us=bad))
