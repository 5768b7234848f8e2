"""What every ``sparkpoint`` command takes: the common options, the argument types,
opening the job's catalog, and the guard around the modules a command imports when it
runs (a missing one is a clear error, exit 1)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from airflow_sparkpoint.exceptions import CommandFailed, ConfigError, UsageError
from airflow_sparkpoint.services.stores import Catalog, open_job, s3_options

__all__ = [
    "batch_id", "common_options", "env", "generation", "open_catalog", "positive_seconds", "requires",
    "storage_options", "whole_number",
]


def env(name: str) -> str | None:
    """The environment variable `name`, stripped; None when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def positive_seconds(text: str) -> float:
    """An argparse type: seconds > 0, or a duration as Spark writes them ("5 minutes", "30s")."""
    from airflow_sparkpoint import durations

    try:  # seconds, or a duration as Spark writes them ("5 minutes", "30s")
        value = durations.parse_text(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds nor a "
                                         "duration like '5 minutes'") \
            from None
    try:
        return durations.seconds("value", value)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; expected a number of seconds > 0") from None


def whole_number(what: str, minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum`, errors naming the value and `what`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; expected a {what} >= {minimum}")
        return value

    return parse


batch_id = whole_number("batch id", 0)
generation = whole_number("generation", 1)


def common_options(*, many_jobs: bool = False) -> argparse.ArgumentParser:
    """The options every command takes; with `many_jobs`, ``--job`` may be repeated."""
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_argument_group("where the job lives")
    where.add_argument("--dir", default=env("SPARKPOINT_DIR"), metavar="URI",
                       help="storage root: a path, file:///path or s3://bucket/prefix "
                            "(default: $SPARKPOINT_DIR)")
    if many_jobs:
        where.add_argument("--job", dest="jobs", action="append", default=None, metavar="NAME",
                           help="pipeline name; repeat for several (default: $SPARKPOINT_JOB)")
    else:
        where.add_argument("--job", default=env("SPARKPOINT_JOB"), metavar="NAME",
                           help="pipeline name (default: $SPARKPOINT_JOB)")
    where.add_argument("--s3-endpoint", default=env("SPARKPOINT_S3_ENDPOINT"), metavar="URL",
                       help="S3-compatible endpoint, e.g. http://minio:9000 (default: "
                            "$SPARKPOINT_S3_ENDPOINT); "
                            "credentials come from the standard AWS environment/config")
    where.add_argument("--s3-region", default=env("SPARKPOINT_S3_REGION"), metavar="REGION",
                       help="S3 region (default: $SPARKPOINT_S3_REGION, then the AWS default)")
    output = common.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print one JSON document (shapes: docs/CLI.md)")
    output.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv for debug)")
    return common


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """The S3 endpoint and region of ``--s3-endpoint`` / ``--s3-region``, as storage options."""
    return s3_options(args.s3_endpoint, args.s3_region)


def open_catalog(args: argparse.Namespace) -> Catalog:
    """The job's catalog; fails fast on a missing root, bucket or unreachable endpoint."""
    if not args.dir:
        raise UsageError("--dir is required (or set SPARKPOINT_DIR)")
    if not args.job:
        raise UsageError("--job is required (or set SPARKPOINT_JOB)")
    return open_job(args.dir, args.job, s3_endpoint=args.s3_endpoint, s3_region=args.s3_region,
                    hint="; check --dir")


@contextmanager
def requires(command: str) -> Iterator[None]:
    """Around the imports `command` makes when it runs: a module of this package that is
    missing (an incomplete installation) or a third-party package that is not installed
    becomes a `CommandFailed` that says so.

    :raises CommandFailed: an import inside the block failed.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if not missing or missing.startswith("airflow_sparkpoint"):
            raise CommandFailed(
                f"`sparkpoint {command}` is not available in this installation: module {missing or exc} is "
                "missing (upgrade airflow-sparkpoint)"
            ) from None
        top = missing.split(".", 1)[0]
        raise CommandFailed(f"`sparkpoint {command}` needs the Python package {top!r}, which is not "
                            f"installed ({exc}); install it with: pip install {top}") from None
    except ImportError as exc:  # `from module import name`: the module lacks it
        raise CommandFailed(f"`sparkpoint {command}` is not available in this installation: {exc} (upgrade "
                            "airflow-sparkpoint)") from None
