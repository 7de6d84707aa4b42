"""Write infodiff/data/chorales.npz: Bach chorales as pitch x time voice-count rolls.

Run once, in a throwaway virtual environment (music21 is NOT a runtime dependency of infodiff):

    python3 -m venv /tmp/m21venv
    /tmp/m21venv/bin/pip install music21==9.3.0
    /tmp/m21venv/bin/python scripts/prepare_chorales.py            # writes infodiff/data/chorales.npz

Representation (what ``infodiff.data.counts.load_chorales`` reads):

* Source: every ``.mxl`` file of ``music21.corpus.getComposer('bach')`` (music21 9.3.0 ships
  408; 400 are kept, 0..3 voices per cell observed), in sorted file-name order, keeping the scores that have parts named exactly
  ``Soprano``, ``Alto``, ``Tenor`` and ``Bass`` (other parts, e.g. doubled instruments, are
  ignored); scores whose four-voice roll equals an earlier one (the same harmonisation stored
  twice) are dropped.
* Time: an eighth-note grid (0.5 quarter lengths) from the first offset of the score
  (anacrusis included). A voice sounds pitch p at step t if one of its notes with pitch p
  satisfies ``offset <= 0.5 t < offset + duration`` (ties are separate notes, which gives the
  same roll; grace notes have zero duration and never sound). A chord inside a voice part
  (rare) contributes its first pitch only, so a voice sounds at most one pitch per step.
* Pitch: MIDI numbers from the lowest to the highest pitch found in any kept chorale
  (``low_pitch`` .. ``low_pitch + P - 1``); no transposition.
* Value of a cell: the number of the 4 voices sounding that pitch at that step, 0..4
  (unisons give 2 or more).
* Arrays: ``roll_PxT`` uint8 [P, T_total], the chorales concatenated along time;
  ``offsets`` int64 [n + 1] (chorale c occupies steps offsets[c]:offsets[c+1]);
  ``split`` int8 [n] (0 train, 1 valid, 2 test: ``np.random.default_rng(20250505)``
  permutation of the chorale indices, 80 / 10 / 10 %, so no piece is in two splits);
  ``low_pitch`` int; ``names`` (file stems); ``music21_version``; ``sha256`` of roll_PxT
  (``infodiff.data.counts.split_sha256``).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys

import numpy as np

VOICES = ("Soprano", "Alto", "Tenor", "Bass")
STEP_QL = 0.5  # eighth notes
SPLIT_SEED = 20250505


def _split_sha256(arr: np.ndarray) -> str:  # same as infodiff.data.counts.split_sha256
    a = np.ascontiguousarray(arr)
    h = hashlib.sha256(f"{a.dtype.str}{tuple(a.shape)}".encode("ascii"))
    h.update(a.tobytes())
    return h.hexdigest()


def voice_events(score):
    """[(voice, midi, start_step, end_step)] of the four voices, or None if a voice is missing."""
    parts = {p.partName or p.id: p for p in score.parts}
    if not all(v in parts for v in VOICES):
        return None
    start = min(float(parts[v].flatten().notes.first().offset) for v in VOICES
                if parts[v].flatten().notes.first() is not None)
    events = []
    for vi, v in enumerate(VOICES):
        for n in parts[v].flatten().notes:
            ql = float(n.duration.quarterLength)
            if ql <= 0 or not n.pitches:
                continue
            o = float(n.offset) - start
            a = math.ceil(o / STEP_QL - 1e-9)
            b = math.ceil((o + ql) / STEP_QL - 1e-9)
            if b > a:
                events.append((vi, int(n.pitches[0].midi), a, b))
    return events


def main(argv=None) -> int:
    from music21 import corpus
    import music21

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "infodiff", "data", "chorales.npz"))
    args = ap.parse_args(argv)

    paths = sorted((p for p in corpus.getComposer("bach") if str(p).endswith(".mxl")), key=lambda p: os.path.basename(str(p)))
    kept, seen = [], set()
    skipped = 0
    for i, p in enumerate(paths):
        ev = voice_events(corpus.parse(p))
        if not ev:
            skipped += 1
            continue
        key = hashlib.sha256(repr(sorted(ev)).encode()).hexdigest()
        if key in seen:
            skipped += 1
            continue
        seen.add(key)
        kept.append((os.path.basename(str(p)).rsplit(".", 1)[0], ev))
        if i % 50 == 0:
            print(f"{i}/{len(paths)} parsed, {len(kept)} kept", file=sys.stderr)
    lo = min(m for _, ev in kept for _, m, _, _ in ev)
    hi = max(m for _, ev in kept for _, m, _, _ in ev)
    P = hi - lo + 1
    rolls = []
    for _, ev in kept:
        T = max(b for *_, b in ev)
        r = np.zeros((P, T), np.uint8)
        for _, m, a, b in ev:
            r[m - lo, a:b] += 1
        rolls.append(r)
    roll = np.concatenate(rolls, axis=1)
    assert roll.max() <= 4, roll.max()
    offsets = np.concatenate([[0], np.cumsum([r.shape[1] for r in rolls])]).astype(np.int64)
    n = len(kept)
    perm = np.random.default_rng(SPLIT_SEED).permutation(n)
    n_valid, n_test = n * 10 // 100, n * 10 // 100
    split = np.zeros(n, np.int8)
    split[perm[n - n_valid - n_test: n - n_test]] = 1
    split[perm[n - n_test:]] = 2
    out = os.path.abspath(args.out)
    np.savez_compressed(
        out, roll_PxT=roll, offsets=offsets, split=split, low_pitch=np.int64(lo),
        names=np.array([k for k, _ in kept]), music21_version=np.array(music21.__version__),
        sha256=np.array(_split_sha256(roll)))
    print(f"wrote {out}: {n} chorales ({skipped} skipped), pitches MIDI {lo}..{hi} (P={P}), "
          f"{roll.shape[1]} eighth-note steps, splits {np.bincount(split, minlength=3).tolist()}, "
          f"{os.path.getsize(out)} bytes, max count {roll.max()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
