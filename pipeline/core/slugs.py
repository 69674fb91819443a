"""Device slugs (Dagster partition keys) name directories: plots/<slug>/, models_store/<slug>/,
models_store/reference/<slug>/. They are checked once where they come in (CLI and runner
arguments, partition keys, loaded files), and every path built from them is resolved and
kept under its root, so `../../x` or an absolute path can never reach outside it.
"""
from __future__ import annotations

import re
from pathlib import Path

from pipeline.core.errors import BadSlugError

SLUG = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
DEVICE_KEYWORDS = ("auto", "cpu", "cuda")  # what `--device` also accepts: the local device by kind


def check_slug(value, what: str = "device") -> str:
    """`value` if it is a valid slug (lower-case letters, digits, '.', '_', '-'; at most 128
    characters, starting with a letter or digit, no '..'); BadSlugError naming it otherwise."""
    if not isinstance(value, str) or not SLUG.fullmatch(value) or ".." in value:
        raise BadSlugError(f"{what} {value!r} is not a valid slug: expected 1-128 of a-z 0-9 . _ - "
                           "starting with a letter or digit, without '..'")
    return value


def device_arg(value: str) -> str:
    """argparse `type` for a `--device` option: auto, cpu, cuda or a valid slug."""
    import argparse

    if value in DEVICE_KEYWORDS:
        return value
    try:
        return check_slug(value)
    except BadSlugError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def under(root: str | Path, *parts: str) -> Path:
    """root/part/..., resolved; BadSlugError unless each part is one plain name and the result
    stays inside root (a symlink pointing out of root is refused too)."""
    base = Path(root).resolve()
    for part in parts:
        if not isinstance(part, str) or part in ("", ".", "..") or "/" in part or "\\" in part or "\0" in part:
            raise BadSlugError(f"path component {part!r} is not a plain name (under {base})")
    path = base.joinpath(*parts).resolve()
    if not path.is_relative_to(base):
        raise BadSlugError(f"{path} is outside {base}")
    return path
