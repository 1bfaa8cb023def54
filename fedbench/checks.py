"""Value checks for config keys: each is a pair ``(ok, allowed)`` — ``ok(value)`` says whether ``value`` is
allowed, ``allowed`` says in words what is (for the one-line ConfigError naming key, value and what is allowed).

Used by the run's config table (:mod:`fedbench.config`), by the algorithms' ``Algorithm.checked_hp`` and by the
diagnostics. Imports nothing of fedbench, so every layer may use it.
"""

from __future__ import annotations

import math
import re


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def int_at_least(lo: int):
    return lambda v: is_int(v) and v >= lo, f"an integer >= {lo}"


def number(lo=None, hi=None, lo_open=False, hi_open=False, optional=False):
    def ok(v):
        if v is None:
            return optional
        if not _is_num(v):
            return False
        if lo is not None and (v <= lo if lo_open else v < lo):
            return False
        if hi is not None and (v >= hi if hi_open else v > hi):
            return False
        return True

    lb = "(" if lo_open or lo is None else "["  # an infinite end is never included: non-finite values are refused
    rb = ")" if hi_open or hi is None else "]"
    rng = f"{lb}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{rb}"
    return ok, f"a number in {rng}" + (" or null" if optional else "")


def one_of(*choices):
    return lambda v: v in choices, "one of " + ", ".join(map(str, choices))


def boolean():
    return lambda v: isinstance(v, bool), "true or false"


def device():
    return (
        lambda v: isinstance(v, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", v) is not None,
        "auto, cpu, cuda or cuda:<index>",
    )


def text(optional=False):
    return (
        lambda v: (v is None and optional) or (isinstance(v, str) and v != ""),
        "a non-empty string" + (" or null" if optional else ""),
    )


def list_of(ok_item, allowed: str, length: int | None = None):
    from omegaconf import ListConfig

    return (
        lambda v: (
            isinstance(v, (list, ListConfig)) and (length is None or len(v) == length) and all(ok_item(x) for x in v)
        ),
        allowed,
    )


__all__ = ["is_int", "int_at_least", "number", "one_of", "boolean", "device", "text", "list_of"]
