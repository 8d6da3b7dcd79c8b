"""The package's structure: the import layering (import-linter contracts in pyproject.toml), argument
parsing only in ``rgtune.cli``, and no dated experiment results in the product's docstrings."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "rgtune"


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter's contracts of pyproject.toml, checked on the ``rgtune`` package found under ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "importlinter.cli"]
    return subprocess.run([*cmd, "--config", str(REPO / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_every_package_imports_only_the_packages_below_it():
    r = _lint_imports(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 kept, 0 broken" in r.stdout


def test_an_upward_import_breaks_the_layering(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "rgtune", ignore=shutil.ignore_patterns("__pycache__"))
    program = tmp_path / "rgtune" / "ir" / "program.py"
    program.write_text(program.read_text() + "\nfrom rgtune.tuner import study  # noqa: E402,F401 - deliberately upward\n")
    r = _lint_imports(tmp_path)
    assert r.returncode != 0
    assert "BROKEN" in r.stdout and "rgtune.ir.program -> rgtune.tuner.study" in r.stdout, r.stdout


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_only_the_cli_parses_arguments():
    parsers = []
    for path in _modules():
        if PACKAGE / "cli" in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] in ("argparse", "click", "optparse") for n in names):
                parsers.append(str(path.relative_to(REPO)))
    assert parsers == []


def test_no_docstring_or_comment_carries_dated_experiment_results():
    dated = []
    for path in _modules():
        if "migrations" in path.parts:  # an Alembic revision records when it was written
            continue
        text = path.read_text()
        tree = ast.parse(text)
        docs = [ast.get_docstring(n) or "" for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        comments = [ln for ln in text.splitlines() if ln.lstrip().startswith("#")]
        dated += [f"{path.relative_to(REPO)}: {line.strip()}" for doc in (*docs, *comments)
                  for line in doc.splitlines() if re.search(r"\b20\d\d-\d\d-\d\d\b|\bsession \d+\b", line)]
    assert dated == []


def _imported_by(statement: str, modules: tuple[str, ...]) -> list[str]:
    code = f"import sys\n{statement}\nprint(sorted(m for m in {modules!r} if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    return ast.literal_eval(r.stdout.strip())


def test_loading_an_exported_layer_needs_no_database_and_no_tuner():
    heavy = ("sqlalchemy", "alembic", "optuna", "sklearn", "rgtune.tuner", "rgtune.costmodel", "rgtune.db.database")
    assert _imported_by("from rgtune.runtime import load_exported", heavy) == []


def test_the_command_line_starts_without_the_database_or_the_cost_model():
    assert _imported_by("import rgtune.cli", ("sqlalchemy", "alembic", "optuna", "sklearn", "rgtune.costmodel")) == []


def _backend_name_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """Where code outside the backends names one by a string: a comparison of a backend, its ``name`` or
    ``target`` with a backend's name, ``backend="..."`` in a call or a signature, ``create("...")``, and
    the name ``"reference"`` anywhere in code (docstrings may name them: their examples do)."""
    names = {"cpu", "cuda", "reference"}
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}

    def named(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings

    def backendish(node: ast.AST) -> bool:
        text = ast.unparse(node)
        return "backend" in text.lower() or text.endswith((".target", ".name")) or text in ("be", "target")

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(named(s) for s in sides) and any(backendish(s) for s in sides if not named(s)):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call):
            if ast.unparse(node.func).split(".")[-1] == "create" and node.args and named(node.args[0]):
                found.append((node.lineno, ast.unparse(node)))
            found += [(node.lineno, ast.unparse(k)) for k in node.keywords if k.arg == "backend" and named(k.value)]
        elif isinstance(node, ast.arguments):
            pos = node.posonlyargs + node.args
            pairs = list(zip(pos[len(pos) - len(node.defaults):], node.defaults)) + \
                [(a, d) for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None]
            found += [(d.lineno, f"{a.arg}={d.value!r}") for a, d in pairs if a.arg == "backend" and named(d)]
        elif named(node) and node.value == "reference":
            found.append((node.lineno, repr(node.value)))
    return sorted({line: text for line, text in reversed(found)}.items())  # one finding a line


def test_no_backend_is_named_by_a_string_outside_the_backends():
    """A backend is what it declares (rgtune.codegen.base.Backend: device_type, dtypes, training, ...):
    code outside rgtune/codegen/ reads those, and never tells one backend from another by its name."""
    offenders = []
    for path in _modules():
        if PACKAGE / "codegen" in path.parents:
            continue
        offenders += [f"{path.relative_to(REPO)}:{line}: {text}" for line, text in _backend_name_uses(
            ast.parse(path.read_text()))]
    assert not offenders, "\n".join(offenders)


def test_the_backend_name_check_finds_what_it_looks_for():
    code = ('def f(backend="cpu"):\n    if be.target == "cuda": pass\n    create("reference")\n'
            '    g(backend="cuda")\n    x = "reference"\n    if device.type == "cuda": pass\n')
    assert [line for line, _ in _backend_name_uses(ast.parse(code))] == [1, 2, 3, 4, 5]
