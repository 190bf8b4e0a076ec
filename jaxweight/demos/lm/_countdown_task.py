"""The Countdown task of ModeBench (maxent-grpo): three numbers, one target, several right answers.

A problem is three distinct integers from 2..12 and a target; an answer is one
expression that uses each number exactly once with ``+ - * /`` and parentheses. Every
expression over the three numbers is enumerated exactly (all orders x both binary tree
shapes x 4^2 operators, :class:`fractions.Fraction` arithmetic, division by zero dropped) and
reduced to a **canonical form**: at every ``+`` and ``*`` node the two operands are sorted
(numbers first, by value), the operators are kept and nothing is re-associated, so
``3*(12-7)`` and ``(12-7)*3`` are one mode but ``2+(3+4)`` and ``(2+3)+4`` (canonically
``4+(2+3)``) are two, and so are ``12-7+3`` and ``12-(7-3)``. A problem's *modes* are its
distinct canonical solutions. The benchmark's pool is the paper's generator's (:data:`POOLS`
``"paper"``, the default): targets in 1..36, no target equal to one of its numbers, 2..8 modes:
787 candidates (:func:`candidates`), from which :func:`make_splits` draws 384 train and 128 eval
problems. ``"full"`` keeps targets up to 99 and targets equal to a number (1,015 candidates).

Tokens (:data:`VOCAB` extends the arithmetic task's, same ids for the shared symbols, ``PAD``
and ``EOS``): prompt ``"3,7,12=25:"`` (numbers ascending) left-padded to ``PROMPT_LEN``;
completion an expression such as ``"(12-7)*5"``, ``EOS``, right-padded to ``COMPLETION_LEN``.
No unary minus; numbers of at most two digits, no leading zero (the host parser also skips spaces).

Two verifiers agree on every token string (tested). The host one (:func:`parse`, :func:`reward`,
:func:`mode_id`) is a recursive-descent parser that refuses text over ``MAX_CHARS`` characters
before reading it and more than ``MAX_DEPTH`` nested parentheses, checks the numbers before any
arithmetic, and never raises. The device one (:func:`device_verify`) is jittable, the training
step's reward: one ``lax.scan`` over the tokens, an accumulator pair per parenthesis level,
fractions as int32 ``p/q``; it also gives each expression the exact integer code of its
canonical form (:func:`tree_code`), so mode ids (:func:`device_mode_ids`) stay on device.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

from . import _task
from .._args import COUNTDOWN_POOLS as POOLS  # the paper's (its generator's filters) and targets up to 99

__all__ = [
    "VOCAB", "PAD", "EOS", "VOCAB_SIZE", "PROMPT_LEN", "COMPLETION_LEN", "NUMBERS", "TARGET_MAX", "POOLS",
    "MIN_MODES", "MAX_MODES", "MAX_CHARS", "MAX_DEPTH", "MAX_LITERAL_DIGITS", "N_TRAIN", "N_EVAL",
    "Tree", "evaluate", "canonical", "tree_code", "render", "expressions", "solutions",
    "parse", "reward", "graded_reward", "mode_id", "Problems", "candidates", "make_splits", "summary",
    "encode_prompts", "encode_completions", "completion_text", "host_rewards", "host_mode_ids",
    "verify", "device_verify", "device_graded_reward", "GRADED_CREDIT", "device_mode_ids", "device_cluster_ids", "mode_metrics",
]

# the arithmetic task's symbols keep their ids (PAD 0, digits 1..10, + - = 11..13, EOS 14)
VOCAB = _task.VOCAB + ("*", "/", "(", ")", ",", ":")
PAD, EOS = _task.PAD, _task.EOS
VOCAB_SIZE = len(VOCAB)
NUMBERS = tuple(range(2, 13))
TARGET_MAX = 36              # the paper's generator: targets 1..36
MIN_MODES, MAX_MODES = 2, 8
PROMPT_LEN = 12              # "10,11,12=99:"
COMPLETION_LEN = 12          # 11 characters + EOS; a canonical solution needs at most 10 ("(10+11)*12")
MAX_CHARS = 64               # the host parser refuses longer text before reading it
MAX_DEPTH = 8                # nested parentheses (host and device)
MAX_LITERAL_DIGITS = 2       # the numbers are 2..12
N_TRAIN, N_EVAL = 384, 128

OPS = "+-*/"
_DIGITS = "0123456789"
_TOK = {c: i for i, c in enumerate(VOCAB) if len(c) == 1}
_PLUS, _MINUS, _STAR, _SLASH, _LPAR, _RPAR = (_TOK[c] for c in "+-*/()")
_CHARS = np.array([c if len(c) == 1 else "_" for c in VOCAB])   # PAD reads "_", which no parser accepts
_LUT = np.full(256, -1, np.int32)
for _c, _i in _TOK.items():
    _LUT[ord(_c)] = _i

Tree = int | tuple     # a number, or (op, left, right) with op one of "+-*/"


# ===================================================================== trees
def evaluate(tree: Tree) -> Fraction | None:
    """Exact value of ``tree``, or ``None`` where it divides by zero."""
    if isinstance(tree, int):
        return Fraction(tree)
    op, left, right = tree
    a, b = evaluate(left), evaluate(right)
    if a is None or b is None:
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return None if b == 0 else a / b


def _leaves(tree: Tree) -> list:
    return [tree] if isinstance(tree, int) else _leaves(tree[1]) + _leaves(tree[2])


def _order(tree: Tree) -> tuple:
    # numbers before compound operands, numbers by value: on trees of <= 3 numbers this is
    # the order of tree_code, which the device sorts by
    if isinstance(tree, int):
        return (0, tree)
    return (1, OPS.index(tree[0]), _order(tree[1]), _order(tree[2]))


def canonical(tree: Tree) -> Tree:
    """The canonical form: operands of every ``+`` / ``*`` node sorted, nothing re-associated.

    >>> canonical(("*", ("-", 12, 7), 3))
    ('*', 3, ('-', 12, 7))
    """
    if isinstance(tree, int):
        return tree
    op, left, right = tree[0], canonical(tree[1]), canonical(tree[2])
    if op in "+*" and _order(right) < _order(left):
        left, right = right, left
    return (op, left, right)


def tree_code(tree: Tree) -> int:
    """Exact int32 code of a tree of at most 3 numbers in 0..99 (-1 for a bigger tree).

    Equal codes <=> equal canonical forms. Number ``n``: ``n + 1`` (1..100); an operation on
    two numbers: 101..40,100; on a number and such a pair (either side): 40,101..32,080,100.
    Commutative operands are ordered by code, so ``tree_code(t) == tree_code(canonical(t))``.
    """
    if isinstance(tree, int):
        return tree + 1 if 0 <= tree <= 99 else -1
    op = OPS.index(tree[0])
    ca, cb = tree_code(tree[1]), tree_code(tree[2])
    na, nb = len(_leaves(tree[1])), len(_leaves(tree[2]))
    if op in (0, 2) and ca > cb:
        ca, cb, na, nb = cb, ca, nb, na
    return _code(op, ca, cb, na, nb)


def _code(op, ca, cb, na, nb):
    """The formula of :func:`tree_code` (Python ints or int32 arrays alike)."""
    two = 101 + (op * 100 + ca - 1) * 100 + cb - 1
    left_leaf = 40_101 + ((op * 2) * 100 + ca - 1) * 40_000 + cb - 101
    right_leaf = 40_101 + ((op * 2 + 1) * 100 + cb - 1) * 40_000 + ca - 101
    if isinstance(op, int):
        ok = min(ca, cb) >= 1
        return (two if (na, nb) == (1, 1) else left_leaf if (na, nb) == (1, 2)
                else right_leaf if (na, nb) == (2, 1) else -1) if ok else -1
    ok = (ca >= 1) & (cb >= 1)
    return jnp.where(ok & (na == 1) & (nb == 1), two, jnp.where(ok & (na == 1) & (nb == 2), left_leaf, jnp.where(
        ok & (na == 2) & (nb == 1), right_leaf, -1)))


_PREC = {"+": 0, "-": 0, "*": 1, "/": 1}


def render(tree: Tree) -> str:
    """Text of ``tree`` with the fewest parentheses that parse back to the same tree.

    >>> render(("-", 12, ("-", 7, 3))), render(("-", ("-", 12, 7), 3))
    ('12-(7-3)', '12-7-3')
    """
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree

    def side(t, is_right):
        s = render(t)
        if isinstance(t, int):
            return s
        p, q = _PREC[t[0]], _PREC[op]
        return f"({s})" if p < q or (is_right and p == q) else s

    return side(left, False) + op + side(right, True)


def _trees(numbers: tuple) -> set:
    out = set()
    for a, b, c in set(itertools.permutations(numbers)):
        for o1, o2 in itertools.product(OPS, OPS):
            out.add((o2, (o1, a, b), c))
            out.add((o1, a, (o2, b, c)))
    return out


@functools.lru_cache(maxsize=512)
def expressions(numbers: tuple) -> dict:
    """``{value: canonical trees}`` of every expression using each of three numbers once.

    Values are :class:`~fractions.Fraction` (divisions by zero are left out); each value's
    trees are distinct canonical forms, in :func:`tree_code` order.
    """
    numbers = tuple(sorted(int(x) for x in numbers))
    if len(numbers) != 3:
        raise ValueError(f"numbers must be three integers, got {numbers}")
    by: dict = {}
    for t in _trees(numbers):
        v = evaluate(t)
        if v is not None:
            by.setdefault(v, set()).add(canonical(t))
    return {v: tuple(sorted(ts, key=tree_code)) for v, ts in by.items()}


def solutions(numbers, target: int) -> tuple:
    """The modes of a problem: its distinct canonical solutions, in :func:`tree_code` order.

    >>> [render(t) for t in solutions((2, 3, 4), 24)]        # 2*3*4, grouped three ways
    ['2*(3*4)', '3*(2*4)', '4*(2*3)']
    """
    return expressions(tuple(sorted(int(x) for x in numbers))).get(Fraction(int(target)), ())


# ====================================================================== host
def _tokens(text: str) -> list | None:
    out: list = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == " ":
            i += 1
        elif c in _DIGITS:
            j = i
            while j < n and text[j] in _DIGITS:
                j += 1
            lit = text[i:j]
            if j - i > MAX_LITERAL_DIGITS or (lit[0] == "0" and j - i > 1):
                return None
            out.append(int(lit))
            i = j
        elif c in "+-*/()":
            out.append(c)
            i += 1
        else:
            return None
    return out


class _Refused(Exception):
    pass


def parse(text) -> Tree | None:
    """The tree of an expression (``+ -`` and ``* /`` left-associative), or ``None``.

    Never raises and never does more than O(``MAX_CHARS``) work: anything that is not a
    ``str`` of at most ``MAX_CHARS`` characters, any other character than digits, ``+-*/()``
    and spaces, a number of more than ``MAX_LITERAL_DIGITS`` digits or with a leading zero,
    more than ``MAX_DEPTH`` nested parentheses, and any syntax error give ``None``.
    """
    if not isinstance(text, str) or len(text) > MAX_CHARS:
        return None
    toks = _tokens(text)
    if not toks:
        return None
    pos = [0]

    def peek():
        return toks[pos[0]] if pos[0] < len(toks) else None

    def take():
        pos[0] += 1
        return toks[pos[0] - 1]

    def expr(depth):
        t = term(depth)
        while peek() in ("+", "-"):
            op = take()
            t = (op, t, term(depth))
        return t

    def term(depth):
        t = factor(depth)
        while peek() in ("*", "/"):
            op = take()
            t = (op, t, factor(depth))
        return t

    def factor(depth):
        tok = peek()
        if isinstance(tok, int):
            return take()
        if tok == "(" and depth < MAX_DEPTH:
            take()
            t = expr(depth + 1)
            if take_if(")"):
                return t
        raise _Refused

    def take_if(c):
        if peek() == c:
            take()
            return True
        return False

    try:
        tree = expr(0)
    except _Refused:
        return None
    return tree if pos[0] == len(toks) else None


def reward(text, numbers, target) -> float:
    """1.0 if ``text`` is an expression that uses each of ``numbers`` exactly once (and no
    other number) and equals ``target`` exactly, else 0.0; never raises (see :func:`parse`).

    >>> reward("(12-7)*5", (5, 7, 12), 25), reward("12+7+5", (5, 7, 12), 25), reward("5**99", (5, 7, 12), 25)
    (1.0, 0.0, 0.0)
    """
    tree = parse(text)
    if tree is None or sorted(_leaves(tree)) != sorted(int(x) for x in numbers):
        return 0.0
    v = evaluate(tree)
    return float(v is not None and v == int(target))


def graded_reward(text, numbers, target) -> float:
    """The graded reward on the host: 1.0 where :func:`reward` is 1; for an expression that uses
    each number exactly once and misses, ``GRADED_CREDIT * max(0, 1 - |value - target| / target)``
    (float32 on device: equal to :func:`device_graded_reward` to rounding); else 0.0.

    >>> graded_reward("(12-7)*5", (5, 7, 12), 25), graded_reward("12+7+5", (5, 7, 12), 25)
    (1.0, 0.48)
    """
    tree = parse(text)
    if tree is None or sorted(_leaves(tree)) != sorted(int(x) for x in numbers):
        return 0.0
    v = evaluate(tree)
    if v is None:
        return 0.0
    if v == int(target):
        return 1.0
    t = max(int(target), 1)
    return GRADED_CREDIT * max(0.0, 1.0 - float(abs(v - t)) / t)


def mode_id(text, numbers, target) -> int:
    """Index of the canonical form of a correct ``text`` in ``solutions(numbers, target)``; -1
    where :func:`reward` is 0."""
    if reward(text, numbers, target) == 0.0:
        return -1
    return solutions(numbers, target).index(canonical(parse(text)))


# ================================================================== problems
@dataclass(frozen=True)
class Problems:
    """A set of problems (host-side NumPy arrays, one row per problem).

    Attributes:
      keys: list[str] ``"3,7,12=25"`` (numbers ascending), unique.
      numbers: i32[N, 3] ascending; target: i32[N].
      n_modes: i32[N] number of canonical solutions.
      modes: list[tuple[str, ...]] the canonical solutions' text, in mode-id order.
      mode_codes: i32[N, MAX_MODES] their :func:`tree_code` (-1 after the last).
      prompts: i32[N, PROMPT_LEN] prompt tokens.
      solutions: i32[N, MAX_MODES, COMPLETION_LEN] each mode's completion tokens (rows of
        ``PAD`` after the last), e.g. a warm start's targets.
    """

    keys: list
    numbers: np.ndarray
    target: np.ndarray
    n_modes: np.ndarray
    modes: list
    mode_codes: np.ndarray
    prompts: np.ndarray
    solutions: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    def take(self, idx) -> Problems:
        idx = np.asarray(idx, np.int64)
        return Problems([self.keys[i] for i in idx], self.numbers[idx], self.target[idx], self.n_modes[idx],
                        [self.modes[i] for i in idx], self.mode_codes[idx], self.prompts[idx],
                        self.solutions[idx])


def _check_settings(numbers, target_max, min_modes, max_modes, number_targets=False):
    numbers = tuple(int(x) for x in numbers)
    if len(numbers) < 3 or len(set(numbers)) != len(numbers) or min(numbers) < 0 or max(numbers) > 99:
        raise ValueError(f"numbers must be at least 3 distinct integers in 0..99, got {numbers}")
    if not 1 <= target_max <= 99:
        raise ValueError(f"target_max must be in 1..99 (the prompt holds two target digits), got {target_max}")
    if not 1 <= min_modes <= max_modes <= MAX_MODES:
        raise ValueError(f"need 1 <= min_modes <= max_modes <= {MAX_MODES}, got min_modes={min_modes}, "
                         f"max_modes={max_modes}")
    if not isinstance(number_targets, (bool, np.bool_)):
        raise ValueError(f"number_targets must be a bool, got {number_targets!r}")
    return numbers


@functools.lru_cache(maxsize=8)
def _candidates(numbers, target_max, min_modes, max_modes, number_targets) -> Problems:
    rows = []
    for triple in itertools.combinations(sorted(numbers), 3):
        for v, trees in expressions(triple).items():
            if (v.denominator == 1 and 1 <= v <= target_max and min_modes <= len(trees) <= max_modes
                    and (number_targets or int(v) not in triple)):
                rows.append((triple, int(v), trees))
    rows.sort(key=lambda r: (r[0], r[1]))
    n = len(rows)
    codes = np.full((n, MAX_MODES), -1, np.int32)
    sols = np.full((n, MAX_MODES, COMPLETION_LEN), PAD, np.int32)
    modes = []
    for i, (_, _, trees) in enumerate(rows):
        texts = tuple(render(t) for t in trees)
        modes.append(texts)
        codes[i, : len(trees)] = [tree_code(t) for t in trees]
        sols[i, : len(trees)] = encode_completions(texts)
    keys = [f"{a},{b},{c}={t}" for (a, b, c), t, _ in rows]
    out = Problems(keys, np.array([r[0] for r in rows], np.int32).reshape(n, 3),
                    np.array([r[1] for r in rows], np.int32), np.array([len(r[2]) for r in rows], np.int32),
                    modes, codes, encode_prompts(keys), sols)
    for f in ("numbers", "target", "n_modes", "mode_codes", "prompts", "solutions"):
        getattr(out, f).setflags(write=False)     # cached and shared: take() gives writable copies
    return out


def candidates(numbers=NUMBERS, target_max: int = TARGET_MAX, min_modes: int = MIN_MODES,
               max_modes: int = MAX_MODES, number_targets: bool = False) -> Problems:
    """Every problem (three of ``numbers``, a target in 1..``target_max`` with ``min_modes`` to
    ``max_modes`` modes; a target equal to one of the three numbers only with ``number_targets``),
    sorted by numbers then target: 787 with the defaults (the paper's pool), 1,015 with
    ``**POOLS["full"]``."""
    nums = _check_settings(numbers, target_max, min_modes, max_modes, number_targets)
    return _candidates(nums, int(target_max), int(min_modes), int(max_modes), bool(number_targets))


def make_splits(seed: int = 0, n_train: int = N_TRAIN, n_eval: int = N_EVAL, **settings) -> tuple:
    """``(train, eval)`` :class:`Problems`: disjoint random draws from :func:`candidates`
    (``settings`` go there), the same for the same ``seed``."""
    pool = candidates(**settings)
    if n_train < 1 or n_eval < 1 or n_train + n_eval > len(pool):
        raise ValueError(f"need n_train >= 1, n_eval >= 1 and n_train + n_eval <= {len(pool)} candidates, "
                         f"got n_train={n_train}, n_eval={n_eval}")
    perm = np.random.default_rng(seed).permutation(len(pool))
    return pool.take(np.sort(perm[:n_train])), pool.take(np.sort(perm[n_train:n_train + n_eval]))


def summary(problems: Problems) -> dict:
    """``{"problems": N, "modes": {k: count}, "targets": {"1-9": count, ...}}`` (JSON-ready)."""
    m = np.bincount(problems.n_modes, minlength=MAX_MODES + 1)
    t = np.bincount(problems.target // 10, minlength=10)
    return {"problems": len(problems),
            "modes": {int(k): int(m[k]) for k in range(1, MAX_MODES + 1) if m[k]},
            "targets": {f"{max(10 * k, 1)}-{10 * k + 9}": int(t[k]) for k in range(10) if t[k]}}


# ================================================================== tokens
def encode_prompts(keys: list) -> np.ndarray:
    """i32[N, PROMPT_LEN] tokens of ``"KEY:"`` left-padded with PAD."""
    texts = [f"{k}:" for k in keys]
    long = [t for t in texts if len(t) > PROMPT_LEN]
    if long:
        raise ValueError(f"prompt {long[0]!r} is longer than PROMPT_LEN={PROMPT_LEN}")
    raw = np.frombuffer("".join(t.rjust(PROMPT_LEN) for t in texts).encode("ascii"), np.uint8)
    tok = _LUT[raw.reshape(len(texts), PROMPT_LEN)]
    return np.where(raw.reshape(tok.shape) == ord(" "), PAD, tok).astype(np.int32)


def encode_completions(texts) -> np.ndarray:
    """i32[N, COMPLETION_LEN]: each text's characters, EOS, then PAD."""
    out = np.full((len(texts), COMPLETION_LEN), PAD, np.int32)
    for i, t in enumerate(texts):
        if len(t) >= COMPLETION_LEN or any(c not in _TOK for c in t):
            raise ValueError(f"completion {t!r} needs at most {COMPLETION_LEN - 1} characters of VOCAB")
        out[i, : len(t)] = [_TOK[c] for c in t]
        out[i, len(t)] = EOS
    return out


def completion_text(tokens) -> str | None:
    """The characters before the first EOS (``None`` without EOS); PAD reads ``"_"`` and an
    id outside the vocabulary ``"?"``, which no parser accepts."""
    t = np.asarray(tokens).reshape(-1)
    end = np.flatnonzero(t == EOS)
    if not len(end):
        return None
    t = t[: end[0]]
    ok = (t >= 0) & (t < VOCAB_SIZE)
    return "".join(np.where(ok, _CHARS[np.clip(t, 0, VOCAB_SIZE - 1)], "?"))


def host_rewards(tokens, numbers, targets) -> np.ndarray:
    """f32[P, G] :func:`reward` of each completion ``tokens i32[P, G, L]`` of problems
    ``numbers i32[P, 3]``, ``targets i32[P]`` (the reference for :func:`device_verify`)."""
    tok = np.asarray(tokens)
    return np.array([[reward(completion_text(c), numbers[p], targets[p]) for c in tok[p]]
                     for p in range(tok.shape[0])], np.float32).reshape(tok.shape[:2])


def host_mode_ids(tokens, numbers, targets) -> np.ndarray:
    """i32[P, G] :func:`mode_id` of each completion (-1 where the reward is 0)."""
    tok = np.asarray(tokens)
    return np.array([[mode_id(completion_text(c), numbers[p], targets[p]) for c in tok[p]]
                     for p in range(tok.shape[0])], np.int32).reshape(tok.shape[:2])


# ==================================================================== device
def _combine(op, a, b):
    """``a op b`` on values ``i32[4] = (p, q, code, n_numbers)``; also whether it divides by 0."""
    p1, q1, c1, n1 = a[0], a[1], a[2], a[3]
    p2, q2, c2, n2 = b[0], b[1], b[2], b[3]
    p = jnp.select([op == 0, op == 1, op == 2], [p1 * q2 + p2 * q1, p1 * q2 - p2 * q1, p1 * p2], p1 * q2)
    q = jnp.where(op == 3, q1 * p2, q1 * q2)
    swap = ((op == 0) | (op == 2)) & (c1 > c2)
    ca, cb = jnp.where(swap, c2, c1), jnp.where(swap, c1, c2)
    na, nb = jnp.where(swap, n2, n1), jnp.where(swap, n1, n2)
    return jnp.stack([p, q, _code(op, ca, cb, na, nb), n1 + n2]), (op == 3) & (p2 == 0)


def _sel(cond, new: dict, old: dict) -> dict:
    return {k: old[k] if new[k] is old[k] else jnp.where(cond, new[k], old[k]) for k in old}


def _get(arr, k):
    """``arr[k]`` by a one-hot sum (cheaper to compile under vmap than a gather)."""
    hot = jnp.arange(arr.shape[0]) == k
    return jnp.sum(jnp.where(hot.reshape((-1,) + (1,) * (arr.ndim - 1)), arr, 0), axis=0).astype(arr.dtype)


def _put(arr, k, v):
    """``arr.at[k].set(v)`` by a one-hot select."""
    hot = jnp.arange(arr.shape[0]) == k
    return jnp.where(hot.reshape((-1,) + (1,) * (arr.ndim - 1)), v, arr)


def _feed(st: dict, v, cond) -> dict:
    """Give factor ``v`` to the open term of the current level (where ``cond``)."""
    k = st["depth"]
    T = _get(st["T"], k)
    prod, dz = _combine(_get(st["mulop"], k), T, v)
    has = _get(st["hasT"], k)
    new = {**st, "T": _put(st["T"], k, jnp.where(has, prod, v)), "hasT": _put(st["hasT"], k, True),
           "div0": st["div0"] | (has & dz), "expect": jnp.bool_(False)}
    return _sel(cond, new, st)


def _close(st: dict):
    """The value of the current level (its sum so far combined with its open term)."""
    k = st["depth"]
    T = _get(st["T"], k)
    s, dz = _combine(_get(st["addop"], k), _get(st["S"], k), T)
    has = _get(st["hasS"], k)
    return jnp.where(has, s, T), has & dz


def _step(st: dict, tok, numbers):
    active = ~(st["done"] | st["err"])
    is_digit = (tok >= 1) & (tok <= 10)
    # a number ends at the first non-digit
    end = st["in_lit"] & ~is_digit
    lit = st["lit"]
    hit = lit == numbers
    s = {**st, "in_lit": st["in_lit"] & is_digit,
         "used": st["used"] + jnp.where(end, hit.astype(jnp.int32), 0),
         "bad_number": st["bad_number"] | (end & ~jnp.any(hit))}
    s = _feed(s, jnp.stack([lit, jnp.int32(1), lit + 1, jnp.int32(1)]), end)
    k = s["depth"]
    # digit: start or extend a number
    d = tok - 1
    cont = s["in_lit"]
    s_digit = {**s, "in_lit": jnp.bool_(True), "lit": jnp.where(cont, lit * 10 + d, d),
               "lit_len": jnp.where(cont, s["lit_len"] + 1, 1), "lit_zero": jnp.where(cont, s["lit_zero"], d == 0),
               "err": jnp.where(cont, s["lit_zero"] | (s["lit_len"] >= MAX_LITERAL_DIGITS), ~s["expect"])}
    # + -: the open term joins the level's sum
    total, dz = _close(s)
    s_add = {**s, "S": _put(s["S"], k, total), "hasS": _put(s["hasS"], k, True),
             "hasT": _put(s["hasT"], k, False), "addop": _put(s["addop"], k, jnp.where(tok == _PLUS, 0, 1)),
             "div0": s["div0"] | dz, "expect": jnp.bool_(True), "err": s["expect"]}
    # * /: the next factor joins the open term
    s_mul = {**s, "mulop": _put(s["mulop"], k, jnp.where(tok == _STAR, 2, 3)), "expect": jnp.bool_(True),
             "err": s["expect"]}
    # (: a fresh level
    k1 = jnp.minimum(k + 1, MAX_DEPTH)
    s_open = {**s, "depth": k1, "hasS": _put(s["hasS"], k1, False), "hasT": _put(s["hasT"], k1, False),
              "err": ~s["expect"] | (k >= MAX_DEPTH)}
    # ): the level's value is a factor of the level below
    s_close = {**s, "depth": jnp.maximum(k - 1, 0), "div0": s["div0"] | dz}
    s_close = {**_feed(s_close, total, jnp.bool_(True)), "err": s["expect"] | (k == 0)}
    # EOS: the whole expression
    s_eos = {**s, "result": total, "div0": s["div0"] | dz, "done": jnp.bool_(True), "err": s["expect"] | (k != 0)}
    s_bad = {**s, "err": jnp.bool_(True)}
    new = s_bad
    for cond, branch in ((is_digit, s_digit), ((tok == _PLUS) | (tok == _MINUS), s_add),
                         ((tok == _STAR) | (tok == _SLASH), s_mul), (tok == _LPAR, s_open),
                         (tok == _RPAR, s_close), (tok == EOS, s_eos)):
        new = _sel(cond, branch, new)
    new["err"] = st["err"] | new["err"]
    return _sel(active, new, st)


def _parse(tokens: jax.Array, numbers: jax.Array) -> tuple:
    """``(ok, p, q, code, n)`` of one completion: ``ok`` it parses and uses the problem's numbers
    exactly (no division by 0, ``q != 0``), its value ``p / q``, its tree code and its number count."""
    levels = MAX_DEPTH + 1
    z4 = jnp.zeros((levels, 4), jnp.int32)
    zb = jnp.zeros((levels,), bool)
    zi = jnp.zeros((levels,), jnp.int32)
    f, t = jnp.bool_(False), jnp.bool_(True)
    st = {"S": z4, "T": z4, "hasS": zb, "hasT": zb, "addop": zi, "mulop": zi, "depth": jnp.int32(0),
          "expect": t, "in_lit": f, "lit": jnp.int32(0), "lit_len": jnp.int32(0), "lit_zero": f,
          "used": jnp.zeros((3,), jnp.int32), "bad_number": f, "div0": f, "err": f, "done": f,
          "result": jnp.zeros((4,), jnp.int32)}
    required = jnp.sum(numbers[:, None] == numbers[None, :], axis=1).astype(jnp.int32)
    st, _ = jax.lax.scan(lambda s, x: (_step(s, x, numbers), None), st, tokens)
    parsed = st["done"] & ~st["err"]
    p, q, code, n = st["result"][0], st["result"][1], st["result"][2], st["result"][3]
    ok = parsed & ~st["bad_number"] & ~st["div0"] & jnp.all(st["used"] == required) & (q != 0)
    return ok, p, q, jnp.where(parsed & (n <= 3), code, -1).astype(jnp.int32)


def verify(tokens: jax.Array, numbers: jax.Array, target: jax.Array) -> tuple:
    """Verify one completion on device (unbatched; ``jax.vmap`` it).

    Args:
      tokens: i32[L] the completion (an expression, then EOS; anything after EOS is ignored).
      numbers: i32[3] the problem's numbers; target: i32[] its target.

    Returns:
      ``(correct, code)``: ``bool[]`` equal to ``reward(completion_text(tokens), numbers, target) == 1``,
      and ``i32[]`` the :func:`tree_code` of the parsed expression (-1 where it does not
      parse or has more than 3 numbers; set whether or not it is correct).
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    numbers = jnp.asarray(numbers, jnp.int32)
    if tokens.ndim != 1 or numbers.shape != (3,) or jnp.ndim(target) != 0:
        raise ValueError(f"verify takes tokens i32[L], numbers i32[3] and a scalar target, got shapes "
                         f"{tokens.shape}, {numbers.shape}, {jnp.shape(target)} (vmap it for a batch)")
    ok, p, q, code = _parse(tokens, numbers)
    return ok & (p == jnp.asarray(target, jnp.int32) * q), code


#: the graded reward's credit for a well-formed answer that misses: GRADED_CREDIT x (1 - relative miss)
GRADED_CREDIT = 0.5


def device_graded_reward(tokens: jax.Array, numbers: jax.Array, targets: jax.Array) -> jax.Array:
    """The graded reward of a batch of groups: 1 for a correct answer; for a well-formed one
    (parses, uses each number exactly once, no division by zero) that misses,
    ``GRADED_CREDIT * max(0, 1 - |value - target| / target)``; 0 otherwise.

    Args:
      tokens: i32[P, G, L]; numbers: i32[P, 3]; targets: i32[P] (>= 1).

    Returns:
      f32[P, G], in [0, 1]; equal to 1 exactly where :func:`device_verify` rewards 1.
    """
    def one(tok, num, t):
        ok, p, q, _ = _parse(tok, num)
        t = jnp.asarray(t, jnp.int32)
        exact = ok & (p == t * q)
        tf = jnp.maximum(t.astype(jnp.float32), 1.0)
        miss = jnp.abs(p.astype(jnp.float32) / jnp.where(q == 0, 1, q).astype(jnp.float32) - tf) / tf
        part = GRADED_CREDIT * jnp.clip(1.0 - miss, 0.0, 1.0)
        return jnp.where(exact, 1.0, jnp.where(ok, jnp.minimum(part, GRADED_CREDIT), 0.0))

    return jax.vmap(jax.vmap(one, in_axes=(0, None, None)))(jnp.asarray(tokens, jnp.int32),
                                                             jnp.asarray(numbers, jnp.int32),
                                                             jnp.asarray(targets, jnp.int32))


def device_verify(tokens: jax.Array, numbers: jax.Array, targets: jax.Array) -> tuple:
    """Rewards and codes of a batch of groups (jittable; the training step's reward).

    Args:
      tokens: i32[P, G, L] completions; numbers: i32[P, 3]; targets: i32[P].

    Returns:
      ``(reward f32[P, G], code i32[P, G])``: reward equal to :func:`host_rewards`; code as in
      :func:`verify`.
    """
    if jnp.ndim(tokens) != 3 or jnp.shape(numbers) != (jnp.shape(tokens)[0], 3) or \
            jnp.shape(targets) != (jnp.shape(tokens)[0],):
        raise ValueError(f"device_verify takes tokens i32[P, G, L], numbers i32[P, 3], targets i32[P], got shapes "
                         f"{jnp.shape(tokens)}, {jnp.shape(numbers)}, {jnp.shape(targets)}")
    ok, code = jax.vmap(jax.vmap(verify, in_axes=(0, None, None)))(tokens, numbers, targets)
    return ok.astype(jnp.float32), code


def device_mode_ids(reward: jax.Array, code: jax.Array, mode_codes: jax.Array) -> jax.Array:
    """i32[P, G] mode id of each correct completion (index of its code in ``mode_codes
    i32[P, MAX_MODES]``), -1 where the reward is 0; equal to :func:`host_mode_ids`."""
    eq = (code[:, :, None] == mode_codes[:, None, :]) & (mode_codes[:, None, :] >= 0)
    return jnp.where((reward > 0) & jnp.any(eq, -1), jnp.argmax(eq, -1), -1).astype(jnp.int32)


def device_cluster_ids(code: jax.Array) -> jax.Array:
    """i32[P, G] answer clusters for SEED-GRPO: completions with the same canonical form
    (``code >= 0``, right or wrong) share an id (first-seen order); one that does not parse
    gets its own fresh id after the real ones (the convention of ``maxent.cluster_ids``)."""
    has = code >= 0
    eq = (code[:, :, None] == code[:, None, :]) & has[:, :, None] & has[:, None, :]
    first = jnp.argmax(eq, axis=-1)
    is_first = has & (first == jnp.arange(code.shape[1]))
    rank = jnp.cumsum(is_first, axis=-1) - 1
    real = jnp.take_along_axis(rank, first, axis=-1)
    fresh = jnp.sum(is_first, axis=-1, keepdims=True) + jnp.cumsum(~has, axis=-1) - 1
    return jnp.where(has, real, fresh).astype(jnp.int32)


def mode_metrics(mode_ids: jax.Array, n_modes: jax.Array) -> tuple:
    """``(distinct f32[P], coverage f32[P])`` of ``mode_ids i32[P, G]`` (-1: not correct):
    distinct modes found in the group (distinct@G) and their share of the problem's
    ``n_modes i32[P]`` (coverage@G)."""
    hit = jnp.any(mode_ids[:, :, None] == jnp.arange(MAX_MODES), axis=1)
    distinct = jnp.sum(hit, axis=-1).astype(jnp.float32)
    return distinct, distinct / jnp.maximum(n_modes, 1).astype(jnp.float32)
