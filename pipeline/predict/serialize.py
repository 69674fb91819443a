"""The JSON shapes predictors save themselves in, written once instead of per class.

- DataclassJSON: to_dict / from_dict of a dataclass's fields, numpy arrays as nested lists.
- records / keyed: a table keyed by tuples, {(op, dtype): {...}}, as the list of rows JSON
  can hold, [{"op": op, "dtype": dtype, ...}], and back.

The key order of what they write is the order the hand-written methods they replace used,
so a model saved before and after writes the same bytes (tests/test_registry.py checks it).
"""
from __future__ import annotations

from dataclasses import fields
from functools import cache
from typing import get_args, get_origin, get_type_hints

import numpy as np

OP_DTYPE = ("op", "dtype")  # the key of most calibrations: one fit per (op, dtype)


def _restore(hint, value):
    """value as JSON held it, back to the field's annotated type."""
    if hint is np.ndarray or (value is not None and np.ndarray in get_args(hint)):  # also `np.ndarray | None`
        return np.array(value, float)  # the grids and throughputs saved so far are all float
    if get_origin(hint) is dict:
        value_hint = get_args(hint)[1]
        return {k: _restore(value_hint, v) for k, v in value.items()}
    if hint in (int, float, bool):
        return hint(value)
    return value


@cache
def _hints(cls) -> dict:
    return get_type_hints(cls)


class DataclassJSON:
    """to_dict / from_dict for a dataclass whose fields are JSON values or numpy arrays."""

    def to_dict(self) -> dict:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in values.items()}

    @classmethod
    def from_dict(cls, d: dict):
        """Keys that are not fields (a format tag such as "version") are skipped; a field left
        out takes its default, so a file saved before the field existed still loads."""
        hints = _hints(cls)
        return cls(**{f.name: _restore(hints[f.name], d[f.name]) for f in fields(cls) if f.name in d})


def records(table: dict[tuple, dict], keys: tuple[str, ...]) -> list[dict]:
    """{(op, dtype): {...}} -> [{"op": op, "dtype": dtype, ...}]: JSON objects have no tuple keys."""
    return [{**dict(zip(keys, key)), **entry} for key, entry in table.items()]


def keyed(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, dict]:
    """The inverse of records."""
    return {tuple(row[k] for k in keys): {k: v for k, v in row.items() if k not in keys} for row in rows}
