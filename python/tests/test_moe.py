"""The expert-parallel exchange (`Communicator.expert_exchange`: layout, dispatch, combine)
against NumPy on the host backend, ranks as processes."""

import pytest


@pytest.mark.parametrize(
    "experts_per_rank,topk,hidden,tokens",
    [(4, 3, 24, [9, 0, 17]), (8, 8, 40, [33]), (2, 1, 8, [1, 5])],
    ids=["mixed-tokens", "top8", "top1"],
)
def test_expert_exchange(host2, host3, experts_per_rank, topk, hidden, tokens):
    for c in (host2, host3):
        got = c.run("expert_exchange", experts_per_rank=experts_per_rank, topk=topk, hidden=hidden,
                    tokens=tokens)
        assert sum(got) > 0


@pytest.mark.parametrize(
    "experts_per_rank,topk,hidden,tokens,split",
    [(4, 3, 24, [9, 0, 17], False), (8, 8, 40, [33], True), (2, 1, 8, [1, 5], True)],
    ids=["mixed-tokens", "top8-split", "top1-split"],
)
def test_expert_major(host2, host3, experts_per_rank, topk, hidden, tokens, split):
    """The expert-major ("low-latency") form: per-expert layout and weighted combine."""
    for c in (host2, host3):
        got = c.run("expert_exchange_expert_major", experts_per_rank=experts_per_rank, topk=topk,
                    hidden=hidden, tokens=tokens, split=split)
        assert sum(got) > 0
