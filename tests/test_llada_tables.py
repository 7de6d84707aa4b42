"""The paper's LLaDA tables (configs/exp_llada_tables.py, infodiff/experiments/llada_tables.py) on
the tiny random LLaDA checkpoint of tests/fixtures/pretrained/llada: random token ids (the CPU
variant), and text files tokenised by a tokenizer.json with responses of different lengths."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from infodiff import experiments
from infodiff.configs import exp_llada_tables

CHECKPOINT = pathlib.Path(__file__).parent / "fixtures" / "pretrained" / "llada"


def _config(**changes):
    c = exp_llada_tables.get_config("cpu")
    c.llada.update({"checkpoint": str(CHECKPOINT), "estimators": ("stratified",), **changes})
    return c


def _check_tables(res, estimators, ratio_samples):
    for e in estimators:
        v = res["table1a_conditional_variance"][f"{e}/16"]
        assert np.isfinite(v["variance"]) and v["variance"] >= 0
    for n in ratio_samples:
        for c in ("coupled", "decoupled"):
            assert np.isfinite(res["table1b_ratio_variance"][f"{n}/{c}"])


def test_random_rows_run(tmp_path):
    res = experiments.run(_config(), str(tmp_path))
    _check_tables(res, ("stratified",), (4,))
    assert res["rows"]["pairs"].startswith("random token ids")
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["model"]["architecture"] == "LLaDAModelLM" and saved["num_pairs"] == 3
    # stratified at 16 passes and 4-token responses: 4 samples of 4 passes
    assert res["table1a_conditional_variance"]["stratified/16"]["forward_passes"] == 16
    assert "Table 1 (a)" in (tmp_path / "results.md").read_text()


def _char_tokenizer(path: pathlib.Path):
    """A character-level tokenizer.json: ids 0..61 for a-z, A-Z, space and a few marks."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ .,:|?!'-"
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.save(str(path))


@pytest.mark.slow
def test_text_files_with_unequal_responses(tmp_path):
    _char_tokenizer(tmp_path / "tokenizer.json")
    # two pair shapes (two calls); one triplet shape whose responses differ in length (padded)
    pairs = [{"prompt": "Q: sky", "response": "Correct: blue | Incorrect: red"},
             {"prompt": "Q: sea", "response": "Correct: wet | Incorrect: dry"},
             {"prompt": "Q: grass", "response": "Correct: green | Incorrect: pink"}]
    triplets = [{"prompt": "Say hi", "response": "hi there", "alt_response": "go away now"},
                {"prompt": "Thanks", "response": "welcome!", "alt_response": "whatever!!!"}]
    for name, rows in (("pairs.jsonl", pairs), ("triplets.jsonl", triplets)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = _config(pairs=str(tmp_path / "pairs.jsonl"), triplets=str(tmp_path / "triplets.jsonl"),
                tokenizer=str(tmp_path / "tokenizer.json"), estimators=("time_free",))
    res = experiments.run(c, str(tmp_path / "out"))
    _check_tables(res, ("time_free",), (4,))
    assert res["rows"]["pairs"].endswith("pairs.jsonl") and res["num_triplets"] == 2


@pytest.mark.parametrize("changes,words", [
    ({"checkpoint": ""}, "config.llada.checkpoint is empty"),
    ({"reps": 1}, "config.llada.reps=1"),
    ({"estimators": ("time_free", "exact")}, "'exact'"),
    ({"pairs": "missing.jsonl", "tokenizer": "nowhere/tokenizer.json"}, "no tokenizer at"),
])
def test_bad_settings_are_one_line(changes, words, tmp_path):
    with pytest.raises(ValueError) as e:
        experiments.run(_config(**changes), str(tmp_path))
    assert words in str(e.value) and "\n" not in str(e.value)
