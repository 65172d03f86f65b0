"""A backend's embeddings answer checked for the surfaces (surfaces/embeddings.py): the vectors
in input order, or the backend named as the one at fault."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.embeddings import vectors, vectors_of


def test_vectors_come_in_input_order_whatever_the_answers_order():
    data = [{"index": 2, "embedding": [3]}, {"index": 0, "embedding": [1.5, -1]}, {"index": 1, "embedding": []}]
    assert vectors_of(data, 3) == [[1.5, -1], [], [3]]


def test_an_entry_without_a_usable_index_sorts_as_index_0():
    data = [{"index": 1, "embedding": [2]}, {"embedding": [0]}, {"index": True, "embedding": [1]}]
    assert vectors_of(data, 3) == [[0], [1], [2]]


@pytest.mark.parametrize("embedding", ["AAAAPw==", [1, "2"], [True, 0.5], None, {"0": 1.0}])
def test_anything_but_a_list_of_numbers_is_refused(embedding):
    with pytest.raises(ValueError, match="not a list of numbers"):
        vectors_of([{"index": 0, "embedding": embedding}], 1)


def test_as_many_vectors_as_inputs_or_refused():
    with pytest.raises(ValueError, match="1 embeddings for 2 inputs"):
        vectors_of([{"index": 0, "embedding": [1.0]}], 2)
    with pytest.raises(ValueError, match="2 embeddings for 1 inputs"):
        vectors_of([{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [2.0]}], 1)


def test_a_surface_gets_an_upstream_malformed_error_naming_the_backend():
    ex = SimpleNamespace(backend=SimpleNamespace(name="gpu-box"))  # the exchange that answered
    assert vectors(ex, [{"index": 0, "embedding": [1.0]}], 1) == [[1.0]]
    with pytest.raises(GatewayError) as err:
        vectors(ex, None, 1)
    assert err.value.kind == "upstream_malformed" and "'gpu-box'" in err.value.message
    assert "0 embeddings for 1 inputs" in err.value.message
