"""``python -m airflow_sparkpoint.cli``: the ``sparkpoint`` command."""

from __future__ import annotations

import sys

from airflow_sparkpoint.cli.main import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
