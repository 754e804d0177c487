"""The tree's architecture, read from the source's own imports (every `import` and `from ... import`
of every file under src/ringzero, at module level or inside a function; `if TYPE_CHECKING:` blocks
too, since a reader follows them as well):

- no import circle anywhere in src/ (a module that reaches itself through its imports);
- the pillars point down: `train` -> `twin` -> `run` -> `plan`; `plan` imports nothing of ringzero and
  no torch, `run` and `twin` import no torch (nor anything that does), `comm` imports no
  `parallel`, `train`, `twin` or `run`, `parallel` imports no `train`, `twin` or `run`;
- no source file over 300 lines.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC / "ringzero"
MAX_LINES = 300


def _module(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _files() -> dict[str, Path]:
    return {_module(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The ringzero module an imported name lands in (a module, or the package holding the name)."""
    mods = _files()
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


@cache
def imports(module: str) -> frozenset[str]:
    """Every name `module` imports, absolute: ringzero modules and outside packages' top names."""
    path = _files()[module]
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names if _resolve(f"{mod}.{a.name}") == f"{mod}.{a.name}"}
    return frozenset(out)


@cache
def edges(module: str) -> frozenset[str]:
    """The ringzero modules `module` imports (a package's `__init__` counts as the package)."""
    out = set()
    for name in imports(module):
        if name == "ringzero" or name.startswith("ringzero."):
            target = _resolve(name)
            if target and target != module:
                out.add(target)
    return frozenset(out)


def _circles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan 1972)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in _files():
        if v not in index:
            visit(v)
    return out


def _reach(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for w in edges(todo.pop()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def _pillar(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_import_circles():
    circles = _circles()
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


FORBIDDEN = {
    "plan": {"comm", "parallel", "run", "twin", "train", "checkpoint", "commands", "bench", "launch"},
    "run": {"parallel", "twin", "train", "commands", "bench", "launch"},
    "twin": {"parallel", "train", "commands", "bench", "launch"},
    "comm": {"parallel", "run", "twin", "train", "checkpoint", "commands", "bench"},
    "parallel": {"run", "twin", "train", "checkpoint", "commands", "bench"},
    "trace": {"comm", "parallel", "run", "twin", "train", "checkpoint", "commands", "bench", "launch"},
    "page": {"comm", "parallel", "run", "twin", "train", "checkpoint", "commands", "bench", "launch"},
    "simulate": {"comm", "parallel", "run", "twin", "train", "checkpoint", "commands", "bench", "launch",
                 "trace", "page"},
}
"""What each layer must not import, directly or through another module."""


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_the_layers_point_down(layer):
    bad = []
    for module in _files():
        if _pillar(module) != layer:
            continue
        for target in sorted(_reach(module)):
            if _pillar(target) in FORBIDDEN[layer]:
                bad.append(f"{module} -> {target}")
    assert not bad, f"{len(bad)} arrows up from {layer}/:\n" + "\n".join(bad[:40])


@pytest.mark.parametrize("layer", ["plan", "run", "twin", "trace", "page", "simulate"])
def test_the_torch_free_layers_import_no_torch(layer):
    """Nor through another ringzero module (the checks before ranks start must stay fast)."""
    bad = []
    for module in _files():
        if _pillar(module) != layer:
            continue
        for m in {module} | {t for t in _reach(module)}:
            torchy = sorted(n for n in imports(m) if n.split(".")[0] == "torch")
            if torchy:
                bad.append(f"{module}: {m} imports {torchy[0]}")
                break
    assert not bad, "\n".join(bad[:40])


def test_plan_imports_nothing_of_ringzero_outside_plan():
    bad = [f"{m} -> {t}" for m in _files() if _pillar(m) == "plan" for t in edges(m) if _pillar(t) != "plan"]
    assert not bad, "\n".join(bad)


def test_no_file_is_over_300_lines():
    long = {str(p.relative_to(SRC)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_the_reader_sees_the_imports():
    """The graph this file reads is the real one: a known arrow and a known absence."""
    assert "ringzero.plan.model.shapes" in _reach("ringzero.run.config")
    assert "ringzero.train.engine" not in _reach("ringzero.run.config")
