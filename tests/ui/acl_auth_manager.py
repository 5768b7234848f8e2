"""An auth manager for the UI tests: Airflow's SimpleAuthManager, except that DAGs named in
``SPARKPOINT_TEST_DENIED_DAGS`` (comma-separated) are not readable by non-admin users.

SimpleAuthManager grants DAG access by role only (a viewer reads every DAG); a per-DAG
denial is what a real deployment's auth manager (FAB, Keycloak) expresses, and what the
plugin must honour through the same ``is_authorized_dag`` call.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager


class DagAclAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None,
                          details: Any = None) -> bool:
        denied = {d for d in os.environ.get("SPARKPOINT_TEST_DENIED_DAGS", "").split(",") if d}
        if details is not None and details.id in denied and not self._is_admin(user):
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity,
                                         details=details)
