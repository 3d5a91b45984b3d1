"""``mscclpp.ext``: MSCCL++'s ``AlgorithmCollectionBuilder`` over this library's collectives."""

from __future__ import annotations

from . import Algorithm, AlgorithmCollection, _default_algorithms

__all__ = ["AlgorithmCollectionBuilder"]


class AlgorithmCollectionBuilder:
    """One per process, as MSCCL++'s (``AlgorithmCollectionBuilder()`` returns the same
    object). ``build_default_algorithms`` returns MSCCL++'s default algorithms by name."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
            cls._instance._extra = []
            cls._instance._selector = None
            cls._instance._fallback = None
        return cls._instance

    @classmethod
    def reset(cls):
        cls._instance = None

    def add_algorithm_builder(self, algorithm_builder):
        if isinstance(algorithm_builder, Algorithm) and algorithm_builder.is_dsl_algorithm():
            self._extra.append(algorithm_builder)
            return
        raise ValueError("The 'algorithm_builder' argument must be a DSL Algorithm "
                         "(mscclpp.compile's result); native builders are MSCCL++'s C++")

    def set_algorithm_selector(self, selector):
        self._selector = selector

    def set_fallback_algorithm_selector(self, selector):
        self._fallback = selector

    def build(self) -> AlgorithmCollection:
        return AlgorithmCollection(self._extra)

    def build_default_algorithms(self, scratch_buffer: int, scratch_buffer_size: int,
                                 rank: int) -> AlgorithmCollection:
        """MSCCL++'s default native algorithms (and the DSL algorithms added so far).
        ``scratch_buffer``/``scratch_buffer_size`` are accepted: this library stages through
        buffers of its own."""
        c = _default_algorithms(int(scratch_buffer), int(scratch_buffer_size), int(rank))
        for a in self._extra:
            c.register_algorithm(a.collective, a.name, a)
        return c
