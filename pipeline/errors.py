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


def check_dims(**dims: int) -> None:
    """Raise BadShapeError for the first dimension that is not a positive integer."""
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, (int,)) and not hasattr(value, "__index__"):
            raise BadShapeError(f"dimension {name}={value!r} is not an integer")
        if int(value) <= 0:
            raise BadShapeError(f"dimension {name}={value} must be positive")
