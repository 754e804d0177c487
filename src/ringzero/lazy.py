"""A package's names imported on first use (PEP 562), so that importing the package for its
torch-free modules does not import torch."""

from __future__ import annotations

import importlib


def exports(package: str, table: dict[str, str], namespace: dict):
    """(`__getattr__`, `__dir__`) for `package`: name -> the submodule (relative) that defines it;
    a name is imported into `namespace` (the package's globals) the first time it is read."""
    def __getattr__(name: str):
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{table[name]}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))
    return __getattr__, __dir__
