"""Algorithm registry: ``conf/algorithm/<name>.yaml`` selects ``ALGORITHMS[name]``."""

from __future__ import annotations

import importlib
import pkgutil

from .base import Algorithm

ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    ALGORITHMS[cls.name] = cls
    return cls


def _load_all() -> None:
    for mod in pkgutil.iter_modules(__path__):
        if mod.name != "base":
            importlib.import_module(f"{__name__}.{mod.name}")


_load_all()

__all__ = ["ALGORITHMS", "Algorithm", "register"]
