"""``mscclpp.language``: MSCCL++'s DSL, loaded from where it is installed (see ``_dsl``)."""

from . import _dsl

__path__ = _dsl.paths("language")


def __getattr__(name):
    import sys

    return _dsl.attr(sys.modules[__name__], "language", name)
