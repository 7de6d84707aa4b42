"""Exact oracles: conditionals vs brute-force enumeration, JSON parsing and its errors."""

import itertools
import json

import numpy as np
import pytest

from infodiff import oracles
from infodiff.validation import validate_tokens


def _enumerated(mk, L):
    seqs = np.array(list(itertools.product(range(mk.vocab_size), repeat=L)), np.int32)
    p = np.exp(mk.log_prob(seqs))
    return seqs, p


@pytest.mark.parametrize("order", [1, 2, 3])
def test_markov_conditionals_match_enumeration(order):
    rng = np.random.default_rng(order)
    mk = oracles.random_markov(rng, "ACG", order)
    L = 5
    seqs, p = _enumerated(mk, L)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    tab = oracles.TabularOracle(seqs, p / p.sum(), "ACG")
    z = seqs[rng.choice(len(seqs), 32)].copy()
    z[rng.random(z.shape) < 0.5] = mk.mask_id
    np.testing.assert_allclose(mk.exact_conditionals(z), tab.exact_conditionals(z), atol=1e-12)
    np.testing.assert_allclose(np.exp(np.asarray(mk(z))), tab.exact_conditionals(z), atol=2e-6)
    np.testing.assert_allclose(mk.log_marginal(z), tab.log_marginal(z), atol=1e-10)


def test_markov_is_stationary():
    mk = oracles.random_markov(np.random.default_rng(0), "ACGT", 2)
    # The marginal of a single symbol is the same at every position.
    z = np.full((4, 6), mk.mask_id)
    post = mk.exact_conditionals(z)
    np.testing.assert_allclose(post, np.broadcast_to(post[:, :1], post.shape), atol=1e-12)
    # Empirical frequencies of sampled sequences match exact marginals.
    x = mk.sample(np.random.default_rng(1), 20000, length=6)
    freq = np.bincount(x[:, 3], minlength=4) / len(x)
    np.testing.assert_allclose(freq, post[0, 3], atol=4 * np.sqrt(0.25 / len(x)))


def test_tabular_conditionals_by_hand():
    tab = oracles.TabularOracle.from_json({"AB": 0.5, "BA": 0.25, "BB": 0.25})
    assert tab.alphabet == "AB" and tab.vocab_size == 2
    M = tab.mask_id
    post = tab.exact_conditionals(np.array([[M, M], [1, M], [M, 0]]))
    np.testing.assert_allclose(post[0, 0], [0.5, 0.5])
    np.testing.assert_allclose(post[0, 1], [0.25, 0.75])
    np.testing.assert_allclose(post[1, 1], [0.5, 0.5])
    np.testing.assert_allclose(post[2, 0], [0.0, 1.0])
    assert tab.log_prob(np.array([[0, 1]]))[0] == pytest.approx(np.log(0.5))
    assert tab.cond_log_prob(np.array([[1, 1]]), np.array([[False, True]]))[0] == pytest.approx(np.log(0.5))
    assert tab.entropy() == pytest.approx(-(0.5 * np.log(0.5) + 0.5 * np.log(0.25)))


def test_json_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    tab = oracles.random_tabular(rng, "ACGT", 4, 20)
    mk = oracles.random_markov(rng, "ACGT", 2)
    (tmp_path / "t.json").write_text(json.dumps(tab.to_json()))
    (tmp_path / "m.json").write_text(json.dumps(mk.to_json()))
    tab2 = oracles.load_oracle("tabular", tmp_path / "t.json", alphabet="ACGT")
    mk2 = oracles.load_oracle("markov", tmp_path / "m.json")
    x = tab.sample(rng, 5)
    np.testing.assert_allclose(tab2.log_prob(x), tab.log_prob(x), rtol=1e-12)
    np.testing.assert_allclose(mk2.log_prob(x), mk.log_prob(x), rtol=1e-12)


@pytest.mark.parametrize(
    "table, message",
    [
        ({"AB": 0.5, "BA": 0.4}, r"sum to 0\.9"),
        ({"AB": 0.5, "BAA": 0.5}, r"malformed key 'BAA'"),
        ({"AB": 1.5, "BA": -0.5}, r"-0\.5"),
        ({"AB": "half", "BA": 0.5}, r"'half'"),
        ({"": 1.0}, r"malformed key ''"),
        ({"AB": float("nan"), "BA": 1.0}, r"nan"),
    ],
)
def test_tabular_json_errors(table, message):
    with pytest.raises(ValueError, match=message):
        oracles.TabularOracle.from_json(table)


def test_tabular_alphabet_error():
    with pytest.raises(ValueError, match=r"symbol 'X' at position 1 of 'AX'"):
        oracles.TabularOracle.from_json({"AX": 1.0}, alphabet="AB")


@pytest.mark.parametrize(
    "table, message",
    [
        ({"A": {"A": 0.5, "B": 0.4}, "B": {"A": 1.0}}, r"context 'A' sums to 0\.9"),
        ({"A": {"A": 1.0}, "BB": {"A": 1.0}}, r"malformed context key 'BB'"),
        ({"A": {"A": 0.5, "B": 0.5}}, r"context 'B' is missing"),
        ({"A": {"AB": 1.0}, "B": {"A": 1.0}}, r"malformed symbol key 'AB'"),
        ({"A": 3, "B": {"A": 1.0}}, r"row of context 'A' must be a non-empty object"),
    ],
)
def test_markov_json_errors(table, message):
    with pytest.raises(ValueError, match=message):
        oracles.MarkovOracle.from_json(table)


def test_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        oracles.load_oracle("tabular", tmp_path / "nope.json")
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(ValueError, match="empty"):
        oracles.load_oracle("markov", tmp_path / "empty.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        oracles.load_oracle("tabular", tmp_path / "bad.json")
    (tmp_path / "dup.json").write_text('{"AB": 0.5, "AB": 0.5}')
    with pytest.raises(ValueError, match="duplicate key 'AB'"):
        oracles.load_oracle("tabular", tmp_path / "dup.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="non-empty JSON object"):
        oracles.load_oracle("tabular", tmp_path / "list.json")
    with pytest.raises(ValueError, match="unknown oracle kind 'foo'"):
        oracles.load_oracle("foo", tmp_path / "list.json")


def test_periodic_chain_stationary_law():
    mk = oracles.MarkovOracle.from_json({"A": {"B": 1.0}, "B": {"A": 0.5, "C": 0.5}, "C": {"B": 1.0}})
    np.testing.assert_allclose(mk.stationary, [0.25, 0.5, 0.25], atol=1e-12)
    post = mk.exact_conditionals(np.full((1, 4), mk.mask_id))
    np.testing.assert_allclose(post[0], np.broadcast_to(post[0, :1], post[0].shape), atol=1e-12)


def test_reducible_chain_is_refused():
    with pytest.raises(ValueError, match="no unique stationary law"):
        oracles.MarkovOracle.from_json({"A": {"A": 1.0}, "B": {"B": 1.0}})


def test_sample_response_with_prompt_shorter_than_order():
    mk = oracles.random_markov(np.random.default_rng(4), "ACG", 3)
    prompt = np.zeros((30000, 1), np.int32)
    y = mk.sample_response(np.random.default_rng(5), prompt, 2)
    z = np.full((1, 3), mk.mask_id)
    z[0, 0] = 0
    exact = mk.exact_conditionals(z)[0, 1]
    freq = np.bincount(y[:, 0], minlength=3) / len(y)
    assert np.all(np.abs(freq - exact) < 4 * np.sqrt(exact * (1 - exact) / len(y)))


def test_alphabet_and_length_errors():
    with pytest.raises(ValueError, match="repeats the symbol 'A'"):
        oracles.TabularOracle.from_json({"AB": 1.0}, alphabet="AAB")
    with pytest.raises(ValueError, match="zero-length"):
        validate_tokens(np.zeros((2, 0), np.int32), 4)
