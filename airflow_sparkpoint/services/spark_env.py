"""The one rule for a worker's own Spark: ``SPARK_HOME`` and the driver's Python come
only from a PySpark that carries a Spark distribution (pip's ``pyspark``: its
``bin/spark-submit`` and jars), never from the Spark provider's ``pyspark-client``
(the Spark Connect client, a ``pyspark`` package with neither); and which Python
Spark's workers run. Used by the submit operator and the demo. No Airflow.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_sparkpoint.services.submit import path_with_local_spark
from airflow_sparkpoint.services.submit_dir import ROCKSDB_LIBRARY_DIR_ENV

__all__ = ["cluster_submit_environment", "local_spark_environment", "local_spark_home", "spark_environment"]

log = logging.getLogger(__name__)


def local_spark_home() -> str | None:
    """The Spark distribution that this interpreter's PySpark carries (pip's ``pyspark``
    has ``bin/spark-submit`` and the jars), or None: no pyspark, or only the Spark
    provider's ``pyspark-client`` (the Spark Connect client: a ``pyspark`` package with
    neither), which can run no driver and is no ``SPARK_HOME``."""
    try:
        import pyspark
    except ImportError:
        return None
    home = Path(pyspark.__file__ or "/nonexistent").parent  # None for a namespace package
    return str(home) if (home / "bin" / "spark-submit").is_file() else None


def spark_environment(
    current: Mapping[str, str],
    conf: Mapping[str, Any],
    master: str,
    *,
    native_dir: str | None = None,
    pyspark_python: str | None = None,
    pyspark_python_from: str = "the connection",
) -> dict[str, str]:
    """spark-submit's environment additions to `current` (the worker's environment with
    the task's own variables): this interpreter's Spark when no Spark install is
    configured, the Python interpreters, and `native_dir` as the driver's RocksDB library
    directory unless one is set (`services.submit_dir`).

    The driver runs here (client mode): ``PYSPARK_DRIVER_PYTHON`` defaults to this
    interpreter when it has a PySpark with its Spark distribution (`local_spark_home`);
    an Airflow worker without one (no pyspark, or the Spark provider's pyspark-client)
    leaves it to Spark, which then runs the driver with ``PYSPARK_PYTHON``. Spark's
    Python workers run ``spark.pyspark.python`` (`conf`) or ``PYSPARK_PYTHON``
    (`current`) when given; else `pyspark_python` (a connection's: `pyspark_python_from`
    names it in the log); else this
    interpreter for a ``local[...]`` `master` (same machine) when it has that PySpark,
    and ``python3`` (Spark's own default) otherwise, as on a cluster, where this
    worker's interpreter path means nothing.
    """
    env: dict[str, str] = {}
    if native_dir and not current.get(ROCKSDB_LIBRARY_DIR_ENV):
        env[ROCKSDB_LIBRARY_DIR_ENV] = native_dir
    spark_here = local_spark_home()
    env.update(cluster_submit_environment(current))  # where Spark is on this worker
    if not current.get("PYSPARK_DRIVER_PYTHON") and not conf.get("spark.pyspark.driver.python"):
        if spark_here:
            env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        else:
            log.info("this worker's Python %s has no PySpark to run the driver: Spark runs it with "
                     "spark.pyspark.python / PYSPARK_PYTHON", sys.executable)
    if conf.get("spark.pyspark.python") or current.get("PYSPARK_PYTHON"):
        return env
    local = master.strip().lower().startswith("local") and spark_here is not None
    env["PYSPARK_PYTHON"] = pyspark_python or (sys.executable if local else "python3")
    log.info("Spark's Python workers run %s (%s)", env["PYSPARK_PYTHON"],
             pyspark_python_from if pyspark_python
             else "this interpreter: local master" if local else "Spark's default; set "
             "spark.pyspark.python, PYSPARK_PYTHON or the connection's Python field for your cluster")
    return env


def cluster_submit_environment(current: Mapping[str, str]) -> dict[str, str]:
    """A cluster-mode spark-submit's own environment additions to `current`: only where
    Spark is on this worker (``SPARK_HOME``, ``PATH``), as for client mode. Nothing of this
    worker's Python (``PYSPARK_PYTHON``, ``PYSPARK_DRIVER_PYTHON``) nor its RocksDB
    directory: the driver runs on the cluster, where those paths mean nothing (Spark on
    YARN would pass the interpreter paths on to the application master)."""
    env: dict[str, str] = {}
    spark_here = local_spark_home()
    if not current.get("SPARK_HOME") and spark_here:
        env["SPARK_HOME"] = spark_here
    path = path_with_local_spark(current)
    if path is not None:
        env["PATH"] = path
    return env


def local_spark_environment(base: Mapping[str, str]) -> dict[str, str]:
    """`base` plus what a local ``spark-submit`` of this interpreter needs (the demo's
    jobs): this interpreter for the driver and the workers, its PySpark's ``SPARK_HOME``
    (`local_spark_home`) and its ``bin/`` first on PATH.

    :raises RuntimeError: this interpreter's PySpark carries no Spark distribution.
    """
    home = local_spark_home()
    if home is None:
        raise RuntimeError(f"this Python ({sys.executable}) has no PySpark with a Spark "
                           "distribution (pip install "
                           "pyspark; the Spark provider's pyspark-client runs no driver)")
    bindir = str(Path(sys.executable).parent)
    return {
        **base,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_HOME": home,
        "PATH": bindir + os.pathsep + base.get("PATH", os.defpath),
    }
