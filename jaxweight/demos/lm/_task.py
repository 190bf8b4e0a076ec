"""The arithmetic task of ``demo lm``: vocabulary, problem pool, held-out sets, rendering.

Problems are ``a+b`` and ``a-b`` (``a >= b`` for subtraction, so answers are
never negative) with 1 to 4 digit operands. The difficulty level of a problem
is ``max(digits(a), digits(b)) - 1`` (0..3); the number of carries (addition)
or borrows (subtraction) is recorded too (``Pool.carries``). Every distinct
problem belongs to one split by a hash of the problem (:func:`split_of`):
``train`` (the RL pool and the warm-start set), ``validation`` (tuning) and
``heldout`` (reported), disjoint at every level; and to one of
``N_BUCKETS = 24`` buckets, level x operation x min(carries, 2) (:func:`bucket_of`;
21 are non-empty), the curriculum's items.

Token layout (all host-side NumPy; the device only sees integer arrays):

* prompt: the problem text ``"123+45="`` left-padded with ``PAD`` to
  ``PROMPT_LEN = 10`` tokens, so every prompt ends at the same position;
* completion: the answer's digits **least significant first** (``"168"`` is
  written ``8 6 1``; carries then flow in writing order, which helps a small
  model), then ``EOS``, right-padded with ``PAD`` to ``COMPLETION_LEN = 6``.

A completion is rendered as text ``"<answer>861</answer>"`` (the generated
characters between the tags) when it ends with ``EOS``, and without the
closing tag otherwise; :func:`jaxweight.maxent.extract_answer` reads it and
:func:`answer_from_text` turns the payload back into the number's usual
spelling. The device-side reward (exact token match up to ``EOS``) and
cluster ids are checked against these host functions in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import maxent as M

__all__ = [
    "VOCAB", "PAD", "EOS", "VOCAB_SIZE", "PROMPT_LEN", "COMPLETION_LEN", "N_LEVELS",
    "SPLITS", "N_BUCKETS", "Pool", "split_of", "bucket_of", "bucket_name", "make_pool", "make_split_set",
    "stratified", "encode_prompts", "encode_targets", "render_completion", "answer_from_text",
    "host_rewards", "host_cluster_ids",
]

VOCAB = ("<pad>", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "+", "-", "=", "<eos>")
PAD, EOS = 0, 14
VOCAB_SIZE = len(VOCAB)
PROMPT_LEN = 10          # "9999+9999="
COMPLETION_LEN = 6       # 5 answer digits + EOS
N_LEVELS = 4
N_BUCKETS = N_LEVELS * 2 * 3
SPLITS = ("train", "validation", "heldout")
_SPLIT_FRAC = (0.8, 0.1, 0.1)
_LUT = np.zeros(256, np.int32)
for _i, _c in enumerate("0123456789+-="):
    _LUT[ord(_c)] = _i + 1
_CHARS = np.array(["_"] + list("0123456789+-=") + ["$"])  # PAD / EOS never appear in a rendered answer


@dataclass(frozen=True)
class Pool:
    """A set of problems (host-side NumPy arrays, one row per problem).

    Attributes:
      keys: list[str] the problem text, e.g. ``"123+45"`` (the curriculum's item key).
      a, b: i64[N] operands; op: i32[N] 0 for ``+``, 1 for ``-``.
      level: i32[N] difficulty level 0..3 (max operand digits - 1).
      carries: i32[N] number of carries / borrows.
      answer: i64[N] the result.
      prompts: i32[N, PROMPT_LEN] prompt tokens.
      targets: i32[N, COMPLETION_LEN] the correct completion tokens.
    """

    keys: list
    a: np.ndarray
    b: np.ndarray
    op: np.ndarray
    level: np.ndarray
    carries: np.ndarray
    answer: np.ndarray
    prompts: np.ndarray
    targets: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    def take(self, idx: np.ndarray) -> Pool:
        idx = np.asarray(idx)
        return Pool([self.keys[i] for i in idx], *(getattr(self, f)[idx] for f in (
            "a", "b", "op", "level", "carries", "answer", "prompts", "targets")))


def _digits(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, np.floor(np.log10(np.maximum(x, 1))).astype(np.int64) + 1, 1)


def _carries(a: np.ndarray, b: np.ndarray, op: np.ndarray) -> np.ndarray:
    c = np.zeros(a.shape, np.int64)
    n = np.zeros(a.shape, np.int64)
    aa, bb = a.copy(), b.copy()
    for _ in range(5):
        da, db = aa % 10, bb % 10
        add = da + db + c
        sub = da - db - c
        c = np.where(op == 0, add >= 10, sub < 0).astype(np.int64)
        n += c
        aa //= 10
        bb //= 10
    return n.astype(np.int32)


def _draw(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` random problems: level uniform in 0..3 (the longer operand has level + 1 digits,
    the other 1..level + 1 digits, either side), then uniform operands of those lengths."""
    lev = rng.integers(0, N_LEVELS, n)
    d_long = lev + 1
    d_short = 1 + (rng.random(n) * d_long).astype(np.int64)
    lo = lambda d: np.where(d == 1, 0, 10 ** (d - 1))  # noqa: E731
    x = lo(d_long) + (rng.random(n) * (10 ** d_long - lo(d_long))).astype(np.int64)
    y = lo(d_short) + (rng.random(n) * (10 ** d_short - lo(d_short))).astype(np.int64)
    flip = rng.random(n) < 0.5
    a, b = np.where(flip, y, x), np.where(flip, x, y)
    op = rng.integers(0, 2, n).astype(np.int32)
    swap = (op == 1) & (a < b)
    a, b = np.where(swap, b, a), np.where(swap, a, b)
    return a.astype(np.int64), b.astype(np.int64), op


def _build(a: np.ndarray, b: np.ndarray, op: np.ndarray) -> Pool:
    keys = [f"{x}{'+-'[o]}{y}" for x, y, o in zip(a.tolist(), b.tolist(), op.tolist())]
    ans = np.where(op == 0, a + b, a - b)
    level = (np.maximum(_digits(a), _digits(b)) - 1).astype(np.int32)
    return Pool(keys, a, b, op, level, _carries(a, b, op), ans,
                encode_prompts(keys), encode_targets(ans))


def _code(a: np.ndarray, b: np.ndarray, op: np.ndarray) -> np.ndarray:
    return (a * 10_000 + b) * 2 + op


def split_of(a: np.ndarray, b: np.ndarray, op: np.ndarray, seed: int = 0) -> np.ndarray:
    """i32[N] split of each problem: 0 train (80%), 1 validation (10%), 2 heldout (10%).

    A fixed hash of the problem (and ``seed``), so a problem is in the same split wherever
    it is drawn: the held-out and validation problems are never in the pool or the warm start.
    """
    x = (_code(np.asarray(a), np.asarray(b), np.asarray(op)).astype(np.uint64)
         + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15))
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(33))) * np.uint64(0xFF51AFD7ED558CCD)
        x = (x ^ (x >> np.uint64(33))) * np.uint64(0xC4CEB9FE1A85EC53)
        x = x ^ (x >> np.uint64(33))
    u = (x % np.uint64(1_000_000)).astype(np.float64) / 1e6
    cut = np.cumsum(_SPLIT_FRAC)
    return np.searchsorted(cut[:-1], u, side="right").astype(np.int32)


def bucket_of(level: np.ndarray, op: np.ndarray, carries: np.ndarray) -> np.ndarray:
    """i32[N] bucket of each problem: ``level * 6 + op * 3 + min(carries, 2)`` (0..23)."""
    return (np.asarray(level) * 6 + np.asarray(op) * 3 + np.minimum(np.asarray(carries), 2)).astype(np.int32)


def bucket_name(k: int) -> str:
    """``"3d+ c2"``: digits of the longer operand, operation, carries (2 = two or more)."""
    return f"{k // 6 + 1}d{'+-'[(k // 3) % 2]} c{k % 3}"


def _distinct(rng: np.random.Generator, n_draw: int, split: int):
    a, b, op = _draw(rng, n_draw)
    keep = split_of(a, b, op) == split
    a, b, op = a[keep], b[keep], op[keep]
    _, first = np.unique(_code(a, b, op), return_index=True)
    first = np.sort(first)
    return a[first], b[first], op[first]


def make_pool(size: int, seed: int = 0, split: int = 0) -> Pool:
    """Up to ``size`` distinct problems of one split (deterministic in ``seed``), in random order.

    Drawn level-uniformly and deduplicated: level 0 has only 155 distinct problems (about
    124 in the train split) and level 1 about 19k, so a pool of 131,072 holds all of level
    0's and most of level 1's; the pipeline's draws are level-balanced all the same.
    """
    rng = np.random.default_rng(seed)
    a, b, op = _distinct(rng, 4 * size, split)
    a, b, op = a[:size], b[:size], op[:size]
    return _build(a, b, op)


def make_split_set(per_level: int, split: int, seed: int = 1, pool: Pool | None = None) -> Pool:
    """``per_level`` distinct problems of each level from ``split`` (or from ``pool`` if given).

    A level with fewer problems in the split gives all it has (level 0: about 15 in the
    validation and held-out splits).
    """
    rng = np.random.default_rng(seed)
    if pool is None:
        a, b, op = _distinct(rng, 400_000, split)
        src = _build(a, b, op)
    else:
        src = pool
    idx = [rng.permutation(np.flatnonzero(src.level == lv))[:per_level] for lv in range(N_LEVELS)]
    return src.take(np.concatenate(idx))


def stratified(pool: Pool, n: int, seed: int = 0) -> np.ndarray:
    """Indices of ``n`` distinct problems of ``pool``, as equal a share per level as the pool allows."""
    rng = np.random.default_rng(seed)
    by = [rng.permutation(np.flatnonzero(pool.level == lv)) for lv in range(N_LEVELS)]
    out: list = []
    want = n
    for i, idx in enumerate(sorted(by, key=len)):
        k = min(len(idx), want // (N_LEVELS - i))
        out.append(idx[:k])
        want -= k
    return rng.permutation(np.concatenate(out))


def encode_prompts(keys: list) -> np.ndarray:
    """i32[N, PROMPT_LEN] tokens of ``"KEY="`` left-padded with PAD."""
    raw = np.frombuffer("".join(f"{k}=".rjust(PROMPT_LEN) for k in keys).encode(), np.uint8)
    return _LUT[raw.reshape(len(keys), PROMPT_LEN)]


def encode_targets(answers: np.ndarray) -> np.ndarray:
    """i32[N, COMPLETION_LEN]: reversed digits, EOS, PAD."""
    out = np.full((len(answers), COMPLETION_LEN), PAD, np.int32)
    for i, x in enumerate(np.asarray(answers).tolist()):
        d = [int(c) + 1 for c in str(x)[::-1]] + [EOS]
        out[i, : len(d)] = d
    return out


def render_completion(tokens: np.ndarray) -> str:
    """Text of one completion: ``<answer>CHARS</answer>`` up to EOS (no closing tag without EOS)."""
    tokens = np.asarray(tokens)
    end = np.flatnonzero(tokens == EOS)
    if len(end):
        return "<answer>" + "".join(_CHARS[tokens[: end[0]]]) + "</answer>"
    return "<answer>" + "".join(_CHARS[tokens])


def answer_from_text(text: str) -> str:
    """The answer in the usual digit order (``extract_answer`` then un-reverse)."""
    a = M.extract_answer(text)
    return a if a == M.NO_ANSWER else a[::-1]


def host_rewards(completions: np.ndarray, answers: np.ndarray) -> np.ndarray:
    """f32[P, G]: 1 where ``answer_from_text(render_completion(c)) == str(answer)``.

    ``completions``: i32[P, G, L]; ``answers``: i64[P].
    """
    c = np.asarray(completions)
    flat = c.reshape(-1, c.shape[-1])
    ans = np.broadcast_to(np.asarray(answers)[:, None], c.shape[:-1]).reshape(-1)
    r = [answer_from_text(render_completion(t)) == str(int(x)) for t, x in zip(flat, ans)]
    return np.asarray(r, np.float32).reshape(c.shape[:-1])


def host_cluster_ids(completions: np.ndarray) -> np.ndarray:
    """i32[P, G] SEED-GRPO cluster ids via ``extract_answer`` + ``maxent.cluster_ids``."""
    c = np.asarray(completions)
    return M.cluster_ids([[M.extract_answer(render_completion(t)) for t in row] for row in c])
