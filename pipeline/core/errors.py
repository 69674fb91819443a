"""One exception family, so callers (CLI, assets) can show a single clear line."""


class DevcharError(Exception):
    """Base class: the message names the offending value."""


class BadShapeError(DevcharError, ValueError):
    pass


class UnknownDtypeError(DevcharError, ValueError):
    pass


class UnknownDeviceError(DevcharError, LookupError):
    pass


class MissingModelError(DevcharError, FileNotFoundError):
    pass


def check_positive_arrays(**dims) -> list:
    """Scalars or arrays of dimensions, broadcast together; BadShapeError naming the first
    dimension holding a non-positive value, and that value."""
    import numpy as np

    arrs = np.broadcast_arrays(*(np.asarray(v) for v in dims.values()))
    for name, a in zip(dims, arrs):
        if a.size and (a <= 0).any():
            raise BadShapeError(f"dimension {name} must be positive; got {a[a <= 0].ravel()[0]}")
    return arrs


def check_dims(**dims: int) -> None:
    """Raise BadShapeError for the first dimension that is not a positive integer."""
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, (int,)) and not hasattr(value, "__index__"):
            raise BadShapeError(f"dimension {name}={value!r} is not an integer")
        if int(value) <= 0:
            raise BadShapeError(f"dimension {name}={value} must be positive")


class BadSlugError(DevcharError, ValueError):
    """A device slug or partition key that may not name a path."""


class ContractError(DevcharError, ValueError):
    """Rows that do not fit the table contract (pipeline/core/tables.py)."""


class BadConfigError(DevcharError, ValueError):
    """A --hf-config or --module that cannot be read, imported, built or run here."""


class WarehouseLockedError(DevcharError):
    """Another process holds DuckDB's write lock on the warehouse file."""
