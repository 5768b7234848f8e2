"""docs/ARCHITECTURE.md names real modules and real names: every ``path.py`` (under
``airflow_sparkpoint/``) or package ``dir/`` it cites exists, and every name cited beside a
module in the concept table is defined at that module's top level (a ``Class.member``: in
that class)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "airflow_sparkpoint"
TEXT = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
MODULE = re.compile(r"^(?:[a-z_][a-z0-9_]*/)*[a-z_][a-z0-9_]*\.py$")  # s3.py too


def _exists(cited: str) -> bool:
    """A path under the package or the repository, or a bare module name some package holds."""
    if any((base / cited).exists() for base in (PACKAGE, ROOT)):
        return True
    return "/" not in cited and any(PACKAGE.rglob(cited))


def _store_prefixes() -> set[str]:
    """The top-level prefixes of a job's store (`checkpoints/layout.py`'s constants)."""
    from airflow_sparkpoint.checkpoints import layout

    return {f"{value}/" for value in vars(layout).values() if isinstance(value, str) and value.isidentifier()}


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_every_cited_module_and_package_exists() -> None:
    cited = set(re.findall(r"`([^`\s]+)`", TEXT))
    modules = {c for c in cited if MODULE.match(c)}
    packages = {c for c in cited if re.fullmatch(r"[a-z_]+/", c)}
    assert len(modules) > 40 and "checkpoints/catalog.py" in modules  # the scan read the page
    missing = sorted(c for c in modules | (packages - _store_prefixes()) if not _exists(c))
    assert not missing, f"docs/ARCHITECTURE.md cites what does not exist: {missing}"


def test_every_name_in_the_concept_table_is_defined_in_its_module() -> None:
    section = TEXT[TEXT.index("## Concepts and their one home"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) > 20, "the concept table was found"
    problems = []
    checked = 0
    for row in rows:
        home = row.rstrip(" |").rsplit(" | ", 1)[1]
        for part in home.split(";"):
            tokens = re.findall(r"`([^`]+)`", part)
            modules = [t for t in tokens if MODULE.match(t) and (PACKAGE / t).is_file()]
            for name in (t for t in tokens if re.fullmatch(r"[A-Za-z_]\w*", t)):
                if not modules:
                    problems.append(f"{name}: no module beside it in {part.strip()!r}")
                elif not any(name in _top_level_names(PACKAGE / m) for m in modules):
                    problems.append(f"{name}: not defined in {modules}")
            for name in (t for t in tokens if re.fullmatch(r"[A-Z]\w*\.[A-Za-z_]\w*", t)):
                checked += 1
                owner, member = name.split(".")
                members = [_members(PACKAGE / m, owner) for m in modules]
                if not any(found is not None and member in found for found in members):
                    problems.append(f"{name}: no class {owner} with {member} in {modules}")
    assert checked > 5, "the scan found Class.member names"
    assert not problems, "\n".join(problems)


def _members(path: Path, owner: str) -> set[str] | None:
    """The names class `owner` defines in module `path` (methods, class attributes, the
    attributes its methods set on ``self``), or None when the module has no such class."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name == owner:
            names = set()
            for inner in ast.walk(node):
                if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(inner.name)
                targets = inner.targets if isinstance(inner, ast.Assign) else \
                    [inner.target] if isinstance(inner, ast.AnnAssign) else []
                for target in targets:
                    if isinstance(target, ast.Name):
                        names.add(target.id)
                    elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id == "self":
                        names.add(target.attr)
            return names
    return None


def test_every_module_is_cited_by_the_page() -> None:
    """Each module of the package (a package's ``__init__``, ``__main__`` and a deprecated
    alias excepted) is cited by its path, so the page names its concern (issue 47)."""
    cited = {c for c in re.findall(r"`([^`\s]+)`", TEXT) if MODULE.match(c)}
    modules = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
               if path.name not in ("__init__.py", "__main__.py")
               and not path.read_text(encoding="utf-8").lstrip('"').startswith("Deprecated alias")}
    uncited = {m for m in modules if m not in cited}
    assert len(modules) > 100 and "checkpoints/catalog.py" in modules  # the scan found the package
    assert not uncited, \
        f"modules docs/ARCHITECTURE.md does not cite (name each one's concern): {sorted(uncited)}"
