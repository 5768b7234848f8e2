"""``spark-submit`` in tests: the venv's own, with the environment a local run needs."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from airflow_sparkpoint.demo.support import spark_submit_env

#: log4j settings of a quiet test driver: warnings only, to stderr
QUIET_LOG4J = Path(__file__).resolve().parent / "log4j2.properties"


def quiet_java_opts(log4j: Path = QUIET_LOG4J) -> str:
    """``spark.driver.extraJavaOptions`` of a short-lived test driver: a C1-only JIT (it
    spends most of its time compiling otherwise), a serial GC and the `log4j` settings."""
    return f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m -Dlog4j2.configurationFile=file:{log4j}"


def submit_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus `extra`, with what a local ``spark-submit`` of
    this venv needs (`spark_submit_env`: its Python, pyspark's SPARK_HOME, its bin/ on PATH)."""
    return spark_submit_env({**os.environ, **(extra or {})})


def spark_submit_command(script: Path | str, conf: Mapping[str, str], args: Sequence[str], *,
                         env: Mapping[str, str],
                         master: str = "local[2]", options: Sequence[str] = ()) -> list[str]:
    """The command line: the ``spark-submit`` on `env`'s PATH, ``--master``, `options`,
    a ``--conf`` per entry of `conf`, then `script` and its `args`."""
    binary = shutil.which("spark-submit", path=env["PATH"])
    assert binary, "spark-submit not found next to the interpreter"
    cmd = [binary, "--master", master, *options]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, str(script), *args]


def start_spark_submit(cmd: Sequence[str], *, env: Mapping[str, str], log: Path,
                       append: bool = True) -> subprocess.Popen[bytes]:
    """Start `cmd` in its own process group (as an Airflow task's: a signal to the group
    reaches the driver), its output in `log` (appended to, unless not `append`)."""
    with open(log, "ab" if append else "wb") as out:
        return subprocess.Popen(list(cmd), env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
