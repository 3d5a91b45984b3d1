"""Opt-in: make ``import mscclpp`` give ``mscclpp_rs.mscclpp`` (MSCCL++'s Python API over this
library). Nothing changes unless the user asks:

- ``MSCCLPP_RS=1`` in the environment: the wheel's ``mscclpp_rs_compat.pth`` calls
  ``install()`` at interpreter start-up, before any ``import mscclpp`` (unchanged programs such as
  SGLang then run on this library, even where a real MSCCL++ is installed);
- ``mscclpp_rs.compat.install()`` in code, before ``mscclpp`` is imported.

Without either, ``import mscclpp`` finds a real MSCCL++ if one is installed (or fails): the wheel
ships no top-level ``mscclpp`` files, so it cannot clash with MSCCL++'s at install time either.
``python -m mscclpp_rs.compat`` prints which one ``import mscclpp`` gives.
"""

from __future__ import annotations

import importlib
import sys

_SUBMODULES = ("ext", "language", "default_algos")


def install():
    """Registers ``mscclpp`` (and ``mscclpp.ext``, ``.language``, ``.default_algos``) as this
    package's modules; returns the ``mscclpp`` module. Raises if another ``mscclpp`` was imported
    already (it cannot be replaced under the modules that hold it)."""
    cur = sys.modules.get("mscclpp")
    if cur is not None and getattr(cur, "IMPLEMENTATION", None) != "mscclpp_rs":
        raise RuntimeError(
            f"mscclpp_rs.compat.install(): another mscclpp ({getattr(cur, '__file__', cur)}) was "
            "imported already; install before importing it (MSCCLPP_RS=1 does it at start-up)")
    ours = importlib.import_module("mscclpp_rs.mscclpp")
    sys.modules["mscclpp"] = ours
    for sub in _SUBMODULES:
        sys.modules[f"mscclpp.{sub}"] = importlib.import_module(f"mscclpp_rs.mscclpp.{sub}")
    return ours


def installed() -> bool:
    """Whether ``import mscclpp`` gives this package."""
    m = sys.modules.get("mscclpp")
    return m is not None and getattr(m, "IMPLEMENTATION", None) == "mscclpp_rs"


def _startup():
    # Called from mscclpp_rs_compat.pth when MSCCLPP_RS=1: never let a start-up hook break the
    # interpreter; say why instead.
    try:
        install()
    except Exception as e:  # pragma: no cover - reported, not raised
        print(f"mscclpp_rs: MSCCLPP_RS=1 but 'mscclpp' could not be installed: {e}", file=sys.stderr)


if __name__ == "__main__":
    import mscclpp

    print(getattr(mscclpp, "IMPLEMENTATION", "MSCCL++"), getattr(mscclpp, "__file__", ""))
