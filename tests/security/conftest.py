"""The servers of the security tests (`tests.servers`), up while this package runs."""

from __future__ import annotations

from tests.servers import package_fixtures

spark, s3_server, seaweedfs_server = package_fixtures("spark", "s3_server", "seaweedfs_server")
