"""Structure checks of the package that ruff, mypy and import-linter do not make
(`make lint` runs this; tests/unit/test_structure.py runs it on the package too):

* no module longer than `MAX_LINES` lines: a backstop, not the rule. The rule is one
  concern per module and per class (docs/ARCHITECTURE.md's concept table names each
  module's), split by concern and never to fit a count; a module this long has
  certainly grown a second one;
* no import cycle between any two modules, a package's ``__init__`` included (the
  ``acyclic_siblings`` contract in pyproject.toml looks only at siblings). Imports inside
  functions and under ``TYPE_CHECKING`` count: a lazy import hides a cycle, it does not
  break it;
* every public module (no part of its path starts with ``_``; ``__init__`` and
  ``__main__`` are exempt) declares ``__all__`` at module level: its public names, so
  what a module offers is declared, not guessed;
* no test module imports from another test module (``test_*.py``) or from a
  ``conftest.py``, anywhere under the ``tests`` folder beside the package: pytest imports
  a test module itself, so importing it again runs its module body twice (and registers
  its sink kinds twice), and it hides which helpers are shared. Shared helpers live in
  ``tests/support/`` (or a package's own support module);
* no module imports a private name (``_x``) of another module, nor a private module of
  another package (`private_imports`): a private name is its module's, a private module
  its package's;
* no class of the package is built on a class of another of its modules (a class
  spread over files by mixins, as the run once was, the operators on their job and
  asset-event mixins, and `S3Storage` on its connection half): a run's phases take its
  state (`runtime/run_state.py`), a store holds its connection, an operator holds its
  job's hook and its asset events (`operators/job.py` `JobHook`,
  `operators/asset_events.py` `AssetEvents`) (`spread_classes`). Implementing a
  declared interface is no spread (`INTERFACE_BASES`: the storage and sink ABCs; and
  every ``Protocol``, `protocols`);
  `SPREAD_ALLOWED` names the known exceptions left, each with its reason (it only
  shrinks);
* no module sets a private attribute of another object (``op._detached = process``, as the
  submit operator's deploy-mode modules once set the operator's, issue #47): a class's
  private state is set by its own class; a function that works for a class is given a
  state object or calls a method (`private_sets`: ``x._y = ...`` with ``x`` neither
  ``self`` nor ``cls``). `PRIVATE_SETS_ALLOWED` names the exceptions, each with its reason
  (it only shrinks);
* no test package imports another one (``tests/security`` importing ``tests.chaos``):
  what two packages share lives in ``tests/support/`` (`CROSS_PACKAGE_ALLOWED` names the
  exceptions left, each with its reason; it only shrinks);
* every exception class of the package is defined in ``exceptions.py`` (one error tree),
  but for `ERRORS_ELSEWHERE`: the Airflow-derived ones of ``operators/`` and a private
  signal, each with its reason (`errors_outside_tree`);
* a job script (a ``.py`` file in a ``jobs/`` folder of ``dags/`` or ``tests/``) imports
  from the package only what a job author may: `JOB_SCRIPT_IMPORTS` (``runtime`` and
  ``sinks``), with no exception: a test arms the runtime's pause and fault points through
  the Spark conf or the environment, never by importing ``faults``.
  Reporting the result and a clean exit are ``SparkpointJob.main``'s; a test that needs
  more (the chaos pacing) does it from outside the driver.

Usage: python scripts/check_structure.py [PACKAGE_DIR]   (default: airflow_sparkpoint)
Exit 0 when all hold, 1 with one line per problem otherwise.
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

MAX_LINES = 1000


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _trees(directory: Path) -> Iterator[tuple[Path, ast.Module]]:
    """Each ``.py`` file under `directory`, in path order, with its syntax tree."""
    for path in sorted(directory.rglob("*.py")):
        yield path, _parse(path)


def _module_name(package_dir: Path, path: Path) -> str:
    """The dotted name under the package of the module at `path` ("" for its ``__init__``)."""
    parts = path.relative_to(package_dir).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def long_modules(package_dir: Path, max_lines: int = MAX_LINES) -> list[tuple[Path, int]]:
    """The ``.py`` files under `package_dir` with more than `max_lines` lines, with their
    line counts, in path order."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > max_lines:
            found.append((path, lines))
    return found


def modules_without_all(package_dir: Path) -> list[Path]:
    """The public modules under `package_dir` (no part of the path below it starts with
    ``_``; ``__init__.py`` and ``__main__.py`` are exempt) that do not assign ``__all__``
    at module level, in path order."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        if any(part.startswith("_") for part in path.relative_to(package_dir).parts):
            continue
        tree = _parse(path)
        if not any(isinstance(target, ast.Name) and target.id == "__all__"
                   for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                   for target in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            found.append(path)
    return found


def import_cycles(package: str) -> list[list[str]]:
    """Each set of modules of `package` (importable from ``sys.path``) that import each
    other in a circle, directly or not, as a sorted list; sorted by first module.
    Function-level and ``TYPE_CHECKING`` imports count."""
    import grimp  # installed with import-linter (the `dev` extra)

    graph = grimp.build_graph(package, cache_dir=None)
    modules = sorted(graph.modules)
    edges = {m: sorted(set(graph.find_modules_directly_imported_by(m))) for m in modules}
    # Tarjan's strongly connected components, iteratively (no recursion limit to hit).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            successors = edges[node]
            if child < len(successors):
                work.append((node, child + 1))
                nxt = successors[child]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(cycles)


def _is_test_module(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def test_module_imports(tests_dir: Path) -> list[tuple[Path, int, str]]:
    """Each import, anywhere under `tests_dir` (inside functions too), of a test module
    (``test_*``) or a ``conftest`` of the ``tests`` package, or of a name from one: its
    file, line and the module imported, in path and line order."""
    found = []
    for path, tree in _trees(tests_dir):
        for node in ast.walk(tree):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                # `from tests.x import test_y` imports the test module itself; a relative
                # import (`from .test_y import x`, `from . import test_y`) stays under `tests_dir`
                base = "." * node.level + (node.module or "")
                dot = "." if base.strip(".") else ""
                modules = [base] + [f"{base}{dot}{alias.name}" for alias in node.names]
            for module in modules:
                inside = module.startswith(".") or module.split(".", 1)[0] == tests_dir.name
                if inside and _is_test_module(module):
                    found.append((path, node.lineno, module))
                    break
    return sorted(found)


#: declared interfaces (the ABCs; a ``Protocol`` is found by `protocols`), by dotted name
#: under the package: a class of another module implementing one is no class spread over files
INTERFACE_BASES = frozenset({
    "storage.base.Storage",  # the storage protocol: local, in-memory, S3, counting
    "sinks.base.Sink",  # the two-phase-commit sink protocol
})

#: classes built on a concrete class of another module, known and not cut yet, by path
#: under the package and ``Class(Base)``, with the reason. It only shrinks; runtime/ has none.
_FILE_SINK = "FileSink is the abstract file sink (claims, identity) both file sinks implement"
_OPERATOR_KIND = "a public operator specialising another public operator (docs/reference/operators.md)"
SPREAD_ALLOWED: dict[tuple[str, str], str] = {
    ("checkpoints/layout.py", "JobStore(PrefixedStorage)"):
        "a job's prefixed view of a store with bounded reads: a Storage view specialised, not a mixin",
    ("sinks/directory.py", "DirectorySink(claims.FileSink)"): _FILE_SINK,
    ("sinks/s3.py", "S3Sink(claims.FileSink)"): _FILE_SINK,
    ("operators/preflight.py", "SparkpointPreflightOperator(SparkpointVerifyOperator)"): _OPERATOR_KIND,
    ("operators/verify.py", "SparkpointDrillOperator(SparkpointSubmitOperator)"): _OPERATOR_KIND,
    ("triggers/cutover.py", "SparkpointCutoverTrigger(StoppableTrigger)"):
        "StoppableTrigger is the trigger base (on_kill, the shared client) of the run and cutover triggers",
}


def spread_classes(package_dir: Path, interfaces: frozenset[str] = INTERFACE_BASES,
                   allowed: Mapping[tuple[str, str], str] = SPREAD_ALLOWED) -> list[tuple[Path, int, str]]:
    """Each class in a module under `package_dir` with a base imported from another
    module of the package (``from airflow_sparkpoint.storage.x import Base``, or ``x.Base``
    of a module so imported): its file, line and ``Class(Base)``, in path and line order.
    Not reported: a base among `interfaces` (its dotted name under the package) or
    declared a ``Protocol`` in its module (`protocols`: an interface too), an error built
    on another module's error (a base named ``*Error``: an error tree, not a
    mixin), and the pairs `allowed` names (path under `package_dir`, ``Class(Base)``)."""
    root = package_dir.name
    interfaces = interfaces | protocols(package_dir)
    found = []
    for path, tree in _trees(package_dir):
        relative = path.relative_to(package_dir)
        under = _module_name(package_dir, path)
        own = f"{root}.{under}" if under else root
        names: dict[str, str] = {}  # a name imported from another module -> its dotted name under the package
        for node in ast.walk(tree):
            if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module != own
                    and (node.module == root or node.module.startswith(f"{root}."))):
                under = node.module[len(root) + 1:]
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{under}.{alias.name}" if under else alias.name
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                head = base
                while isinstance(head, ast.Attribute):
                    head = head.value
                shown = ast.unparse(base)
                if not isinstance(head, ast.Name) or head.id not in names or shown.endswith("Error"):
                    continue
                dotted = names[head.id] + shown[len(head.id):]
                entry = f"{node.name}({shown})"
                if dotted not in interfaces and (relative.as_posix(), entry) not in allowed:
                    found.append((path, node.lineno, entry))
    return sorted(found)


def protocols(package_dir: Path) -> frozenset[str]:
    """The classes under `package_dir` declared ``class X(..., Protocol)`` (``typing.Protocol``
    too), by dotted name under the package (``operators.submit_deferred.DeferringSubmit``)."""
    found = set()
    for path, tree in _trees(package_dir):
        module = _module_name(package_dir, path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).split(".")[-1] == "Protocol"
                                                      for b in node.bases):
                found.add(f"{module}.{node.name}" if module else node.name)
    return frozenset(found)


#: sets of another object's private attribute, by path under the package and ``x._y``, with
#: the reason; it only shrinks
_OWN_COPY = "a copy of its own class's instance, built in its own method (not copy.copy)"
PRIVATE_SETS_ALLOWED: dict[tuple[str, str], str] = {
    ("operators/submit_hook.py", "hook._secret_env"): _OWN_COPY + ": the classmethod SparkpointSubmitHook.of",
    ("storage/s3_client.py", "other._client"): _OWN_COPY + ": S3Connection's view of another bucket",
    ("storage/s3_client.py", "other._lock"): _OWN_COPY + ": S3Connection's view of another bucket",
    ("runtime/job.py", "exc._sparkpoint_reported"):
        "marks an exception the job raised as reported, on its way out (no class of the package)",
}


def private_sets(package_dir: Path, allowed: Mapping[tuple[str, str], str] = PRIVATE_SETS_ALLOWED,
                 ) -> list[tuple[Path, int, str]]:
    """Each assignment, anywhere in a module under `package_dir`, to a private attribute
    (``_y``, not a dunder) of a name other than ``self`` and ``cls`` (``x._y = ...``,
    ``x._y += ...``, ``x._y: T = ...``, in a tuple target too) that `allowed` does not name
    (path under `package_dir`, ``x._y``): its file, line and ``x._y``, in path and line order."""
    found = []
    for path, tree in _trees(package_dir):
        relative = path.relative_to(package_dir).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            else:
                continue
            while any(isinstance(t, (ast.Tuple, ast.List)) for t in targets):
                targets = [e for t in targets
                           for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]
            for target in targets:
                if (isinstance(target, ast.Attribute) and _private(target.attr)
                        and isinstance(target.value, ast.Name) and target.value.id not in ("self", "cls")):
                    name = f"{target.value.id}.{target.attr}"
                    if (relative, name) not in allowed:
                        found.append((path, node.lineno, name))
    return sorted(found)


#: exception classes defined outside ``exceptions.py`` (the rule: its module docstring),
#: each with the reason it cannot live there; it only shrinks
ERRORS_ELSEWHERE: dict[tuple[str, str], str] = {
    ("operators/driver_errors.py", "SparkpointRunFailed"):
        "an AirflowException: exceptions.py is imported by the Spark-side runtime, which never imports "
        "Airflow",
    ("operators/submit_checks.py", "SparkpointConfigFailure"):
        "an AirflowFailException (the task is not retried): the same reason",
    ("runtime/job.py", "_StopRun"):
        "private to the run's foreachBatch: a stopping run refuses a batch with it; no caller catches it",
}

_EXTERNAL_ERROR = re.compile(r"(Exception|Error|Warning)$")


def _base_name(base: ast.expr) -> str:
    """``Base`` of ``Base``, ``module.Base`` or ``Base[T]``."""
    while isinstance(base, ast.Subscript):
        base = base.value
    return base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else ""


def errors_outside_tree(package_dir: Path, tree: str = "exceptions.py") -> list[tuple[Path, int, str]]:
    """Each exception class (built on a builtin exception, on an error class of the
    package, or on an imported ``*Exception`` / ``*Error`` / ``*Warning`` such as
    Airflow's) defined anywhere in the package but its `tree` module and not listed in
    `ERRORS_ELSEWHERE`: its file, line and name, in path and line order. A class counts
    by its bases' names, followed through the package's classes."""
    classes = []  # (path, line, name, base names)
    for path, parsed in _trees(package_dir):
        for node in ast.walk(parsed):
            if isinstance(node, ast.ClassDef):
                classes.append((path, node.lineno, node.name, [_base_name(b) for b in node.bases]))
    defined = {name for _path, _line, name, _bases in classes}
    errors = {name for name, value in vars(builtins).items()
              if isinstance(value, type) and issubclass(value, BaseException)}
    errors |= {base for *_, bases in classes for base in bases
               if base not in defined and _EXTERNAL_ERROR.search(base)}
    while True:  # follow the package's own error classes to a fixpoint
        more = {name for _path, _line, name, bases in classes if name not in errors and errors & set(bases)}
        if not more:
            break
        errors |= more
    home = package_dir / tree
    return sorted((path, line, name) for path, line, name, _bases in classes
                  if name in errors and path != home
                  and (path.relative_to(package_dir).as_posix(), name) not in ERRORS_ELSEWHERE)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(package_dir: Path) -> list[tuple[Path, int, str]]:
    """Each import, anywhere in a module under `package_dir` (inside functions too), of a
    private name (``_x``, not a module) from another module of the package, or of a private
    module (a part of its dotted path starts with ``_``) of another subpackage than the
    importer's own: its file, line and what it imports, in path and line order. A private
    module is its package's; a private name, its module's."""
    root = package_dir.name
    found = []
    for path, tree in _trees(package_dir):
        relative = path.relative_to(package_dir)
        own_package = (root, *relative.parts[:-1])
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                parts = target.split(".")
                if parts[0] != root:
                    continue
                is_module = package_dir.joinpath(*parts[1:]).with_suffix(".py").is_file() \
                    or package_dir.joinpath(*parts[1:]).is_dir()
                private_at = [i for i, part in enumerate(parts) if _private(part)]
                if not private_at:
                    continue
                if not is_module and private_at[-1] == len(parts) - 1 and len(private_at) == 1:
                    found.append((path, node.lineno, target))  # a private name of another module
                    continue
                first = private_at[0]  # a private module (or a name inside one): whose package is it?
                if tuple(parts[:first]) != own_package[:first] or len(own_package) < first:
                    found.append((path, node.lineno, ".".join(parts[:first + 1])))
    return sorted(found)


#: ``(file under tests/, module)``: imports of another test package still allowed, and why
#: (none left: what two packages share lives in tests/support/)
CROSS_PACKAGE_ALLOWED: dict[tuple[str, str], str] = {}


def cross_package_test_imports(tests_dir: Path) -> list[tuple[Path, int, str]]:
    """Each import, anywhere in a file of a package under `tests_dir` (inside functions
    too), of another test package than its own and ``support`` (``tests.<other>...``),
    unless `CROSS_PACKAGE_ALLOWED`: its file, line and module, in path and line order."""
    found = []
    for path, tree in _trees(tests_dir):
        relative = path.relative_to(tests_dir)
        own = relative.parts[0] if len(relative.parts) > 1 else None
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                if parts[0] != tests_dir.name or len(parts) < 2 or parts[1] in ("support", own):
                    continue
                if (relative.as_posix(), module) not in CROSS_PACKAGE_ALLOWED:
                    found.append((path, node.lineno, module))
    return sorted(found)


#: what a job script may import from the package: the job author's API
JOB_SCRIPT_IMPORTS = ("airflow_sparkpoint.runtime", "airflow_sparkpoint.sinks")


def job_script_imports(repo: Path) -> list[tuple[Path, int, str]]:
    """Each import of a package module outside `JOB_SCRIPT_IMPORTS` by a job script (a
    ``.py`` file in a ``jobs/`` folder under ``dags/`` or ``tests/`` of `repo`): its file,
    line and module, in path and line order."""
    found = []
    scripts = [path for top in ("dags", "tests") if (repo / top).is_dir()
               for path in (repo / top).rglob("*.py") if "jobs" in path.relative_to(repo).parts[:-1]]
    for path in sorted(scripts):
        tree = _parse(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = ([f"{node.module}.{alias.name}" for alias in node.names]
                           if node.module == "airflow_sparkpoint" else [node.module])
            else:
                continue
            for module in modules:
                if module.split(".")[0] != "airflow_sparkpoint":
                    continue
                if module not in JOB_SCRIPT_IMPORTS:
                    found.append((path, node.lineno, module))
    return sorted(found)


def problems(package_dir: Path) -> list[str]:
    """One line per module over `MAX_LINES`, per import cycle and per public module
    without ``__all__`` of the package in `package_dir` (its parent directory must be on
    ``sys.path``)."""
    found = [f"{path}: {lines} lines; at most {MAX_LINES} (split it by concern)"
             for path, lines in long_modules(package_dir)]
    found += [f"import cycle: {' <-> '.join(cycle)} (move the shared piece down to a module both can import)"
              for cycle in import_cycles(package_dir.name)]
    found += [f"{path}: a public module without __all__ (declare its public names, or start its name with _)"
              for path in modules_without_all(package_dir)]
    found += [f"{path}:{line}: {cls} builds a class on a class of another module (a mixin); compose "
              "instead: give the phase the state it acts on"
              for path, line, cls in spread_classes(package_dir)]
    found += [f"{path}:{line}: imports {name}, private to its module or package (make it public, or "
              "move what is shared)" for path, line, name in private_imports(package_dir)]
    found += [f"{path}:{line}: sets {name}, another object's private attribute (its class sets its own "
              "state: pass the function a state object, or call a method)"
              for path, line, name in private_sets(package_dir)]
    found += [f"{path}:{line}: {name} is an exception class outside exceptions.py (define it in the error "
              "tree, or list it in ERRORS_ELSEWHERE with the reason it cannot live there)"
              for path, line, name in errors_outside_tree(package_dir)]
    return found


def main(argv: list[str]) -> int:
    package_dir = Path(argv[0] if argv else "airflow_sparkpoint").resolve()
    sys.path.insert(0, str(package_dir.parent))
    found = problems(package_dir)
    tests_dir = package_dir.parent / "tests"
    if tests_dir.is_dir():
        found += [f"{path}:{line}: imports {module}, a test module (move what it shares to tests/support/)"
                  for path, line, module in test_module_imports(tests_dir)]
        found += [f"{path}:{line}: imports {module}, another test package (move what they share to "
                  "tests/support/)" for path, line, module in cross_package_test_imports(tests_dir)]
    found += [f"{path}:{line}: a job script imports {module}; a job script imports only "
              f"{', '.join(JOB_SCRIPT_IMPORTS)} (SparkpointJob.main reports the result and exits)"
              for path, line, module in job_script_imports(package_dir.parent)]
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
