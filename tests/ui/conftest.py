"""The UI tests' fixtures: moto in a child process and the stack of
`tests.support.ui_stack` (an Airflow API server with the Sparkpoint plugin and real
pipeline history), up while this package runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.servers import package_fixtures
from tests.support.ui_stack import Stack, start_ui_stack

(s3_server_process,) = package_fixtures("s3_server_process")


@pytest.fixture(scope="package")
def ui_stack(tmp_path_factory: pytest.TempPathFactory, s3_server_process: str) -> Iterator[Stack]:
    yield from start_ui_stack(tmp_path_factory.mktemp("ui"), s3_server_process)
