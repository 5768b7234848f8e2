"""The server of the unit tests (moto in this process, `tests.support.servers`), up while this
package runs."""

from __future__ import annotations

from tests.support.servers import package_fixtures

(s3_server,) = package_fixtures("s3_server")
