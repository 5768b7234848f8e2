"""`spark.sparkpoint.*` configuration: parsed and validated before anything is written.

Pure Python (no Spark), so the Airflow operator validates the same way the job does.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_sparkpoint import durations
from airflow_sparkpoint.checkpoints.control_records import REQUEST_ID_RE
from airflow_sparkpoint.checkpoints.layout import validate_job_name
from airflow_sparkpoint.exceptions import ConfigError, InvalidPath
from airflow_sparkpoint.sinks.base import DRIVER_STAGING_MAX_BYTES
from airflow_sparkpoint.storage import split_uri
from airflow_sparkpoint.storage.endpoints import s3_options, validate_endpoint_url

__all__ = ["FINAL_SNAPSHOT_MIN_REPLAY", "KEYS", "LIVE_LOCATIONS", "PREFIX", "SUBMITTER_ENV",
           "Shadow", "SparkpointConfig", "Trigger",
           "duration_value", "local_path_of", "parse_duration", "parse_size",
           "parse_trigger", "require_local", "unknown_key", "work_root"]

PREFIX = "spark.sparkpoint."
#: environment variable naming the submit (an Airflow task try) that started a driver;
#: the driver records it with its generation claim
SUBMITTER_ENV = "SPARKPOINT_SUBMITTER"
#: a restart replays changelogs at tens of MB/s: below this, waiting for a snapshot at the
#: job's end costs more than it saves
FINAL_SNAPSHOT_MIN_REPLAY = 16 * 1024 * 1024

KEYS: dict[str, str] = {
    "dir": "storage root: file:///..., a plain path, or s3://bucket/prefix (required)",
    "job": "pipeline name (required)",
    "workDir": "Spark's live checkpoint location (default <dir>/<job>/live for Hadoop-writable dirs)",
    "restore": "latest, none, or a savepoint/checkpoint path (default latest)",
    "takeover": (
        "true to start although a run that another Airflow task (or a manual start) began is live: "
        "it is fenced (default false: such a start is refused)"
    ),
    "cutover": (
        "the id of the open zero-downtime cutover this start belongs to (green's): such a start passes "
        "the rule that refuses every start while a cutover is open (default: none)"
    ),
    "restore.force": "true to start with empty state although the job has checkpoints (default false)",
    "restore.allowForeignJob": "true to restore a snapshot of another job (default false)",
    "restore.sinkAhead": "fail or rewind: what to do when a sink committed past the snapshot (default fail)",
    "restore.statePartitions": "restore into this many state partitions instead of the snapshot's (rescale)",
    "codeVersion": (
        "the version of the job's code, recorded with every commit: committed batches "
        "are replayed only by the "
        "version that committed them (default: none; set it on every deploy that "
        "changes what the job computes)"
    ),
    "trigger": "availableNow or processingTime:<interval> (default availableNow)",
    "checkpoint.interval": "min time between retained checkpoints, 0 = every batch (default 0)",
    "checkpoint.numRetained": "completed checkpoints kept (default 3)",
    "checkpoint.timeout": "a checkpoint slower than this is abandoned (default 10min)",
    "checkpoint.tolerableFailures": "consecutive failed checkpoints before the job fails (default 0)",
    "checkpoint.finalSnapshot.timeout": (
        "at the job's end, how long to wait for the RocksDB snapshot Spark's maintenance uploads "
        "after the last commits, to checkpoint again with it; 0 = never wait "
        "(default: Spark's stateStore.maintenanceInterval + 30s)"
    ),
    "checkpoint.finalSnapshot.minReplay": (
        "wait for that snapshot only when a restart would otherwise replay at least this many "
        "bytes of changelog (default 16m)"
    ),
    "commit.mode": "checkpoint or external (default checkpoint)",
    "control.pollInterval": "how often the job looks for savepoint/stop requests (default 2s)",
    "stateStore": "rocksdb or hdfs (default rocksdb)",
    "delta.driverStagingMaxBytes": (
        "DeltaSink batches Spark estimates at most this large are written from the driver, "
        "larger or unknown ones by the executors; 0 = always the executors (default 32m)"
    ),
    "s3.endpoint": "S3-compatible endpoint URL (default: AWS)",
    "s3.region": "S3 region (default: AWS default chain)",
    "shadow.mode": (
        "discard or compare: run as blue's shadow (zero-downtime blue-green, runtime.follow): restore "
        "blue's checkpoint and replay blue's recorded batches, writing nothing into blue's sinks "
        "(default: unset, a normal run)"
    ),
    "shadow.dir": "the shadow's own storage root (its scratch catalog; required with shadow.mode)",
    "shadow.job": "the shadow's job name in shadow.dir (default <job>-shadow)",
    "shadow.from": "blue's checkpoint the warm-up starts from: latest or a checkpoint path (default latest)",
    "shadow.workDir": "the shadow's live location root (default <shadow.dir>/<shadow.job>/live)",
    "shadow.untilBatch": (
        "stop following after this batch of blue (default: when blue ended and all it recorded is replayed)"
    ),
    "shadow.pollInterval": "how often the shadow looks for blue's next batch (default 1s)",
    "test.pauseAt": "TESTS ONLY: pause points <point>[:<batch>],... (see airflow_sparkpoint.faults)",
    "test.pauseDir": "TESTS ONLY: directory of the pause points' .reached/.release files",
}


def unknown_key(short: str) -> ConfigError:
    """The error for ``spark.sparkpoint.<short>``, which is not in `KEYS`: the closest known
    key as "did you mean" (case-insensitive), else every known key."""
    by_lower = {key.lower(): key for key in KEYS}
    close = difflib.get_close_matches(short.lower(), list(by_lower), n=1, cutoff=0.75)
    hint = (f"did you mean {PREFIX}{by_lower[close[0]]}?" if close
            else f"known settings: {', '.join(PREFIX + k for k in KEYS)}")
    return ConfigError(f"{PREFIX}{short} is not a known setting; {hint} (docs/reference/config.md)")


def parse_duration(key: str, value: str) -> float:
    """Parse the duration of conf key `key` in seconds (`airflow_sparkpoint.durations`
    reads it: a bare number, ``500ms``, ``2s``, ``10min``, Spark's ``5 seconds``, ...).

    :raises ConfigError: naming the key, the value and the accepted forms.
    """
    try:
        return durations.parse_text(value)
    except ValueError as exc:
        raise ConfigError(f"{PREFIX}{key}={value!r} {exc}") from None


def duration_value(name: str, value: Any) -> Any:
    """`value` with a duration string turned into seconds; numbers, timedeltas and None
    pass through unchanged (`airflow_sparkpoint.durations` checks them).

    :raises ConfigError: a string that is not a duration (the message names `name`).
    """
    if isinstance(value, str):
        try:
            return durations.parse_text(value)
        except ValueError as exc:
            raise ConfigError(f"{name}={value!r} {exc}") from None
    return value


def _parse_int(key: str, value: str, minimum: int) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{PREFIX}{key}={value!r} is not an integer; "
                          f"expected an integer >= {minimum}") from None
    if number < minimum:
        raise ConfigError(f"{PREFIX}{key}={value!r} is too small; expected an integer >= {minimum}")
    return number


_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(key: str, value: str) -> int:
    """Parse bytes: ``0``, ``1048576``, ``512k``, ``32m``, ``1g`` (binary units, as Spark).

    :raises ConfigError: naming the key, the value and the accepted forms.
    """
    match = _SIZE_RE.match(str(value))
    if not match:
        raise ConfigError(f"{PREFIX}{key}={value!r} is not a size; expected bytes or e.g. "
                          "'0', '512k', '32m', '1g'")
    return int(match.group(1)) * 1024 ** "_kmgt".index((match.group(2) or "_").lower())


def _parse_bool(key: str, value: str) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"{PREFIX}{key}={value!r} is not a boolean; expected true or false")


def _code_version(value: str) -> str | None:
    """`codeVersion`: None when empty.

    :raises ConfigError: longer than 128 characters or not printable.
    """
    text = value.strip()
    if len(text) > 128 or not text.isprintable():
        raise ConfigError(f"{PREFIX}codeVersion={value!r} is invalid; expected up to "
                          "128 printable characters "
                          "(a release tag or commit hash)")
    return text or None


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> str:
    for option in allowed:
        if str(value).strip().lower() == option.lower():
            return option
    raise ConfigError(f"{PREFIX}{key}={value!r} is not allowed; expected one of: {', '.join(allowed)}")


@dataclass(frozen=True)
class Trigger:
    """``availableNow`` (drain then finish) or ``processingTime`` every `interval_s`."""

    kind: str
    interval_s: float = 0.0

    def spark_kwargs(self) -> dict[str, Any]:
        if self.kind == "availableNow":
            return {"availableNow": True}
        return {"processingTime": f"{int(self.interval_s * 1000)} milliseconds"}

    def __str__(self) -> str:
        return "availableNow" if self.kind == "availableNow" else f"processingTime:{self.interval_s:g}s"


def parse_trigger(value: str) -> Trigger:
    """:raises ConfigError: not ``availableNow`` nor ``processingTime:<interval>``."""
    text = str(value).strip()
    if text.lower() == "availablenow":
        return Trigger("availableNow")
    if text.lower().startswith("processingtime:"):
        interval = parse_duration("trigger", text.split(":", 1)[1])
        if interval <= 0:
            raise ConfigError(f"{PREFIX}trigger={value!r} needs a positive interval, e.g. processingTime:10s")
        return Trigger("processingTime", interval)
    raise ConfigError(f"{PREFIX}trigger={value!r} is not allowed; expected availableNow or "
                      "processingTime:<interval>")


#: what a live location may be, in messages
LIVE_LOCATIONS = (
    "a local path or file:// URI that the driver and every executor see at the same path "
    "(local disk in local mode; a shared mount such as NFS or EFS on a cluster)"
)


def local_path_of(location: str) -> str | None:
    """The local filesystem path of a Hadoop location, or None when it is not local."""
    if location.startswith("file://"):
        return location[len("file://"):] or "/"
    if location.startswith("file:/"):
        return location[len("file:"):]
    if "://" not in location:
        return os.path.abspath(location)
    return None


def require_local(location: str) -> str:
    """The rule for a live location (``spark.sparkpoint.workDir``), shared by the operator
    (before spark-submit) and the runtime: the runtime captures Spark's live checkpoint by
    reading its files, so it must be a filesystem path. Hadoop-only schemes (hdfs://,
    s3a://, abfs://, gs://, ...) are refused: their files cannot be read from Python here.

    :raises ConfigError: `location` is not a local filesystem path.
    """
    path = local_path_of(location)
    if path is None:
        scheme = location.split("://", 1)[0]
        raise ConfigError(
            f"{PREFIX}workDir={location!r}: the runtime cannot capture a live checkpoint from a "
            f"{scheme}:// location; expected {LIVE_LOCATIONS}. Retained checkpoints and savepoints "
            f"still go to {PREFIX}dir (s3:// works there)"
        )
    return path


def work_root(dir: str, job: str, work_dir: str | None) -> str:
    """The local path of the live location's root: `work_dir`, else ``<dir>/<job>/live``.

    :raises ConfigError: `work_dir` is not a filesystem path (`require_local`), or it is
        missing while `dir` is on S3.
    """
    if work_dir is not None:
        return require_local(work_dir)
    if split_uri(dir)[0] == "s3":
        raise ConfigError(
            f"{PREFIX}workDir is required when {PREFIX}dir={dir!r} is on S3 (Spark's live checkpoint "
            f"needs a filesystem path: {LIVE_LOCATIONS})"
        )
    return os.path.join(require_local(dir), job, "live")


@dataclass(frozen=True)
class SparkpointConfig:
    """Validated `spark.sparkpoint.*` settings."""

    dir: str
    job: str
    work_dir: str | None = None
    restore: str = "latest"
    restore_force: bool = False
    takeover: bool = False
    #: the open cutover this start is green's (`runtime.takeover.check_start`)
    cutover: str | None = None
    restore_allow_foreign_job: bool = False
    restore_sink_ahead: str = "fail"
    #: recorded with each commit's replay record; a replay needs the same (`runtime.replay`)
    code_version: str | None = None
    trigger: Trigger = field(default_factory=lambda: Trigger("availableNow"))
    checkpoint_interval_s: float = 0.0
    num_retained: int = 3
    checkpoint_timeout_s: float = 600.0
    tolerable_failures: int = 0
    #: None: Spark's maintenance interval + 30 s (`runtime.job`)
    final_snapshot_timeout_s: float | None = None
    final_snapshot_min_replay: int = FINAL_SNAPSHOT_MIN_REPLAY
    commit_mode: str = "checkpoint"
    poll_interval_s: float = 2.0
    state_store: str = "rocksdb"
    s3_endpoint: str | None = None
    s3_region: str | None = None
    driver_staging_max_bytes: int = DRIVER_STAGING_MAX_BYTES
    #: None: restore into the snapshot's own number of state partitions
    restore_state_partitions: int | None = None
    test_pause_at: str = ""
    test_pause_dir: str = ""
    #: None: a normal run; else the run follows blue as its shadow (`runtime.follow`)
    shadow: Shadow | None = None

    @property
    def storage_options(self) -> dict[str, Any]:
        """Options for `open_storage` and sinks; credentials come from the environment."""
        return s3_options(self.s3_endpoint, self.s3_region)

    @property
    def dir_is_s3(self) -> bool:
        return split_uri(self.dir)[0] == "s3"

    @classmethod
    def from_conf(cls, conf: Mapping[str, str]) -> SparkpointConfig:
        """Build from a Spark conf mapping (keys with or without the ``spark.sparkpoint.`` prefix).

        :raises ConfigError: an unknown key, a missing required key or a bad value; the
            message names the key, the value and what is allowed.
        """
        values: dict[str, str] = {}
        for key, value in conf.items():
            short = key.removeprefix(PREFIX)
            if key.startswith(PREFIX) or short in KEYS:
                if short not in KEYS:
                    raise unknown_key(short)
                values[short] = str(value)
        for required in ("dir", "job"):
            if not values.get(required, "").strip():
                raise ConfigError(f"{PREFIX}{required} is required ({KEYS[required]})")
        try:
            split_uri(values["dir"])
        except InvalidPath as exc:
            raise ConfigError(f"{PREFIX}dir={values['dir']!r} is invalid: {exc}") from None
        job = validate_job_name(values["job"].strip())
        restore = values.get("restore", "latest").strip()
        if not restore:
            raise ConfigError(f"{PREFIX}restore='' is empty; expected latest, none, or a "
                              "savepoint/checkpoint path")
        if restore.lower() in ("latest", "none"):
            restore = restore.lower()
        else:
            try:
                split_uri(restore)
            except InvalidPath as exc:
                raise ConfigError(f"{PREFIX}restore={restore!r} is invalid: {exc}") from None
        work_dir = values.get("workDir", "").strip() or None
        work_root(values["dir"].strip(), job, work_dir)
        interval = parse_duration("checkpoint.interval", values.get("checkpoint.interval", "0"))
        timeout = parse_duration("checkpoint.timeout", values.get("checkpoint.timeout", "10min"))
        if timeout <= 0:
            raise ConfigError(f"{PREFIX}checkpoint.timeout={values['checkpoint.timeout']!r} must be positive")
        poll = parse_duration("control.pollInterval", values.get("control.pollInterval", "2s"))
        if poll <= 0:
            raise ConfigError(f"{PREFIX}control.pollInterval={values['control.pollInterval']!r} must be "
                              "positive")
        endpoint = values.get("s3.endpoint", "").strip() or None
        if endpoint is not None:
            endpoint = validate_endpoint_url(endpoint, f"{PREFIX}s3.endpoint")
        state_partitions = values.get("restore.statePartitions", "").strip()
        final_wait = values.get("checkpoint.finalSnapshot.timeout", "").strip()
        pause_at = values.get("test.pauseAt", "").strip()
        pause_dir = values.get("test.pauseDir", "").strip()
        if pause_at and not pause_dir:
            raise ConfigError(f"{PREFIX}test.pauseAt={pause_at!r} needs {PREFIX}test.pauseDir (a directory)")
        return cls(
            dir=values["dir"].strip(),
            job=job,
            work_dir=work_dir,
            restore=restore,
            restore_force=_parse_bool("restore.force", values.get("restore.force", "false")),
            takeover=_parse_bool("takeover", values.get("takeover", "false")),
            cutover=_cutover_id(values.get("cutover", "").strip()),
            restore_allow_foreign_job=_parse_bool(
                "restore.allowForeignJob", values.get("restore.allowForeignJob", "false")
            ),
            restore_sink_ahead=_choice("restore.sinkAhead", values.get("restore.sinkAhead", "fail"),
                                       ("fail", "rewind")),
            code_version=_code_version(values.get("codeVersion", "")),
            trigger=parse_trigger(values.get("trigger", "availableNow")),
            checkpoint_interval_s=interval,
            num_retained=_parse_int("checkpoint.numRetained", values.get("checkpoint.numRetained", "3"), 1),
            checkpoint_timeout_s=timeout,
            tolerable_failures=_parse_int(
                "checkpoint.tolerableFailures", values.get("checkpoint.tolerableFailures", "0"), 0
            ),
            final_snapshot_timeout_s=(
                parse_duration("checkpoint.finalSnapshot.timeout", final_wait) if final_wait else None
            ),
            final_snapshot_min_replay=parse_size(
                "checkpoint.finalSnapshot.minReplay",
                values.get("checkpoint.finalSnapshot.minReplay", str(FINAL_SNAPSHOT_MIN_REPLAY)),
            ),
            commit_mode=_choice("commit.mode", values.get("commit.mode", "checkpoint"),
                                ("checkpoint", "external")),
            poll_interval_s=poll,
            state_store=_choice("stateStore", values.get("stateStore", "rocksdb"), ("rocksdb", "hdfs")),
            s3_endpoint=endpoint,
            s3_region=values.get("s3.region", "").strip() or None,
            driver_staging_max_bytes=parse_size(
                "delta.driverStagingMaxBytes",
                values.get("delta.driverStagingMaxBytes", str(DRIVER_STAGING_MAX_BYTES))
            ),
            restore_state_partitions=(
                _parse_int("restore.statePartitions", state_partitions, 1) if state_partitions else None
            ),
            test_pause_at=pause_at,
            test_pause_dir=pause_dir,
            shadow=_shadow(values, job),
        )


@dataclass(frozen=True)
class Shadow:
    """``spark.sparkpoint.shadow.*``: follow blue's job as its shadow (`runtime.follow`)."""

    mode: str
    dir: str
    job: str
    source: str = "latest"  # ``shadow.from``
    work_dir: str | None = None
    until_batch: int | None = None
    poll_interval_s: float = 1.0


def _shadow(values: Mapping[str, str], job: str) -> Shadow | None:
    """The shadow settings, or None when ``shadow.mode`` is unset.

    :raises ConfigError: a ``shadow.*`` key without ``shadow.mode``, or a bad value."""
    given = sorted(k for k in values if k.startswith("shadow."))
    mode = values.get("shadow.mode", "").strip()
    if not mode:
        if given:
            raise ConfigError(f"{PREFIX}{given[0]} is set but {PREFIX}shadow.mode is not; expected "
                              "shadow.mode=discard or compare to run as a shadow")
        return None
    mode = _choice("shadow.mode", mode, ("discard", "compare"))
    root = values.get("shadow.dir", "").strip()
    if not root:
        raise ConfigError(f"{PREFIX}shadow.dir is required with {PREFIX}shadow.mode ({KEYS['shadow.dir']})")
    try:
        split_uri(root)
    except InvalidPath as exc:
        raise ConfigError(f"{PREFIX}shadow.dir={root!r} is invalid: {exc}") from None
    shadow_job = validate_job_name(values.get("shadow.job", "").strip() or f"{job}-shadow")
    if shadow_job == job and root == values["dir"].strip():
        raise ConfigError(f"{PREFIX}shadow.job={shadow_job!r} in {PREFIX}shadow.dir={root!r} is blue's own "
                          "job; expected another name or another root (a shadow never writes blue's catalog)")
    source = values.get("shadow.from", "latest").strip() or "latest"
    if source.lower() == "latest":
        source = "latest"
    else:
        try:
            split_uri(source)
        except InvalidPath as exc:
            raise ConfigError(f"{PREFIX}shadow.from={source!r} is invalid: {exc}; expected latest or a "
                              "checkpoint path of blue's job") from None
    work_dir = values.get("shadow.workDir", "").strip() or None
    blue_root = work_root(values["dir"].strip(), job, values.get("workDir", "").strip() or None)
    if os.path.normpath(work_root(root, shadow_job, work_dir)) == os.path.normpath(blue_root):
        # Live locations are named g<generation> of each job's own catalog: the shadow's g1
        # would be blue's g1.
        raise ConfigError(f"{PREFIX}shadow.workDir={work_dir!r} is blue's own live location root "
                          f"{blue_root}; expected another directory (a subdirectory of it is fine)")
    until = values.get("shadow.untilBatch", "").strip()
    poll = parse_duration("shadow.pollInterval", values.get("shadow.pollInterval", "1s"))
    if poll <= 0:
        raise ConfigError(f"{PREFIX}shadow.pollInterval={values['shadow.pollInterval']!r} must be positive")
    return Shadow(mode=mode, dir=root, job=shadow_job, source=source, work_dir=work_dir,
                  until_batch=_parse_int("shadow.untilBatch", until, 0) if until else None,
                  poll_interval_s=poll)


def _cutover_id(value: str) -> str | None:
    """``spark.sparkpoint.cutover``: empty, or a cutover id.

    :raises ConfigError: not ``<13 digits>-<8 hex>``.
    """
    if not value:
        return None
    if not REQUEST_ID_RE.match(value):
        raise ConfigError(f"{PREFIX}cutover={value!r} is invalid; expected a cutover id "
                          "'<13 digits>-<8 hex>' (see `sparkpoint cutover list`)")
    return value
