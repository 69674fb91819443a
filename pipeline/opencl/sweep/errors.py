"""Errors of the OpenCL launch dataset, in the DevcharError family (parse errors: clang_ast.KernelParseError)."""
from pipeline.core.errors import DevcharError


class UnsupportedArgError(DevcharError, ValueError):
    """A kernel argument type the sweep cannot allocate or pass (named in the message)."""


class NoValidArgumentsError(DevcharError, ValueError):
    """Algorithm 1 found no scalar combination whose probes ran in bounds (the row's status is invalid_args)."""
