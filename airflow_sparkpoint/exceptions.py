"""The one error tree of airflow-sparkpoint.

::

    SparkpointError
    ├── ConfigError                 invalid spark.sparkpoint.* value or operator argument
    ├── StorageError                a store could not be read or written
    │   ├── ObjectNotFound          the key does not exist
    │   ├── ObjectExists            put-if-absent lost the race
    │   ├── InvalidPath             a key escapes its root, or a URI is malformed
    │   └── ObjectTooLarge          an object is over the size limit of its kind (corrupt)
    ├── CatalogError                checkpoints / savepoints / generations
    │   ├── CorruptMetadata         _metadata is truncated, garbled or fails its checksum
    │   │   └── CorruptRecord       a stored record is over its size, memory or nesting
    │   │                           limit, or unparsable (also a ValueError)
    │   ├── RestoreError            a restore target is missing, foreign or unusable
    │   ├── StaleGeneration         a superseded job tried to act (invariant 5)
    │   ├── GenerationRunning       an action for a stopped generation found it running
    │   │   └── JobAlreadyRunning   a start found a live run another task started
    │   │                           (refused unless takeover)
    │   │       └── CutoverInProgress  a start found a zero-downtime cutover open
    │   └── CutoverError            a cutover record or step refused (wrong state, lost race)
    ├── SinkError                   a sink could not stage, commit or abort
    │   ├── CommitOutcomeUnknown    the commit may or may not have landed: never clean up
    │   ├── TransactionConflict     another transaction holds batch N's commit: this one
    │   │                           was aborted (exclusive promotion, invariant 8)
    │   └── SinkAheadError          a sink already committed past the restore point
    │       └── SinkLineageError    the sink does not hold what the restore point's
    │                               lineage committed (invariant 12), or a running
    │                               lineage's confirmed transaction was aborted
    ├── ControlError                a control request failed or timed out
    ├── DrillFailed                 a restore drill or blue-green pre-flight failed (the
    │                               drill operators raise it as the task's AirflowException)
    ├── VerificationFailed          a snapshot's files or state failed a verification check
    │                               (the verdict; `verify_snapshot` records it, never raises)
    ├── Terminated                  the driver received SIGTERM; the run ended unfinished
    ├── CheckpointAbandoned         a checkpoint past checkpoint.timeout, or cut short by
    │                               the run's end (never leaves the driver)
    ├── PipelineNotFound            the UI plugin: no sparkpoint connection serves the job
    │                               (a 404, never shown)
    ├── UsageError                  bad command-line input (the CLI's exit code 2)
    └── CommandFailed               a command's operational failure, already explained
                                    (the CLI's exit code 1)

Every error class of the package is defined here, but for two kinds (each named, with its
reason, by ``scripts/check_structure.py`` ``ERRORS_ELSEWHERE``, which `make lint` checks):

- the submit operator's Airflow-derived errors, `operators.driver_errors.SparkpointRunFailed`
  (an ``AirflowException`` and a `SparkpointError`) and
  `operators.submit_checks.SparkpointConfigFailure` (an ``AirflowFailException`` and a
  `ConfigError`): this module is imported by the Spark-side runtime, which never imports
  Airflow, so no Airflow class can be a base here;
- a private signal that no caller catches by class (``runtime.job._StopRun``).
"""

from __future__ import annotations

__all__ = ["CatalogError", "CheckpointAbandoned", "CommandFailed", "CommitOutcomeUnknown", "ConfigError",
           "ControlError", "CorruptMetadata", "CorruptRecord", "CutoverError", "CutoverInProgress",
           "DrillFailed", "GenerationRunning", "InvalidPath", "JobAlreadyRunning",
           "ObjectExists", "ObjectNotFound", "ObjectTooLarge", "PipelineNotFound", "RestoreError",
           "SinkAheadError", "SinkError", "SinkLineageError", "SparkpointError", "StaleGeneration",
           "StorageError", "Terminated", "TransactionConflict", "UsageError", "VerificationFailed"]


class SparkpointError(Exception):
    """Base class of every error raised by airflow-sparkpoint."""


class ConfigError(SparkpointError, ValueError):
    """A configuration value is invalid; the message names the key, value and what is allowed."""


class StorageError(SparkpointError):
    """A store could not be read or written."""


class ObjectNotFound(StorageError, KeyError):
    """The requested key does not exist."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "object not found"


class ObjectExists(StorageError):
    """An atomic create found the key already present."""


class InvalidPath(StorageError, ValueError):
    """A key escapes its root, or a URI is malformed."""


class ObjectTooLarge(StorageError, ValueError):
    """An object read from a store is larger than the limit of its kind of record: it is
    treated as corrupt (a ValueError, like unparsable JSON), never read whole."""


class CatalogError(SparkpointError):
    """Checkpoint, savepoint or generation bookkeeping failed."""


class CorruptMetadata(CatalogError):
    """A `_metadata` file is truncated, garbled, fails its checksum or references missing files."""


class CorruptRecord(CorruptMetadata, ValueError):
    """A record read from a shared place (the store, a sink's output location) is over
    the limits of its kind (bytes, the memory its parse would take, nesting depth) or is
    not parsable: treated as corrupt, never read whole (`checkpoints.bounded`). A
    ValueError, like unparsable JSON, for callers that treat both alike."""


class RestoreError(CatalogError):
    """A restore target is missing, foreign, corrupt or incompatible."""


class StaleGeneration(CatalogError):
    """A superseded generation tried to complete a checkpoint or commit."""


class GenerationRunning(CatalogError):
    """An action that needs a stopped generation (aborting its output) found it still running."""


class JobAlreadyRunning(GenerationRunning):
    """A start found a live generation that another Airflow task (or no task: a manual
    start) started; starting would fence it. Refused unless the start takes it over."""


class CutoverInProgress(JobAlreadyRunning):
    """A start of a job found a zero-downtime cutover of it open (planned and not done):
    only the cutover's green takes the job's next generation (`checkpoints.cutover`)."""


class CutoverError(CatalogError):
    """A cutover step was refused: its records are not in the state the step needs (no
    plan, already done, another generation claimed), or the sink is not where the
    agreement left it. Nothing of the job was changed by the refused step."""


class SinkError(SparkpointError):
    """A sink could not stage, commit or abort a transaction."""


class CommitOutcomeUnknown(SinkError):
    """A commit may or may not have landed; the staged data must be kept and the key looked up."""


class TransactionConflict(SinkError):
    """Batch N of the job was committed by another transaction (another generation):
    exactly one may promote a batch, so this one's staged data was aborted."""


class SinkAheadError(SinkError, RestoreError):
    """A sink has committed batches beyond the snapshot being restored (invariant 4)."""


class SinkLineageError(SinkAheadError):
    """A sink does not hold exactly what the snapshot being restored, and its lineage,
    committed: another lineage's commit of a batch, a batch that lineage committed and
    the sink no longer holds, or a confirmed transaction that was aborted since
    (invariant 12). Refused before anything is written, unless a rewind can fix it. Also
    a live run's checkpoint (external commit mode) that finds a transaction its lineage
    confirms aborted under it: the run ends before a checkpoint goes on without it."""


class ControlError(SparkpointError):
    """A control request (savepoint, stop, cancel) failed or timed out."""


class DrillFailed(SparkpointError):
    """A restore drill failed: its snapshot cannot be resolved or opened, the application
    failed or did not finish from it, or a blue-green pre-flight was refused or
    inconclusive; the message says why (`services.drill`, `services.preflight`)."""


class VerificationFailed(SparkpointError):
    """A snapshot failed a check of `runtime.verify` (a referenced file missing, truncated or
    altered; operator state unreadable or short of partitions): the message is the verdict,
    which `verify_snapshot` records in its result instead of raising."""


class Terminated(SparkpointError):
    """The driver received SIGTERM; the run ended without finishing (`runtime.signals`)."""


class CheckpointAbandoned(SparkpointError):
    """A checkpoint ran past `checkpoint.timeout` and was abandoned, or was cut short because
    the run ends (`runtime.prestore`, `runtime.checkpointer`)."""


class PipelineNotFound(SparkpointError):
    """No ``sparkpoint`` connection serves this job (or the names are malformed): the UI
    plugin's 404 (`plugins.pipelines`)."""


class UsageError(SparkpointError):
    """Bad command-line input (the ``sparkpoint`` command's exit code 2)."""


class CommandFailed(SparkpointError):
    """An operational failure of a ``sparkpoint`` command, already explained to the user
    (exit code 1)."""
