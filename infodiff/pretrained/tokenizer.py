"""The tokenizer a released checkpoint ships: a local ``tokenizer.json`` (HF ``tokenizers``) or
GPT-2 BPE files (``vocab.json`` + ``merges.txt``), found beside the weights or given by path.

Texts are encoded as given (no BOS/EOS added, nothing cleaned); a report's bits per byte divide
by the UTF-8 bytes of the original text (:func:`utf8_bytes`), the unit comparable across
tokenizers.
"""
from __future__ import annotations

import pathlib

from infodiff.pretrained.base import PretrainedError

__all__ = ["find", "load", "name_of", "utf8_bytes", "VOCAB_SLACK"]

VOCAB_SLACK = 0.01  # a model's embedding may be padded beyond its tokenizer (LLaDA: 126464 vs 126349 ids)


def find(model_dir, given=None) -> pathlib.Path | None:
    """The tokenizer file or directory to use: ``given`` (a tokenizer.json, or a directory holding
    tokenizer.json or vocab.json + merges.txt), else the same beside the weights, else None.
    Raises PretrainedError for a ``given`` path that holds none."""
    for where, required in ((given, True), (model_dir, False)):
        if where is None:
            continue
        p = pathlib.Path(where)
        if p.is_file():
            return p
        if (p / "tokenizer.json").is_file():
            return p / "tokenizer.json"
        if (p / "vocab.json").is_file() and (p / "merges.txt").is_file():
            return p
        if required:
            raise PretrainedError(f"tokenizer {str(p)!r} is neither a tokenizer.json nor a directory holding "
                                  f"tokenizer.json or vocab.json + merges.txt")
    return None


def load(path: pathlib.Path, model_vocab: int):
    """An HF ``tokenizers.Tokenizer`` from ``path`` (:func:`find`), checked against the model's
    number of real token ids ``model_vocab``: its vocabulary must be at most that and at least
    ``(1 - VOCAB_SLACK) model_vocab`` (the embedding's padding). Raises PretrainedError (one line) otherwise or when unreadable."""
    import tokenizers

    try:
        if path.is_dir():
            tok = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(str(path / "vocab.json"),
                                                                       str(path / "merges.txt")))
            tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = tokenizers.decoders.ByteLevel()
        else:
            tok = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exceptions for a bad file
        raise PretrainedError(f"tokenizer {str(path)!r} is not readable: {str(e).strip().splitlines()[0]}") from None
    n = tok.get_vocab_size(with_added_tokens=True)
    if not model_vocab - int(VOCAB_SLACK * model_vocab) <= n <= model_vocab:
        raise PretrainedError(f"tokenizer {str(path)!r} has {n} tokens but the model has {model_vocab} token ids: "
                              f"not this model's tokenizer (give the right one with tokenizer=PATH)")
    return tok


def name_of(path: pathlib.Path) -> str:
    """``'<file name> sha256:<12 hex digits>'`` of a tokenizer file (the vocabulary and merges files of
    a GPT-2 directory): two checkpoints shipping the same tokenizer get the same name, so their
    runs can be compared row by row (:func:`infodiff.compare.compare`)."""
    import hashlib

    files = [path] if path.is_file() else [path / "vocab.json", path / "merges.txt"]
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return f"{path.name} sha256:{h.hexdigest()[:12]}"


def utf8_bytes(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (the denominator of bits per byte)."""
    return len(text.encode("utf-8", errors="surrogateescape"))
