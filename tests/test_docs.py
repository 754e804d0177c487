"""The documentation cannot rot: the mkdocs site builds under --strict (every page in the nav, every
link between pages and its anchor resolves), every repository path the README and docs/ name
exists, every ringzero module (and the name after it) they name in code exists, and every relative
link in them points at a file that exists.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "ringzero"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Paths relative to the repository root, and the sub-packages of src/ringzero that the text names
# without their prefix (`plan/step_time.py`, `parallel/zero/`).
ROOT_DIRS = ("src", "tests", "benchmarks", "docs")
PACKAGE_DIRS = tuple(sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()))
# A file name, or a folder named with its trailing slash; `*` stands for any file in a folder.
PATHLIKE = re.compile(r"[A-Za-z0-9_.*-]+(?:/[A-Za-z0-9_.*-]+)*/?")
FILE_END = re.compile(r"(\.[A-Za-z]{1,5}|/|/\*)$")
PROSE_PATH = re.compile(r"(?<![\w/.-])(?:%s)/[A-Za-z0-9_./*-]*[A-Za-z0-9_*/]" % "|".join(ROOT_DIRS))
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _code_spans(text: str) -> list[str]:
    """Fenced blocks and inline code: where the text writes paths and commands."""
    spans = [m.group(0) for m in FENCE.finditer(text)]
    spans += [m.group(2) for m in INLINE.finditer(FENCE.sub("", text))]
    return spans


def _repo_path(token: str) -> Path | None:
    """The file a token of code names, when it looks like one of this repository's files."""
    token = token.rstrip(".")
    if "/" not in token or token.startswith("/") or not FILE_END.search(token):
        return None
    head = token.split("/", 1)[0]
    if head in ROOT_DIRS:
        return ROOT / token
    if head in PACKAGE_DIRS:
        return PACKAGE / token
    return None


def _exists(path: Path) -> bool:
    if "*" in path.as_posix():
        return any(path.parent.glob(path.name)) if path.parent.is_dir() else False
    return path.exists()


def _missing_paths(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    tokens = [token for span in _code_spans(text) for token in PATHLIKE.findall(span)]
    # Prose names test files too ("(tests/test_zeropp.py, ...)"); there only the root folders count,
    # since "plan/run" or "forward/backward" are words, not paths.
    tokens += PROSE_PATH.findall(INLINE.sub("", FENCE.sub("", text)))
    missing = []
    for token in tokens:
        path = _repo_path(token)
        if path is not None and not _exists(path):
            missing.append(token)
    return missing


def _broken_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    text = INLINE.sub("", text)
    broken = []
    for m in LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # another site, or an anchor on this page (mkdocs checks those in docs/)
        if not (page.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    return broken


DOTTED = re.compile(r"(?<![\w/.-])(?:ringzero\.)?[a-z_]+(?:\.[A-Za-z_]\w*)+")
MODULES = tuple(sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"))


def _defined(source: Path) -> set[str]:
    """Names a module defines or imports at its top level, and the names it exports lazily
    (string keys of a module-level table, as `ringzero.comm`'s PEP 562 `__getattr__` reads)."""
    names = set()
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
            if isinstance(node.value, ast.Dict):
                names.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return names


def _dotted_problem(token: str) -> str | None:
    """Why a dotted name such as `plan.strategies.memory.model_states` names nothing, if it does not."""
    parts = token.split(".")
    if parts[0] == "ringzero":
        parts = parts[1:]
    if not parts or parts[0] not in PACKAGE_DIRS + MODULES or parts[-1] in ("py", "md", "json", "png"):
        return None
    for i in range(len(parts), 0, -1):
        base = PACKAGE.joinpath(*parts[:i])
        for source in (base.with_suffix(".py"), base / "__init__.py"):
            if source.exists():
                rest = parts[i:]
                if rest and rest[0] not in _defined(source):
                    return f"{token}: no {rest[0]} in {source.relative_to(ROOT)}"
                return None
    return f"{token}: no such module"


@pytest.mark.timeout(120)
def test_mkdocs_strict_build(tmp_path):
    # mkdocs is a dev dependency: a missing one is a failure here, not a skip.
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=110,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # the theme's notice about MkDocs 2.0
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_named_files_exist(page):
    assert _missing_paths(page) == [], f"{page.relative_to(ROOT)} names files that do not exist"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_named_modules_exist(page):
    # `plan.strategies.memory.model_states`, `twin.wait`: a module the text names in code, and the
    # function or class after it, are where the text says.
    spans = _code_spans(page.read_text(encoding="utf-8"))
    problems = [p for s in spans for p in map(_dotted_problem, DOTTED.findall(s)) if p]
    assert problems == [], f"{page.relative_to(ROOT)} names modules or names that do not exist"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    assert _broken_links(page) == [], f"{page.relative_to(ROOT)} links to files that do not exist"


def test_the_checks_see_what_they_check():
    # A check that finds nothing to check passes for the wrong reason: the pages name source files
    # and the README links the pages, and a wrong path in either form is caught.
    texts = [page.read_text(encoding="utf-8") for page in PAGES]
    named = [p for text in texts for s in _code_spans(text) for p in map(_repo_path, PATHLIKE.findall(s)) if p]
    assert len(named) > 100
    assert len(LINK.findall(texts[0])) > 10
    assert _repo_path("plan/no_such_file.py") == PACKAGE / "plan" / "no_such_file.py"
    assert _repo_path("tests/test_docs.py") == ROOT / "tests" / "test_docs.py"
    assert _repo_path("out/site/") is None and _repo_path("ringzero.plan/1") is None
    assert _dotted_problem("plan.strategies.memory.model_states") is None
    assert _dotted_problem("plan.strategies.memory.no_such_name") is not None
    assert _dotted_problem("twin.no_such_module") is not None
    assert PROSE_PATH.findall("(tests/test_zeropp.py, `make run`'s model)") == ["tests/test_zeropp.py"]
