"""The NCCL-compatible C library that ships in the wheel, and its copy for JAX.

``python -m mscclpp_rs.nccl`` prints the library's absolute path and how to load it in place of
NCCL; ``--path`` prints the path alone, ``--preload`` the line for PyTorch (and anything else that
links NCCL by its symbols), ``--jax`` the line for JAX, ``--jax-path`` the JAX copy's path::

    LD_PRELOAD=$(python -m mscclpp_rs.nccl --path) torchrun --nproc-per-node 8 train.py
    eval "$(python -m mscclpp_rs.nccl --jax)"; python train_jax.py

JAX's XLA opens NCCL with ``dlopen("libnccl.so.2")`` and ``dlsym`` on that handle, which the
preload of a library of another name does not reach; and JAX's CUDA plugin first loads the
``nvidia-nccl`` wheel's ``libnccl.so.2`` by its path, so the bare name then resolves to that one.
glibc answers a bare name with the first loaded object whose SONAME is that name: preloading
``lib/nccl/libnccl.so.2`` (this library, SONAME ``libnccl.so.2``, made by the build) puts ours
first. ``LD_LIBRARY_PATH`` on that folder alone works only where no ``nvidia-nccl`` wheel is
installed. The wheel's main copy keeps its own SONAME: under PyTorch ``libnccl.so.2`` would
stand in for the real NCCL that the library falls back to.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import sys

__all__ = ["JAX_LIBRARY_NAME", "LIBRARY_NAME", "jax_library_path", "library_path", "load_for_jax"]

LIBRARY_NAME = "libmscclpp_nccl.so"
# The name XLA dlopen()s, which is also the copy's SONAME and file name.
JAX_LIBRARY_NAME = "libnccl.so.2"

_LIB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
_HOW_TO_BUILD = (
    "build the wheel with maturin from the repository, `pip install ./python`, "
    "or with MSCCLPP_NCCL_SO naming a built libmscclpp_nccl.so"
)


def library_path() -> str:
    """The absolute path of the wheel's ``libmscclpp_nccl.so``; FileNotFoundError if missing."""
    path = os.path.join(_LIB_DIR, LIBRARY_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} is missing: this mscclpp_rs was installed without its C library "
            f"({_HOW_TO_BUILD})"
        )
    return path


def jax_library_path() -> str:
    """The absolute path of the JAX copy, ``lib/nccl/libnccl.so.2`` (SONAME ``libnccl.so.2``,
    alone in its folder); FileNotFoundError if missing."""
    path = os.path.join(_LIB_DIR, "nccl", JAX_LIBRARY_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} is missing: this mscclpp_rs was built before the wheel carried the JAX "
            f"copy of its C library ({_HOW_TO_BUILD})"
        )
    return path


def load_for_jax() -> ctypes.CDLL:
    """Loads the JAX copy into this process, so that XLA's ``dlopen("libnccl.so.2")`` returns
    it: the in-program alternative to ``LD_PRELOAD``. Call it before JAX initializes its
    backends (before ``import jax`` is safest). RuntimeError if another ``libnccl.so.2`` is
    loaded already (then the bare name resolves to that one, and it is too late)."""
    path = jax_library_path()
    mode = getattr(os, "RTLD_NOLOAD", 0)
    if mode:
        try:
            # RTLD_NOLOAD: only asks which object the bare name resolves to now.
            already = ctypes.CDLL(JAX_LIBRARY_NAME, mode=mode | os.RTLD_LOCAL)
        except OSError:
            already = None
        if already is not None and not hasattr(already, "mscclppNcclShim"):
            raise RuntimeError(
                f"another {JAX_LIBRARY_NAME} (the real NCCL) is loaded already, so XLA would "
                f"get that one: call load_for_jax() before JAX starts, or start Python with "
                f"LD_PRELOAD={path}"
            )
    return ctypes.CDLL(path, mode=os.RTLD_LOCAL)


def _preload_line(path: str) -> str:
    # Keeps a preload the user has already (e.g. an allocator); LD_PRELOAD splits on ':'.
    return f"export LD_PRELOAD={shlex.quote(path)}${{LD_PRELOAD:+:$LD_PRELOAD}}"


def _usage(path: str, jax: str | None) -> str:
    lines = [
        path,
        "",
        "# PyTorch, CuPy, nccl-tests: anything that links or dlopens NCCL by its symbols",
        f"LD_PRELOAD={path} torchrun --nproc-per-node 8 train.py",
        "# (for a whole shell: python -m mscclpp_rs.nccl --preload prints the export line)",
        "",
        "# JAX: XLA dlopen()s libnccl.so.2, and JAX loads the nvidia-nccl wheel's copy first;",
        "# preloading this library's copy named libnccl.so.2 makes that name resolve to it",
        "# (python -m mscclpp_rs.nccl --jax prints this line alone, for eval)",
    ]
    if jax is None:
        lines.append("# (this install has no JAX copy: rebuild the wheel, `pip install ./python`)")
    else:
        lines += [
            _preload_line(jax),
            f"# {os.path.dirname(jax)} holds only {JAX_LIBRARY_NAME}; LD_LIBRARY_PATH on it "
            "works only where no nvidia-nccl wheel is installed",
            "# (only for JAX: under PyTorch that SONAME would hide the real NCCL used as fallback)",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mscclpp_rs.nccl",
        description="Print where the NCCL-compatible library in this wheel is and how to load "
        "it in place of NCCL (with no option: the path, then the PyTorch and the JAX lines).",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--path", action="store_true", help="print the library's absolute path only")
    which.add_argument(
        "--preload",
        action="store_true",
        help="print the shell line that preloads the library (PyTorch, CuPy, nccl-tests)",
    )
    which.add_argument(
        "--jax",
        action="store_true",
        help="print the shell line for JAX: export LD_PRELOAD=<the copy named libnccl.so.2> "
        '(eval "$(python -m mscclpp_rs.nccl --jax)")',
    )
    which.add_argument(
        "--jax-path", action="store_true", help="print the JAX copy's absolute path only"
    )
    args = parser.parse_args(argv)
    try:
        if args.jax or args.jax_path:
            jax = jax_library_path()
            print(jax if args.jax_path else _preload_line(jax))
            return 0
        path = library_path()
        if args.path or args.preload:
            print(path if args.path else _preload_line(path))
            return 0
        try:
            jax = jax_library_path()
        except FileNotFoundError:
            jax = None
        print(_usage(path, jax))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
