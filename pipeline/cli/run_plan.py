"""Which assets a `devchar run` materializes: all of them for this machine, what a committed
reference calibration's tables allow for a slug (reference_plan), less what --skip leaves out."""
from __future__ import annotations

from pipeline.cli.common import warehouse
from pipeline.core.errors import DevcharError

LOCAL_KINDS = ("auto", "cpu", "cuda")


def reference_plan(slug: str):
    """(slug, asset keys) for a run from a committed calibration: every asset whose sweep's
    tables the calibration holds, and what depends only on those."""
    from pipeline.definitions import defs
    from pipeline.orchestration.jobs import selection_without
    from pipeline.runner import SWEEPS, tables_of
    from resources.devices import committed_references, reference_tables

    known = committed_references()
    if slug not in known:
        raise DevcharError(f"--device {slug!r} is neither a local kind ({', '.join(LOCAL_KINDS)}) nor a committed "
                           f"reference calibration under models_store/reference/; committed: {known or 'none'}")
    have = reference_tables(slug)
    missing = {sweep for sweep in SWEEPS if not set(tables_of(sweep)) <= have}
    keys = selection_without(missing).resolve(defs.resolve_asset_graph())
    if missing:
        print(f"devchar: {slug}: no {', '.join(sorted(SWEEPS[s] for s in missing))} in its calibration: "
              "those assets and their dependents are skipped", flush=True)
    return slug, sorted(keys, key=lambda k: k.path)


def skipping(selection: list | None, skip: list[str], expected: list[str] = ()) -> list:
    """The run's asset keys (None: all of them) without the `skip` assets and what depends on
    them (devchar run --skip); an unknown name is one error listing the assets, and so is a
    check in `expected` (--expect-failing) of a skipped asset."""
    import dagster as dg

    from pipeline.definitions import defs

    graph = defs.resolve_asset_graph()
    known = sorted(k.to_user_string() for k in graph.materializable_asset_keys)
    unknown = [name for name in skip if name not in known]
    if unknown:
        raise DevcharError(f"--skip {unknown[0]!r}: no such asset; the assets: {', '.join(known)}")
    skipped_checks = sorted(c for c in expected if c.split(".")[0] in skip)
    if skipped_checks:  # a skipped asset's check cannot fail, so "expected to fail" would read as fixed
        raise DevcharError(f"--expect-failing {skipped_checks[0]} names a check of an asset --skip leaves out; "
                           "drop one of the two")
    base = dg.AssetSelection.assets(*selection) if selection is not None else dg.AssetSelection.all()
    left_out = dg.AssetSelection.assets(*skip).downstream()
    keys = (base - left_out).resolve(graph)
    gone = sorted(k.to_user_string() for k in left_out.resolve(graph) & base.resolve(graph))
    print(f"devchar: skipping {', '.join(gone)}" if gone else
          f"devchar: --skip {', '.join(skip)}: not in this run, nothing to skip", flush=True)
    return sorted(keys, key=lambda k: k.path)


def load_reference_only_tables(slug: str) -> None:
    """Tables no asset fills (the peer shapes timed there) go straight to the warehouse."""
    from resources.devices import read_rows, reference_file

    path = reference_file(slug, "reference_timings")
    if path is not None:
        rows = read_rows(path).assign(device=slug)
        warehouse().replace_partition("reference_timings", slug, rows)
        print(f"devchar: reference_timings: {len(rows)} rows for {slug}")
