"""The servers of the security tests (`tests.support.servers`), up while this package runs."""

from __future__ import annotations

from tests.support.servers import package_fixtures

spark, s3_server, s3_server_process, seaweedfs_server = package_fixtures(
    "spark", "s3_server", "s3_server_process", "seaweedfs_server")
