"""The one-home rule of local filesystem calls (`scripts/check_local_fs.py`, run by `make
lint`): no ``shutil.rmtree``, ``os.replace``, ``os.listdir``... outside
``storage/localfs.py`` unless allowed with a reason. Checked on a synthetic package (so
the check can fail) and on the package itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.paths import REPO, load_module

check = load_module("check_local_fs", REPO / "scripts" / "check_local_fs.py")


def _package(root: Path, files: dict[str, str]) -> Path:
    package = root / "airflow_sparkpoint"
    for relative, text in files.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_every_spelling_of_a_raw_call_is_found_outside_the_layer(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    package = _package(tmp_path, {
        "__init__.py": "",
        "storage/localfs.py": "import os\n\ndef remove(p):\n    os.unlink(p)\n",  # the home: not reported
        "sinks/a.py": "import os\nimport shutil\n\nclass S:\n    def drop(self, p):\n        "
                      "shutil.rmtree(p)\n        os.listdir(p)\n",
        "runtime/b.py": "import os as o\nfrom shutil import move as mv\nfrom os import scandir\n\n"
                        "def f(p):\n    o.replace(p, p)\n    mv(p, p)\n    return list(scandir(p))\n",
        "runtime/c.py": ("import os\n\ndef g(p):\n    return os.path.join(p, 'x'), os.stat(p), "
                         "'a'.replace('a', 'b')\n"),
        "allowed.py": "import os\n\ndef tidy(p):\n    os.unlink(p)\n",
    })
    monkeypatch.setattr(check, "ALLOWED",
                        {("airflow_sparkpoint/allowed.py", "tidy", "os.unlink"): "its own temp"})
    assert check.raw_calls(package) == [
        ("airflow_sparkpoint/allowed.py", 4, "tidy", "os.unlink"),
        ("airflow_sparkpoint/runtime/b.py", 6, "f", "os.replace"),
        ("airflow_sparkpoint/runtime/b.py", 7, "f", "shutil.move"),
        ("airflow_sparkpoint/runtime/b.py", 8, "f", "os.scandir"),
        ("airflow_sparkpoint/sinks/a.py", 6, "S.drop", "shutil.rmtree"),
        ("airflow_sparkpoint/sinks/a.py", 7, "S.drop", "os.listdir"),
    ]
    found = check.problems(package)
    assert len(found) == 5 and not any("allowed.py" in line for line in found), found
    assert found[0].startswith("airflow_sparkpoint/runtime/b.py:6: os.replace in f:"), found[0]


def test_an_allowance_that_matches_no_call_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = _package(tmp_path, {"__init__.py": "", "x.py": "import os\n"})
    monkeypatch.setattr(check, "ALLOWED", {("airflow_sparkpoint/x.py", "gone", "os.unlink"): "was a temp"})
    assert check.problems(package) == [
        ("scripts/check_local_fs.py: ALLOWED names os.unlink in airflow_sparkpoint/x.py gone, which no "
         "longer calls it; remove the entry")]


def test_the_package_makes_no_raw_call_outside_the_layer() -> None:
    assert check.problems(REPO / "airflow_sparkpoint") == []
    assert len(check.ALLOWED) <= 12, "keep the allowed calls few: port them to storage/localfs.py"
