"""The stub's relevance score and pair token count (stub/rerank.py): pure. (Its endpoints over
a loopback socket: test_media.py.)"""

from __future__ import annotations

import pytest

from homelab_frontend.stub.rerank import PAIR_SPECIAL_TOKENS, pair_tokens, relevance
from homelab_frontend.stub.script import count_text_tokens

DOCS = ["Bananas are yellow and sweet.", "The Eiffel Tower stands in Paris, the capital of France.",
        "Berlin is a city in Germany."]
QUERY = "What is the capital of France?"


def test_relevance_puts_the_document_holding_the_query_first():
    scores = [relevance(QUERY, d) for d in DOCS]
    assert scores.index(max(scores)) == 1
    assert all(0 < s < 1 for s in scores)
    assert relevance("", "anything") == pytest.approx(0.0001)


def test_relevance_is_the_share_of_query_words_and_shorter_documents_win_ties():
    assert relevance("Paris France", "paris, FRANCE!") > relevance("Paris France", "Paris only") > relevance("Paris France", "none")
    assert relevance("paris", "paris") > relevance("paris", "paris and a longer document about paris")
    assert relevance("x", "y") == pytest.approx(0.0001)


def test_a_pair_counts_both_texts_and_the_special_tokens():
    assert pair_tokens(QUERY, DOCS[0]) == count_text_tokens(QUERY) + count_text_tokens(DOCS[0]) + PAIR_SPECIAL_TOKENS
    assert pair_tokens("", "") == PAIR_SPECIAL_TOKENS == 3
