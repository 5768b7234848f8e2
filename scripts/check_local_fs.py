"""No raw filesystem call on a shared place outside the one local filesystem layer
(issue #46; `make lint` runs this, tests/unit/test_local_fs_check.py runs it on the
package too).

A sink's output location, the work directory with its live locations and a local store
can be written by others, who can plant symbolic links there: every delete, rename,
listing or link on such a path goes through `airflow_sparkpoint/storage/localfs.py`
(with its descriptor routines, `_localfs_fd.py`), which follows no link. So a call of one of `CALLS` anywhere
else in the package is a
problem, unless `ALLOWED` names it (module, enclosing function, call) with the reason why
the path it acts on is not a shared place: a temporary file or directory the process made
itself, a directory of the Airflow worker's own. Keep `ALLOWED` short: port a call to
`localfs` rather than allowing it.

Usage: python scripts/check_local_fs.py [PACKAGE_DIR]   (default: airflow_sparkpoint)
Exit 0 when nothing is found, 1 with one line per call otherwise.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

#: the calls that act on a path (os and shutil functions), by module
CALLS = {
    "os": {"replace", "rename", "renames", "listdir", "scandir", "walk", "fwalk", "unlink", "remove", "rmdir",
           "removedirs", "symlink", "link"},
    "shutil": {"rmtree", "move"},
}
#: the one home of these calls (the layer and its descriptor routines), relative to the
#: package's parent directory
HOME = ("airflow_sparkpoint/storage/localfs.py", "airflow_sparkpoint/storage/_localfs_fd.py")
#: (module, enclosing function, call) -> why its path is no shared place
ALLOWED: dict[tuple[str, str, str], str] = {
    ("airflow_sparkpoint/storage/base.py", "discard_file", "os.unlink"):
        "removes a temporary file its caller made (a failed download or copy)",
    ("airflow_sparkpoint/storage/base.py", "Storage.download_file", "os.replace"):
        "the in-memory store's download into the caller's own path (a scratch directory, or a live location "
        "whose directories `restore.materialize` made through localfs)",
    ("airflow_sparkpoint/storage/s3.py", "S3Storage.download_file", "os.replace"):
        "an S3 download into the caller's own path (as above)",
    ("airflow_sparkpoint/sinks/_s3_stage.py", "stage_partition", "os.unlink"):
        "an executor's temporary file from tempfile.mkstemp",
    ("airflow_sparkpoint/services/drill.py", "Scratch.remove", "shutil.rmtree"):
        "a restore drill's own scratch directories (a random name the drill made; "
        "not ported to localfs yet: "
        "under a shared workDir an intermediate link would be followed)",
    ("airflow_sparkpoint/services/submit_dir.py", "SubmitDir.close", "shutil.rmtree"):
        "the worker's own per-submit directory (tempfile.mkdtemp), locked by this task",
    ("airflow_sparkpoint/services/submit_dir.py", "sweep", "os.scandir"):
        "the worker's temporary directory, for its own per-submit directories (links skipped)",
    ("airflow_sparkpoint/services/submit_dir.py", "sweep", "shutil.rmtree"):
        "a per-submit directory of a killed task on the worker (shutil.rmtree refuses a link there)",
    ("airflow_sparkpoint/faults.py", "pause", "os.replace"):
        "the test hooks' marker file in the pause directory a test gave (docs/development.md)",
    ("airflow_sparkpoint/demo/command.py", "main", "shutil.rmtree"):
        "the demo's own output directory, wiped at its start",
}


class _Finder(ast.NodeVisitor):
    """The calls of `CALLS` in one module: (line, enclosing function, call)."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str, str]] = []
        self._scope: list[str] = []
        self._modules: dict[str, str] = {}  # local name -> "os" / "shutil"
        self._functions: dict[str, str] = {}  # local name -> "os.unlink" (from os import unlink)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name in CALLS:
                self._modules[alias.asname or alias.name] = alias.name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module in CALLS and node.level == 0:
            for alias in node.names:
                if alias.name in CALLS[node.module]:
                    self._functions[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self._scope.append(node.name)
        self.generic_visit(node)
        self._scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        call = None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            module = self._modules.get(func.value.id)
            if module is not None and func.attr in CALLS[module]:
                call = f"{module}.{func.attr}"
        elif isinstance(func, ast.Name) and func.id in self._functions:
            call = self._functions[func.id]
        if call is not None:
            self.found.append((node.lineno, ".".join(self._scope) or "<module>", call))
        self.generic_visit(node)


def raw_calls(package_dir: Path) -> list[tuple[str, int, str, str]]:
    """Every call of `CALLS` in the package outside `HOME`, as (module path relative to
    the package's parent, line, enclosing function, call), in path order."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        module = path.relative_to(package_dir.parent).as_posix()
        if module in HOME:
            continue
        finder = _Finder()
        finder.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        found += [(module, line, scope, call) for line, scope, call in finder.found]
    return found


def problems(package_dir: Path) -> list[str]:
    """One line per call outside `HOME` that `ALLOWED` does not name, and per entry of
    `ALLOWED` that matches no call any more (a stale entry would allow a new call)."""
    calls = raw_calls(package_dir)
    found = [f"{module}:{line}: {call} in {scope}: a filesystem call outside {HOME[0]}; use "
             "airflow_sparkpoint.storage.localfs (no link followed), or allow it in "
             "scripts/check_local_fs.py "
             "with the reason its path is no shared place"
             for module, line, scope, call in calls if (module, scope, call) not in ALLOWED]
    used = {(module, scope, call) for module, _line, scope, call in calls}
    found += [f"scripts/check_local_fs.py: ALLOWED names {call} in {module} {scope}, "
              "which no longer calls it; "
              "remove the entry" for module, scope, call in ALLOWED if (module, scope, call) not in used]
    return found


def main(argv: list[str]) -> int:
    package_dir = Path(argv[0] if argv else "airflow_sparkpoint").resolve()
    found = problems(package_dir)
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
