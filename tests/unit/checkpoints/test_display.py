"""One format for times and sizes (`checkpoints.display`), used by the CLI, the UI page,
the demo, control messages and the triggers."""

from __future__ import annotations

import pytest

from airflow_sparkpoint.checkpoints.display import iso, size


@pytest.mark.parametrize(("n", "shown"), [
    (None, "-"), (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (3 * 1024**2, "3.0 MiB"),
    (2 * 1024**3, "2.0 GiB"), (5 * 1024**4, "5.0 TiB"), (2048 * 1024**4, "2048.0 TiB"),
])
def test_sizes(n: int | None, shown: str) -> None:
    assert size(n) == shown


def test_times_are_utc_to_the_second() -> None:
    assert iso(1_700_000_000.9) == "2023-11-14T22:13:20Z"
    assert iso(None) is None
