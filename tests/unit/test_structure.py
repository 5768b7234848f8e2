"""The structure rules of the package (`scripts/check_structure.py`, run by `make lint`):
no module over the backstop's line count, no import cycle, no public module without `__all__`,
no class built on another module's class (declared interfaces and listed exceptions aside),
no private name imported from another module nor a private module from another package,
no private attribute of another object set (`private_sets`),
no exception class outside `exceptions.py` but the listed ones, no test module importing
another test module, no test package importing another, job scripts importing only the job
author's API. Checked on synthetic packages (so the check can fail) and on the package itself."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.support.paths import REPO, load_module

check = load_module("check_structure", REPO / "scripts" / "check_structure.py")


def _package(root: Path, name: str, files: dict[str, str]) -> Path:
    package = root / name
    for relative, text in files.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_a_module_over_the_backstop_is_reported_with_its_count(tmp_path: Path) -> None:
    limit = check.MAX_LINES
    package = _package(tmp_path, "sp_long", {"__init__.py": "", "ok.py": "x = 1\n" * limit,
                                             "sub/__init__.py": "", "sub/long.py": "x = 1\n" * (limit + 1)})
    assert check.long_modules(package) == [(package / "sub" / "long.py", limit + 1)]


def test_cycles_through_lazy_type_checking_and_package_imports_are_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = _package(tmp_path, "sp_cycles", {
        "__init__.py": "",
        # a lazy import back
        "a.py": "import sp_cycles.b\n",
        "b.py": "def f():\n    import sp_cycles.a\n",
        # a TYPE_CHECKING import back
        "c.py": "from sp_cycles import d\n",
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sp_cycles import c\n",
        # a submodule importing its own package, whose __init__ imports it
        "pkg/__init__.py": "from sp_cycles.pkg import base\n",
        "pkg/base.py": "def g():\n    import sp_cycles.pkg\n",
        "clean.py": "import sp_cycles.a\n",
    })
    monkeypatch.syspath_prepend(str(tmp_path))
    assert check.import_cycles("sp_cycles") == [
        ["sp_cycles.a", "sp_cycles.b"],
        ["sp_cycles.c", "sp_cycles.d"],
        ["sp_cycles.pkg", "sp_cycles.pkg.base"],
    ]
    problems = [p for p in check.problems(package) if "__all__" not in p]  # its modules declare none
    assert len(problems) == 3 and all(p.startswith("import cycle: ") for p in problems)


def test_a_public_module_without_all_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = _package(tmp_path, "sp_all", {
        "__init__.py": "",  # a package's face: exempt
        "__main__.py": "print(1)\n",  # exempt
        "_private.py": "x = 1\n",  # a private module: exempt
        "_inner/__init__.py": "",
        "_inner/helper.py": "x = 1\n",  # under a private package: exempt
        "declared.py": "__all__ = [\"x\"]\nx = 1\n",
        "annotated.py": "__all__: list[str] = []\n",
        "sub/__init__.py": "",
        "sub/missing.py": "x = 1\n",
        "nested.py": "def f():\n    __all__ = [\"f\"]\n",  # not at module level
    })
    assert check.modules_without_all(package) == [package / "nested.py", package / "sub" / "missing.py"]
    monkeypatch.syspath_prepend(str(tmp_path))
    why = ": a public module without __all__ (declare its public names, or start its name with _)"
    assert (check.problems(package)
            == [f"{package / 'nested.py'}{why}", f"{package / 'sub' / 'missing.py'}{why}"])


def test_a_private_name_or_a_private_module_imported_from_elsewhere_is_reported(tmp_path: Path) -> None:
    package = _package(tmp_path, "sp_priv", {
        "__init__.py": "",
        "a.py": "__all__ = ['x']\nx = 1\n_y = 2\n",
        "b.py": "__all__ = []\nfrom sp_priv.a import _y, x\n",  # a private name of another module
        "c.py": "__all__ = []\nfrom sp_priv import _mod\nfrom sp_priv._mod import z\n",  # same package: fine
        "_mod.py": "z = 1\n",
        "sub/__init__.py": "",
        "sub/_inner.py": "w = 1\n",
        "sub/d.py": "__all__ = []\nfrom sp_priv.sub._inner import w\n",  # its own package's: fine
        "e.py": "__all__ = []\ndef f():\n    from sp_priv.sub._inner import w\n",  # another package's
        "g.py": "__all__ = []\nfrom sp_priv.a import __doc__ as d\n",  # a dunder: not private
    })
    assert check.private_imports(package) == [
        (package / "b.py", 2, "sp_priv.a._y"),
        (package / "e.py", 3, "sp_priv.sub._inner"),
    ]


def test_the_package_has_no_long_module_and_no_import_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    spec = importlib.util.find_spec("airflow_sparkpoint")
    assert spec is not None and str(spec.origin).startswith(str(REPO)), f"checking another copy: {spec}"
    assert check.problems(REPO / "airflow_sparkpoint") == []


def test_an_import_of_a_test_module_or_conftest_is_reported(tmp_path: Path) -> None:
    tests = _package(tmp_path, "tests", {
        "__init__.py": "",
        "conftest.py": "",
        "support/__init__.py": "",
        "support/helpers.py": "def helper(): ...\n",
        "unit/__init__.py": "",
        "unit/test_a.py": "from tests.support.helpers import helper\n",  # the one home: fine
        "unit/test_b.py": "from tests.unit.test_a import helper\n",
        "unit/test_c.py": "def test_c():\n    from tests.unit import test_a\n",  # lazy, the module itself
        "unit/test_d.py": "import tests.conftest\n",
        "unit/harness.py": "from tests.conftest import x\nimport testsuite.test_x\n",  # another package: fine
        "unit/test_e.py": "from .test_a import helper\nfrom . import test_b, helpers\n",  # relative
    })
    assert check.test_module_imports(tests) == [
        (tests / "unit" / "harness.py", 1, "tests.conftest"),
        (tests / "unit" / "test_b.py", 1, "tests.unit.test_a"),
        (tests / "unit" / "test_c.py", 2, "tests.unit.test_a"),
        (tests / "unit" / "test_d.py", 1, "tests.conftest"),
        (tests / "unit" / "test_e.py", 1, ".test_a"),
        (tests / "unit" / "test_e.py", 2, ".test_b"),
    ]


def test_no_test_module_imports_another_test_module() -> None:
    found = check.test_module_imports(REPO / "tests")
    assert found == [], \
        "\n".join(f"{path.relative_to(REPO)}:{line}: {module}" for path, line, module in found)


def test_a_runtime_class_built_on_another_runtime_module_s_class_is_reported(tmp_path: Path) -> None:
    package = _package(tmp_path, "sp_spread", {
        "__init__.py": "",
        "runtime/__init__.py": "",
        "runtime/status.py": "class _Status: ...\nclass StateError(Exception): ...\n",
        "runtime/startup.py": "from sp_spread.runtime.status import _Status\nclass _Startup(_Status): ...\n",
        "runtime/job.py": ("from sp_spread.runtime import startup\nfrom sp_spread.runtime.status import "
                           "StateError\nclass _Run(startup._Startup): ...\nclass Refused(StateError): ...\n"
                           "class Local: ...\nclass Sub(Local): ...\n"),  # an error tree, one module: fine
        # another package
        "runtime/other.py": "from sp_spread.sinks.base import Sink\nclass Mine(Sink): ...\n",
    })
    assert check.spread_classes(package) == [
        (package / "runtime" / "job.py", 3, "_Run(startup._Startup)"),
        (package / "runtime" / "startup.py", 2, "_Startup(_Status)"),
    ]
    assert check.spread_classes(REPO / "airflow_sparkpoint") == [], "no class is spread over modules"


def test_a_class_of_any_package_built_on_another_module_s_class_is_reported_unless_an_interface(
        tmp_path: Path) -> None:
    """The whole package, not runtime/ only (issue 47: `S3Storage` was built on its
    connection half in another module): implementing a declared interface
    (`INTERFACE_BASES`) or a listed exception (`SPREAD_ALLOWED`) is not reported."""
    package = _package(tmp_path, "sp_wide", {
        "__init__.py": "",
        "storage/__init__.py": "",
        "storage/base.py": "class Storage: ...\nclass PrefixedStorage(Storage): ...\n",  # one module: fine
        "storage/s3_client.py": ("from sp_wide.storage.base import Storage\nclass "
                                 "S3Connection(Storage): ...\n"),
        "storage/s3.py": ("from sp_wide.storage.s3_client import S3Connection\nclass "
                          "S3Storage(S3Connection): ...\n"),
        "checkpoints/__init__.py": "",
        "checkpoints/layout.py": ("from sp_wide.storage import base\nclass "
                                  "JobStore(base.PrefixedStorage): ...\n"),
    })
    assert check.spread_classes(package) == [
        (package / "checkpoints" / "layout.py", 2, "JobStore(base.PrefixedStorage)"),
        (package / "storage" / "s3.py", 2, "S3Storage(S3Connection)"),
    ]
    allowed = {("checkpoints/layout.py", "JobStore(base.PrefixedStorage)"): "a view of a store"}
    assert check.spread_classes(package, allowed=allowed) == [
        (package / "storage" / "s3.py", 2, "S3Storage(S3Connection)")]
    assert check.spread_classes(package, interfaces=frozenset(), allowed=allowed) == [
        (package / "storage" / "s3.py", 2, "S3Storage(S3Connection)"),
        (package / "storage" / "s3_client.py", 2, "S3Connection(Storage)"),
    ]


def test_a_class_built_on_another_module_s_protocol_is_not_reported(tmp_path: Path) -> None:
    """A ``Protocol`` states what a function uses of its argument: a class declaring
    more of it is an interface, found without listing it (`check_structure.protocols`)."""
    package = _package(tmp_path, "sp_proto", {
        "__init__.py": "",
        "operators/__init__.py": "from typing import Protocol\nclass Named(Protocol): ...\n",
        "operators/publish.py": "import typing\nclass Finishing(typing.Protocol): ...\nclass Done: ...\n",
        "operators/client.py": ("from sp_proto.operators import Named\nfrom sp_proto.operators.publish "
                                "import Done, Finishing\nfrom typing import Protocol\n"
                                "class ClientSubmit(Finishing, Named, Protocol): ...\n"
                                "class Run(Done): ...\n"),
    })
    assert check.protocols(package) == {"operators.Named", "operators.publish.Finishing",
                                        "operators.client.ClientSubmit"}
    assert check.spread_classes(package, interfaces=frozenset()) == [
        (package / "operators" / "client.py", 5, "Run(Done)")]


def test_every_listed_spread_class_still_exists() -> None:
    """`SPREAD_ALLOWED` only shrinks: an entry whose class no longer builds on that base
    (cut, renamed) is removed, not left to excuse a later one."""
    found = {(path.relative_to(REPO / "airflow_sparkpoint").as_posix(), cls) for path, _, cls in
             check.spread_classes(REPO / "airflow_sparkpoint", allowed={})}
    assert set(check.SPREAD_ALLOWED) - found == set()


def test_a_set_of_another_object_s_private_attribute_is_reported_unless_listed(tmp_path: Path) -> None:
    """Issue #47: the submit operator's deploy-mode modules set its private attributes
    (``op._detached = process``); a class's private state is set by its own class."""
    package = _package(tmp_path, "sp_sets", {
        "__init__.py": "",
        "a.py": ("class A:\n    def f(self, other):\n        self._x = 1\n        other._y = 2\n"
                 "        cls._z = 3\n        other.__dict__ = {}\n"),  # its own, a dunder: fine
        "ops/b.py": ("def g(op, state):\n    op._hook = None\n    state.detached = 1\n    op._n += 1\n"
                     "    x, (op._t, y) = 1, (2, 3)\n    op._a: int = 4\n    n = op._hook\n"),
    })
    assert check.private_sets(package) == [
        (package / "a.py", 4, "other._y"),
        (package / "ops" / "b.py", 2, "op._hook"),
        (package / "ops" / "b.py", 4, "op._n"),
        (package / "ops" / "b.py", 5, "op._t"),
        (package / "ops" / "b.py", 6, "op._a"),
    ]
    assert check.private_sets(package, allowed={("ops/b.py", "op._hook"): "why"})[1:2] == [
        (package / "ops" / "b.py", 4, "op._n")]
    assert check.private_sets(REPO / "airflow_sparkpoint") == [], "no module sets another's private state"


def test_every_listed_private_set_still_exists() -> None:
    """`PRIVATE_SETS_ALLOWED` only shrinks: an entry no module makes any more is removed."""
    found = {(path.relative_to(REPO / "airflow_sparkpoint").as_posix(), name) for path, _, name in
             check.private_sets(REPO / "airflow_sparkpoint", allowed={})}
    assert set(check.PRIVATE_SETS_ALLOWED) - found == set()


def test_an_import_of_another_test_package_is_reported(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(check, "CROSS_PACKAGE_ALLOWED",
                        {("integration/test_submit_deferred.py", "tests.e2e.support"): "its reason"})
    tests = _package(tmp_path, "tests", {
        "__init__.py": "",
        "support/__init__.py": "",
        "support/helpers.py": "from tests.chaos.harness import x\n",  # support shares nothing upward
        "chaos/__init__.py": "",
        # own, support
        "chaos/harness.py": "from tests.chaos.cases import y\nfrom tests.support.helpers import z\n",
        "security/__init__.py": "",
        "security/test_s.py": "def test_s():\n    from tests.chaos.harness import write_inputs\n",  # lazy
        "unit/__init__.py": "",
        "unit/test_r.py": "import tests.chaos.record\n",
        "integration/__init__.py": "",
        # allowed, with its reason
        "integration/test_submit_deferred.py": "from tests.e2e.support import stack\n",
    })
    assert check.cross_package_test_imports(tests) == [
        (tests / "security" / "test_s.py", 2, "tests.chaos.harness"),
        (tests / "support" / "helpers.py", 1, "tests.chaos.harness"),
        (tests / "unit" / "test_r.py", 1, "tests.chaos.record"),
    ]


def test_a_job_script_importing_more_than_the_job_author_s_api_is_reported(tmp_path: Path) -> None:
    files = {
        "dags/jobs/ok.py": ("from airflow_sparkpoint.runtime import SparkpointJob\n"
                            "from airflow_sparkpoint.sinks import DeltaSink\n"),
        "dags/jobs/bad.py": ("def main():\n    from airflow_sparkpoint.checkpoints.run_result "
                             "import result_line\n"
                             "from airflow_sparkpoint import faults\n"),  # pause points: the runtime's conf
        "tests/races/jobs/bad.py": ("import airflow_sparkpoint.process_exit\nfrom airflow_sparkpoint "
                                    "import checkpoints\n"),
        "tests/races/helper.py": "from airflow_sparkpoint.checkpoints import Catalog\n",  # no job script
        # a private helper of the job scripts is one too: no exception for any file
        "tests/chaos/jobs/_chaosjob.py": ("from airflow_sparkpoint.runtime import SparkpointJob\n"
                                          "def pace():\n"
                                          "    from airflow_sparkpoint.checkpoints import Catalog\n"),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert check.job_script_imports(tmp_path) == [
        (tmp_path / "dags/jobs/bad.py", 2, "airflow_sparkpoint.checkpoints.run_result"),
        (tmp_path / "dags/jobs/bad.py", 3, "airflow_sparkpoint.faults"),
        (tmp_path / "tests/chaos/jobs/_chaosjob.py", 3, "airflow_sparkpoint.checkpoints"),
        (tmp_path / "tests/races/jobs/bad.py", 1, "airflow_sparkpoint.process_exit"),
        (tmp_path / "tests/races/jobs/bad.py", 2, "airflow_sparkpoint.checkpoints"),
    ]


def test_no_test_package_imports_another_and_job_scripts_import_only_the_job_author_s_api() -> None:
    crossing = check.cross_package_test_imports(REPO / "tests")
    assert crossing == [], \
        "\n".join(f"{path.relative_to(REPO)}:{line}: {module}" for path, line, module in crossing)
    scripts = check.job_script_imports(REPO)
    assert scripts == [], \
        "\n".join(f"{path.relative_to(REPO)}:{line}: {module}" for path, line, module in scripts)
    for file, _module in check.CROSS_PACKAGE_ALLOWED:  # an exception whose file is gone is dropped
        assert (REPO / "tests" / file).is_file(), file


def test_an_exception_class_outside_the_error_tree_is_reported(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    package = _package(tmp_path, "sp_errors", {
        "__init__.py": "",
        "exceptions.py": "class BaseErr(Exception): ...\nclass Sub(BaseErr): ...\n",  # the tree: fine
        "runtime/__init__.py": "",
        "runtime/a.py": "class Plain(ValueError): ...\n",  # a builtin's
        # the tree's, two down
        "runtime/b.py": ("from sp_errors.exceptions import Sub\nclass Deeper(Sub): ...\n"
                         "def f():\n    class Local(KeyError): ...\n"),  # inside a function too
        "operators/__init__.py": "",
        "operators/c.py": ("from airflow.sdk.exceptions import AirflowException\nclass "
                           "Failed(AirflowException): ...\n"),
        "services/__init__.py": "",
        # a record type named *Error is no exception, nor is a class built on it
        "services/d.py": ("class DriverError:\n    pass\nclass Detailed(DriverError): "
                          "...\nclass Fine(object): ...\n"),
    })
    assert check.errors_outside_tree(package) == [
        (package / "operators" / "c.py", 2, "Failed"),
        (package / "runtime" / "a.py", 1, "Plain"),
        (package / "runtime" / "b.py", 2, "Deeper"),
        (package / "runtime" / "b.py", 4, "Local"),
    ]
    monkeypatch.syspath_prepend(str(tmp_path))  # `problems` also looks for import cycles
    assert sum("outside exceptions.py" in p for p in check.problems(package)) == 4


def test_every_error_of_the_package_is_in_the_tree_but_the_listed_airflow_derived_ones() -> None:
    package = REPO / "airflow_sparkpoint"
    found = check.errors_outside_tree(package)
    assert found == [], "\n".join(f"{path.relative_to(REPO)}:{line}: {name}" for path, line, name in found)
    for file, name in check.ERRORS_ELSEWHERE:  # an exception whose class is gone is dropped
        assert f"class {name}(" in (package / file).read_text(encoding="utf-8"), (file, name)
