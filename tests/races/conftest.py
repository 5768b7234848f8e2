"""Race-test fixtures: every driver a test starts is SIGKILLed when the test ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.race_drivers import Driver
from tests.support.servers import package_fixtures

spark, s3_server_process = package_fixtures("spark", "s3_server_process")


@pytest.fixture()
def start_driver(tmp_path: Path) -> Iterator[Any]:
    started: list[Driver] = []

    def start(name: str, conf: dict[str, str], args: list[str], **kw: Any) -> Driver:
        driver = Driver(name, tmp_path, conf, args, **kw)
        started.append(driver)
        return driver

    yield start
    for driver in started:
        driver.stop()
