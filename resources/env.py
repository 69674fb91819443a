"""The user-facing environment variables, as resource configuration.

A resource names the variables that feed its fields (its ENV: field -> variable). The code
location (pipeline/definitions.py) binds each field whose variable is set to dg.EnvVar(variable):
Dagster reads it when a run starts, the UI shows the field as that variable, and run config
still overrides it (`devchar run --profile`). A variable that is not set leaves the field's
default, the documented one: Dagster's EnvVar has no default of its own, and a bare EnvVar
fails every run where its variable is unset.

Dagster has no float source: a numeric knob given as a variable is a `str` field, read as a
number by the resource (number(): one error naming the field and the variable).
"""
from __future__ import annotations

import os
from typing import TypeVar

import dagster as dg

from pipeline.core.errors import DevcharError

R = TypeVar("R", bound=dg.ConfigurableResource)


def env_fields(resource: type[dg.ConfigurableResource]) -> dict[str, dg.EnvVar]:
    """{field: dg.EnvVar(variable)} for each of the resource's variables that is set now."""
    return {field: dg.EnvVar(var) for field, var in getattr(resource, "ENV", {}).items() if var in os.environ}


def from_env(resource: type[R], **config) -> R:
    """The resource as the code location configures it: its variables where set, then `config`."""
    return resource(**{**env_fields(resource), **config})


def resolved(resource: type[R], **config) -> R:
    """from_env() with every EnvVar read now: the resource outside a Dagster run (the CLI)."""
    return from_env(resource, **config).process_config_and_initialize()


def as_text(value):
    """A field validator (mode="before") for those str fields: a number given in code is taken
    as its text, QualityGates(max_noisy_share=0.3) as "0.3"; an EnvVar is a str already."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def number(resource: dg.ConfigurableResource, field: str) -> float:
    """A numeric str field as a float; a value that is not a number is one error naming its source."""
    value = getattr(resource, field)
    try:
        return float(value)
    except (TypeError, ValueError):
        var = getattr(type(resource), "ENV", {}).get(field)
        source = f"{type(resource).__name__}.{field}" + (f" (${var})" if var else "")
        raise DevcharError(f"{source} must be a number; got {value!r}") from None
