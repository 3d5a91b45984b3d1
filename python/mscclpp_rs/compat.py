"""Opt-in: make ``import mscclpp`` give ``mscclpp_rs.mscclpp`` (MSCCL++'s Python API over this
library). Nothing changes unless the user asks:

- ``MSCCLPP_RS=1`` in the environment: the wheel's ``mscclpp_rs_compat.pth`` calls
  ``install()`` at interpreter start-up, before any ``import mscclpp`` (unchanged programs such as
  SGLang then run on this library, even where a real MSCCL++ is installed);
- ``mscclpp_rs.compat.install()`` in code, before ``mscclpp`` is imported.

``MSCCLPP_RS_DEEP_EP=1`` (or ``install_deep_ep()``) does the same for ``import deep_ep``: DeepEP's
``Buffer`` over this library (``mscclpp_rs.deep_ep``).

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


def install_deep_ep():
    """Registers ``deep_ep`` as ``mscclpp_rs.deep_ep`` (DeepEP's ``Buffer`` over this library);
    returns it. Raises if another ``deep_ep`` was imported already."""
    cur = sys.modules.get("deep_ep")
    if cur is not None and getattr(cur, "IMPLEMENTATION", None) != "mscclpp_rs":
        raise RuntimeError(
            f"mscclpp_rs.compat.install_deep_ep(): another deep_ep ({getattr(cur, '__file__', cur)}) "
            "was imported already; install before importing it (MSCCLPP_RS_DEEP_EP=1 does it at "
            "start-up)")
    ours = importlib.import_module("mscclpp_rs.deep_ep")
    sys.modules["deep_ep"] = ours
    return ours


def installed() -> bool:
    """Whether ``import mscclpp`` gives this package."""
    m = sys.modules.get("mscclpp")
    return m is not None and getattr(m, "IMPLEMENTATION", None) == "mscclpp_rs"


def _startup():
    # Called from mscclpp_rs_compat.pth when MSCCLPP_RS=1 or MSCCLPP_RS_DEEP_EP=1: never let a
    # start-up hook break the interpreter; say why instead.
    import os

    for var, name, fn in (("MSCCLPP_RS", "mscclpp", install),
                          ("MSCCLPP_RS_DEEP_EP", "deep_ep", install_deep_ep)):
        if os.environ.get(var) != "1":
            continue
        try:
            fn()
        except Exception as e:  # pragma: no cover - reported, not raised
            print(f"mscclpp_rs: {var}=1 but '{name}' could not be installed: {e}", file=sys.stderr)


if __name__ == "__main__":
    import mscclpp

    print(getattr(mscclpp, "IMPLEMENTATION", "MSCCL++"), getattr(mscclpp, "__file__", ""))
