"""Where MSCCL++'s DSL (its pure-Python ``mscclpp.language`` and ``mscclpp.default_algos``) is
found: ``MSCCLPP_DSL_PATH`` (a directory holding ``language/``, e.g. a checkout's
``python/mscclpp``), else a real MSCCL++ package installed on ``sys.path``. The DSL is
MSCCL++'s own code: it is loaded from there under its own names, never shipped here."""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from typing import List, Optional


class DslUnavailable(ImportError):
    """MSCCL++'s DSL is not installed (or ``mscclpp`` is not this package)."""


def root() -> Optional[str]:
    env = os.environ.get("MSCCLPP_DSL_PATH")
    if env:
        return env if os.path.isdir(os.path.join(env, "language")) else None
    spec = importlib.machinery.PathFinder.find_spec("mscclpp", sys.path)
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if os.path.isdir(os.path.join(loc, "language")):
            return loc
    return None


def paths(sub: str) -> List[str]:
    r = root()
    return [os.path.join(r, sub)] if r and os.path.isdir(os.path.join(r, sub)) else []


def attr(module, sub: str, name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    top = f"mscclpp.{sub}"
    if sys.modules.get(top) is not module:
        raise DslUnavailable(
            f"mscclpp_rs.mscclpp.{sub}.{name}: MSCCL++'s DSL runs under the name 'mscclpp' only: "
            "set MSCCLPP_RS=1 or call mscclpp_rs.compat.install(), or import a real MSCCL++'s "
            "DSL and pass its programs to mscclpp_rs.mscclpp.compile")
    if not module.__path__:
        raise DslUnavailable(
            f"mscclpp.{sub}.{name}: MSCCL++'s DSL (its Python package, MSCCL++'s own code) is not "
            "installed; set MSCCLPP_DSL_PATH to a directory holding its language/ and "
            "default_algos/ (MSCCL++'s python/mscclpp) or install MSCCL++'s Python package")
    try:
        sub_mod = importlib.import_module(f"{top}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{top}.{name}":
            raise
        sub_mod = None
    if sub_mod is not None:
        if sub != "default_algos":
            return sub_mod
        # default_algos' functions are named as their modules. Importing the module bound the
        # name to it on the package, so later lookups would find the module, not the function:
        # bind the function, as MSCCL++'s own default_algos/__init__ does.
        fn = getattr(sub_mod, name, sub_mod)
        setattr(module, name, fn)
        return fn
    if sub == "language":  # MSCCL++'s language/__init__ re-exports its utils (AlgoSpec, ...)
        return getattr(importlib.import_module(f"{top}.utils"), name)
    raise AttributeError(f"module {top!r} has no attribute {name!r}")
