"""``mscclpp.default_algos``: MSCCL++'s DSL algorithms (``allreduce_multi_nodes``, ...), loaded
from where MSCCL++'s DSL is installed (see ``_dsl``)."""

from . import _dsl

__path__ = _dsl.paths("default_algos")


def __getattr__(name):
    import sys

    return _dsl.attr(sys.modules[__name__], "default_algos", name)
