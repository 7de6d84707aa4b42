"""External denoisers (infodiff.external.from_function): a model outside infodiff scored with the
library's estimators.

* The same model written in NumPy (host callback) and in JAX (jitted) gives the same numbers to
  float rounding: a fixed random model of the two neighbours of each position (mask and the
  sequence's ends have their own rows), with and without a time input; and the same model with
  its mask inside the vocabulary (ids shifted around it) gives the same numbers again.
* An exact denoiser (a 2nd-order Markov chain's forward-backward conditionals, computed in
  NumPy float64) scored through from_function is within 4 SE of the exact -log p(y | x).
* Bad functions are refused on the probe call with one line.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import infodiff
from infodiff import external, oracles, scoring
from tests.test_scoring import Z_MAX, _chain_rule_nll, _z

V, L = 5, 8
ALPHABET = "abcde"
_W = np.random.default_rng(0).normal(size=(3, V + 1, V)).astype(np.float32)  # left, right, time tables


def encode(s):
    return [ALPHABET.index(c) for c in s]


def neighbour_logits(xp, x, t=None):
    """logits [B, L, V] = left[x_{i-1}] + right[x_{i+1}] (+ t * time[x_i]); id V (mask) pads the ends."""
    W = xp.asarray(_W)
    end = xp.full((x.shape[0], 1), V, x.dtype)
    left, right = xp.concatenate([end, x[:, :-1]], 1), xp.concatenate([x[:, 1:], end], 1)
    out = W[0][left] + W[1][right]
    return out if t is None else out + t[:, None, None] * W[2][x]


def np_log_softmax(a):
    a = a - a.max(-1, keepdims=True)
    return a - np.log(np.exp(a).sum(-1, keepdims=True))


def np_model(x, t=None):
    assert x.dtype == np.int32 and x.flags.writeable and x.flags.c_contiguous
    out = np_log_softmax(neighbour_logits(np, x, t).astype(np.float64))
    x[:] = 0  # a function may use its input as scratch: it must not reach the estimators
    return out


def jax_model(x, t=None):
    return jax.nn.log_softmax(neighbour_logits(jnp, x, t), axis=-1)


PROMPTS, RESPONSES, ALTS = ["abc", "", "dddddddddddd"], ["de", "abcab", "eabcdeabcdeab"], ["ed", "bacba", "e"]
TEXTS = ["abcdeabcdeab", "cab", "eeeeddddccccbbbbaa"]


def _scores(run):
    return (run.nll(TEXTS), run.conditional_nll(PROMPTS, RESPONSES),
            run.log_ratio(PROMPTS[:2], RESPONSES[:2], ALTS[:2]))


@pytest.mark.parametrize("time_conditioned", [False, True])
def test_numpy_and_jax_models_give_the_same_numbers(time_conditioned):
    kw = dict(vocab_size=V, mask_id=V, seq_len=L, encode=encode, time_conditioned=time_conditioned)
    fns = (np_model, jax_model) if time_conditioned else (lambda x: np_model(x), lambda x: jax_model(x))
    host, traced = (infodiff.from_function(f, **kw) for f in fns)
    assert not host.denoiser.jax_function and traced.denoiser.jax_function
    for a, b in zip(_scores(host), _scores(traced)):
        assert np.all(a.stderr > 0)
        np.testing.assert_allclose(a.samples, b.samples, rtol=1e-5, atol=1e-5)  # float32 rounding of ~40 nats
        np.testing.assert_allclose(a.mean, b.mean, rtol=1e-6, atol=1e-5)


def test_a_mask_inside_the_vocabulary_gives_the_same_numbers():
    """The model of the test above with its mask at id 2 of 6 ids (tokens 2.. shifted up)."""
    m = 2

    def inside(x):
        lib = np.where(x == m, V, x - (x > m)).astype(np.int32)
        out = np_log_softmax(neighbour_logits(np, lib).astype(np.float64))
        return np.concatenate([out[..., :m], np.full(out.shape[:-1] + (1,), -np.inf), out[..., m:]], -1)

    shifted = lambda s: [i + (i >= m) for i in encode(s)]  # noqa: E731
    a = infodiff.from_function(inside, vocab_size=V + 1, mask_id=m, seq_len=L, encode=shifted)
    b = infodiff.from_function(lambda x: np_model(x), vocab_size=V, mask_id=V, seq_len=L, encode=encode)
    assert a.task.vocab_size == V and np.array_equal(a.encode("cde"), b.encode("cde"))
    for ea, eb in zip(_scores(a), _scores(b)):
        np.testing.assert_allclose(ea.samples, eb.samples, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def chain():
    return oracles.random_markov(np.random.default_rng(5), "ACGT", order=2)


@pytest.fixture(scope="module")
def oracle_run(chain):
    def exact(x):  # NumPy float64 forward-backward conditionals: a host function
        with np.errstate(divide="ignore"):
            return np.log(chain.exact_conditionals(x))

    return infodiff.from_function(exact, vocab_size=4, mask_id=4, seq_len=12, num_samples=256,
                                  encode=lambda s: ["ACGT".index(c) for c in s])


def test_an_exact_numpy_denoiser_is_within_4_se_of_the_exact_nll(chain, oracle_run):
    run = oracle_run
    assert not run.denoiser.jax_function and run.tokenizer.separator == ()
    rng = np.random.default_rng(0)
    prompts, responses = [], []
    for P, R in [(4, 3), (9, 3), (20, 5), (2, 12), (6, 25), (0, 5), (3, 1)]:
        seq = chain.sample(rng, 1, length=P + R)[0]
        prompts.append("".join("ACGT"[i] for i in seq[:P]))
        responses.append("".join("ACGT"[i] for i in seq[P:]))
    est = run.conditional_nll(prompts, responses, seed=1)
    truth = np.array([_chain_rule_nll(chain, run.encode(p), run.encode(r)) for p, r in zip(prompts, responses)])
    z = _z(est, truth)
    assert np.all(np.abs(z) < Z_MAX), (z, est.mean, truth)
    assert est.info["bound"] == "nelbo" and est.estimator.startswith("k_dce")


def test_the_interval_of_an_exact_denoiser_is_its_exact_nll(chain, oracle_run):
    """Windows of at most 8 tokens: the exact any-order recursion (lower = upper), through the
    host callback inside infodiff.orders' jitted programs."""
    texts = ["ACGTTGCA", "GATTACA", "TTT"]
    oi = oracle_run.nll_interval(texts, seed=2)
    truth = -chain.log_marginal(np.stack([np.pad(oracle_run.encode(t), (0, 12 - len(t)), constant_values=4)
                                          for t in texts]))
    assert oi.exact.all()
    np.testing.assert_allclose(oi.lower, truth, rtol=1e-5)
    np.testing.assert_allclose(oi.upper, truth, rtol=1e-5)


def test_the_callback_handles_vmap_and_jit():
    host = infodiff.from_function(np_model, vocab_size=V, mask_id=V, seq_len=L, encode=encode,
                                  time_conditioned=True).denoiser
    rng = np.random.default_rng(1)
    z = rng.integers(0, V + 1, size=(3, 4, L)).astype(np.int32)
    t = rng.uniform(size=(3, 4)).astype(np.float32)
    want = np.stack([np.asarray(jax_model(jnp.asarray(z[n]), jnp.asarray(t[n]))) for n in range(3)])
    np.testing.assert_allclose(jax.vmap(host)(z, t), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.jit(jax.vmap(host))(z, t), want, rtol=1e-5, atol=1e-5)
    t0 = np.stack([np.asarray(jax_model(jnp.asarray(z[n]), jnp.asarray(t[0]))) for n in range(3)])
    np.testing.assert_allclose(jax.vmap(host, in_axes=(0, None))(z, t[0]), t0, rtol=1e-5, atol=1e-5)


class TensorLike:
    """What a PyTorch function returns without ``.numpy()``: an array through ``__array__`` only."""

    def __init__(self, a):
        self._a = a

    def __array__(self, dtype=None, copy=None):
        return self._a if dtype is None else self._a.astype(dtype)


def test_a_tensor_like_output_is_read_through_array():
    a = infodiff.from_function(lambda x: TensorLike(np_model(x)), vocab_size=V, mask_id=V, seq_len=L, encode=encode)
    b = infodiff.from_function(lambda x: np_model(x), vocab_size=V, mask_id=V, seq_len=L, encode=encode)
    np.testing.assert_array_equal(a.nll(TEXTS).samples, b.nll(TEXTS).samples)


def test_a_run_without_workdir_and_the_text8_default():
    """vocab_size 27, mask 27: the text8 alphabet; the uniform model's -log p is n log 27 exactly."""
    uniform = lambda x: np.full(x.shape + (27,), -np.log(27.0))  # noqa: E731
    run = infodiff.from_function(uniform, vocab_size=27, mask_id=27, seq_len=8, seed=3)
    assert run.workdir is None and run.checkpoint_step is None and run.config.eval.seed == 3
    assert run.tokenizer is scoring.TEXT8
    est = run.nll(["Hello, world!"])  # cleaned: "hello world", 11 characters in two windows
    np.testing.assert_allclose(est.mean, [11 * np.log(27.0)], rtol=1e-6)
    assert run.last_changed[0] == {"H": 1, ",": 1, "!": 1}
    spaced = external.from_function(uniform, vocab_size=27, mask_id=27, seq_len=8, separator=[26, 26])
    assert spaced.tokenizer.separator == (26, 26) and spaced.tokenizer.name == "text8"


@pytest.mark.parametrize("fn, kw, match", [
    (lambda x: np.zeros((2, L, V + 1)), {}, r"shape \(2, 8, 6\) .*expected \(2, 8, 5\).*drop the mask column"),
    (lambda x: np.zeros(x.shape + (V,), np.int32), {}, "dtype int32; expected float"),
    (lambda x: np.full(x.shape + (V,), np.nan), {}, r"returned nan at \[0, 0, 0\]"),
    (lambda x: np.full(x.shape + (V,), 1.0 / V), {}, "not log-probabilities: logsumexp .* return log_softmax"),
    (lambda x: np.full(x.shape + (V,), -np.log(V)), {"vocab_size": V, "mask_id": 1},
     "probability 0.2 on mask_id=1 .* set the mask logit to -inf"),
    (lambda x: 1 / 0, {}, "probe batch .*ZeroDivisionError: division by zero"),
    (lambda x: np_model(x), {"time_conditioned": True}, r"float32 t \[2\]\) failed .*takes 1 positional"),
    (lambda x: np_model(x), {"jax_function": True}, "jax_function=True but JAX cannot trace"),
    (lambda x: np_model(x), {"mask_id": V + 1}, "mask_id=6 must be vocab_size=5"),
    (lambda x: np_model(x), {"encode": None}, "pass encode= .*got vocab_size=5, mask_id=5"),
    (lambda x: np_model(x), {"estimator": "stratified"}, "cannot score rows of different lengths"),
    ("not a function", {}, "logprobs_fn must be a function"),
])
def test_bad_functions_are_refused_in_one_line(fn, kw, match):
    args = dict(vocab_size=V, mask_id=V, seq_len=L, encode=encode) | kw
    with pytest.raises((ValueError, TypeError), match=match) as e:
        infodiff.from_function(fn, **args)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("bad, match", [("f", "encode\\('abf'\\) holds token id 7, outside \\[0, 5\\)"),
                                        ("m", "holds token id 1, the mask id")])
def test_an_encode_outside_the_vocabulary_is_named(bad, match):
    enc = lambda s: [{"m": 1, "f": 7}.get(c, 0) for c in s]  # noqa: E731
    mid = 1 if bad == "m" else V
    logp = np.where(np.arange(V) == mid, -np.inf, -np.log(V - (mid < V)))  # uniform over the real tokens
    run = infodiff.from_function(lambda x: np.broadcast_to(logp, x.shape + (V,)), vocab_size=V, mask_id=mid,
                                 seq_len=L, encode=enc)
    with pytest.raises(ValueError, match=match) as e:
        run.nll(["ab" + bad])
    assert "\n" not in str(e.value)
