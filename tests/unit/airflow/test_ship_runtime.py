"""ship_runtime: the zipped runtime imports on a cluster with no provider install."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

pytestmark = pytest.mark.airflow


def test_runtime_zip_imports_alone_without_airflow(tmp_path):
    from airflow_sparkpoint.services.submit_dir import build_runtime_zip

    archive = build_runtime_zip()
    try:
        names = zipfile.ZipFile(archive).namelist()
        assert "airflow_sparkpoint/runtime/job.py" in names
        assert "airflow_sparkpoint/sinks/delta.py" in names
        assert (not [n for n in names
                     if n.startswith(("airflow_sparkpoint/operators", "airflow_sparkpoint/hooks"))])
        # -S: no site-packages, so neither the installed provider nor Airflow can be found.
        code = ("import sys; sys.modules['airflow'] = None\n"
                "import airflow_sparkpoint, airflow_sparkpoint.runtime, airflow_sparkpoint.sinks\n"
                "print(airflow_sparkpoint.__file__)")
        result = subprocess.run([sys.executable, "-S", "-c", code], check=False, env={"PYTHONPATH": archive},
                                capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().startswith(archive)
    finally:
        os.unlink(archive)
