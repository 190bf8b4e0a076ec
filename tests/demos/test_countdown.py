"""Countdown task (ModeBench): enumeration, canonical forms, splits, host reward, device verifier."""

from __future__ import annotations

import itertools
from fractions import Fraction

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from jaxweight.demos.lm import _countdown_task as C
from jaxweight.demos.lm import _task


def _canon_set(texts):
    return {C.canonical(C.parse(t)) for t in texts}


# ---------------------------------------------------------------- enumeration
# modes of (2, 3, 4) worked out by hand, spelled in any order / grouping
HAND = {
    24: ["(2*3)*4", "2*(3*4)", "(2*4)*3"],                       # only products; three groupings
    20: ["(2+3)*4"],
    9: ["2+3+4", "2+(3+4)", "(2+4)+3"],                           # only sums; three groupings
    2: ["3*2-4", "(4-3)*2", "2/(4-3)", "(4+2)/3"],
    1: ["(2+3)-4", "2+(3-4)", "3+(2-4)", "2-(4-3)", "3-(4-2)", "3-4/2"],
}


@pytest.mark.parametrize("target", sorted(HAND))
def test_modes_of_2_3_4_by_hand(target):
    modes = C.solutions((4, 2, 3), target)                      # order of the numbers is irrelevant
    assert set(modes) == _canon_set(HAND[target]) and len(modes) == len(HAND[target])
    assert all(C.evaluate(t) == target for t in modes)
    assert [C.tree_code(t) for t in modes] == sorted(C.tree_code(t) for t in modes)
    assert C.solutions((2, 3, 4), 25) == ()                        # 25 is out of reach of 2, 3, 4


def _values_by_splitting(nums):
    """Reachable values by the classic "combine two sub-multisets" recursion (independent of the trees)."""
    if len(nums) == 1:
        return {Fraction(nums[0])}
    out = set()
    idx = range(len(nums))
    for r in range(1, len(nums)):
        for left in itertools.combinations(idx, r):
            a = _values_by_splitting([nums[i] for i in left])
            b = _values_by_splitting([nums[i] for i in idx if i not in left])
            for x, y in itertools.product(a, b):
                out |= {x + y, x - y, x * y} | ({x / y} if y else set())
    return out


@pytest.mark.parametrize("nums", [(2, 3, 4), (5, 7, 12), (2, 6, 12), (9, 10, 11)])
def test_enumeration_reaches_exactly_the_values_of_an_independent_recursion(nums):
    ex = C.expressions(nums)
    assert set(ex) == _values_by_splitting(list(nums))
    every = [t for ts in ex.values() for t in ts]
    assert len(set(every)) == len(every)                               # one value per canonical form
    assert all(C.canonical(t) == t and C.evaluate(t) == v for v, ts in ex.items() for t in ts)


def test_every_spelling_of_every_expression_lands_on_a_mode():
    """All 192 trees of each triple, rendered fully parenthesised and parsed back: the correct
    ones map onto the modes of their value, and every mode is hit."""
    for nums in [(2, 3, 4), (3, 8, 11), (2, 5, 10)]:
        hit = {}
        for a, b, c in itertools.permutations(nums):
            for o1, o2 in itertools.product("+-*/", repeat=2):
                for text in (f"(({a}){o1}{b}){o2}({c})", f"{a}{o1}({b}{o2}{c})"):
                    v = C.evaluate(C.parse(text))
                    if v is None or v.denominator != 1 or v < 1:
                        continue
                    assert C.reward(text, nums, int(v)) == 1.0
                    m = C.mode_id(text, nums, int(v))
                    assert 0 <= m < len(C.solutions(nums, int(v)))
                    hit.setdefault(int(v), set()).add(m)
        for v, ms in hit.items():
            assert ms == set(range(len(C.solutions(nums, v))))


# ---------------------------------------------------------------- canonical form
_triples = st.lists(st.integers(2, 12), min_size=3, max_size=3, unique=True)


@st.composite
def _trees(draw):
    a, b, c = draw(st.permutations(draw(_triples)))
    o1, o2 = draw(st.sampled_from("+-*/")), draw(st.sampled_from("+-*/"))
    return (o2, (o1, a, b), c) if draw(st.booleans()) else (o1, a, (o2, b, c))


def _swap_at(tree, path):
    if not path:
        return (tree[0], tree[2], tree[1])
    i = path[0]
    parts = list(tree)
    parts[i] = _swap_at(tree[i], path[1:])
    return tuple(parts)


def _nodes(tree, path=()):
    if isinstance(tree, int):
        return []
    return [path] + _nodes(tree[1], path + (1,)) + _nodes(tree[2], path + (2,))


def _node(tree, path):
    for i in path:
        tree = tree[i]
    return tree


@settings(max_examples=300, deadline=None)
@given(_trees(), st.integers(0, 1))
def test_canonical_form_sorts_commutative_operands_only(tree, which):
    path = _nodes(tree)[which]
    swapped = _swap_at(tree, path)
    node = _node(tree, path)
    same = C.canonical(swapped) == C.canonical(tree)
    if node[0] in "+*":
        assert same and C.tree_code(swapped) == C.tree_code(tree)
    elif C.canonical(node[1]) != C.canonical(node[2]):
        assert not same and C.tree_code(swapped) != C.tree_code(tree)
    canon = C.canonical(tree)
    assert C.canonical(canon) == canon and C.evaluate(canon) == C.evaluate(tree)
    assert C.parse(C.render(canon)) == canon and C.parse(C.render(tree)) == tree   # fewest parens round trip


def test_canonical_form_keeps_grouping_and_operators():
    diff = [("2+(3+4)", "(2+3)+4"), ("12-7+3", "12-(7-3)"), ("3*4/2", "3*(4/2)"), ("2*3-4", "2*(3-4)")]
    for x, y in diff:
        assert C.canonical(C.parse(x)) != C.canonical(C.parse(y))
    for x, y in [("(12-7)*3", "3*(12-7)"), ("4+(2+3)", "(3+2)+4"), ("(3+2)*(4)", "4*(2+3)")]:
        assert C.canonical(C.parse(x)) == C.canonical(C.parse(y))


def test_tree_code_is_injective_on_canonical_forms():
    codes = {}
    for nums in [(2, 3, 4), (10, 11, 12), (2, 7, 12)]:
        for ts in C.expressions(nums).values():
            for t in ts:
                assert codes.setdefault(C.tree_code(t), t) == t
    assert min(codes) > 0 and max(codes) < 2**31
    assert C.tree_code(("+", 1, ("+", 2, ("+", 3, 4)))) == -1                      # more than 3 numbers


# ---------------------------------------------------------------- problems and splits
def test_candidates_hold_only_kept_problems_with_their_modes():
    pool = C.candidates()
    assert len(set(pool.keys)) == len(pool) >= C.N_TRAIN + C.N_EVAL
    assert ((pool.n_modes >= C.MIN_MODES) & (pool.n_modes <= C.MAX_MODES)).all()
    assert ((pool.target >= 1) & (pool.target <= C.TARGET_MAX)).all()
    assert (np.diff(pool.numbers, axis=1) > 0).all() and np.isin(pool.numbers, C.NUMBERS).all()
    s = C.summary(pool)
    assert sum(s["modes"].values()) == sum(s["targets"].values()) == len(pool)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(pool), 40, replace=False):
        nums, t = pool.numbers[i], int(pool.target[i])
        sols = C.solutions(nums, t)
        assert pool.modes[i] == tuple(C.render(x) for x in sols) and pool.n_modes[i] == len(sols)
        np.testing.assert_array_equal(pool.mode_codes[i, : len(sols)], [C.tree_code(x) for x in sols])
        assert (pool.mode_codes[i, len(sols):] == -1).all()
        for m, text in enumerate(pool.modes[i]):
            assert C.completion_text(pool.solutions[i, m]) == text and C.mode_id(text, nums, t) == m
        assert C.completion_text(pool.prompts[i][pool.prompts[i] != C.PAD].tolist() + [C.EOS]) == pool.keys[i] + ":"
    # a (numbers, target) pair with 1 or more than 8 modes is not a candidate
    assert "2,3,4=20" not in pool.keys and "2,3,4=24" in pool.keys


def test_splits_disjoint_sized_and_deterministic():
    tr, ev = C.make_splits(0)
    assert (len(tr), len(ev)) == (C.N_TRAIN, C.N_EVAL)
    assert not set(tr.keys) & set(ev.keys)
    assert set(tr.keys) | set(ev.keys) <= set(C.candidates().keys)
    tr2, ev2 = C.make_splits(0)
    assert tr2.keys == tr.keys and ev2.keys == ev.keys
    np.testing.assert_array_equal(tr2.prompts, tr.prompts)
    tr3, _ = C.make_splits(1)
    assert tr3.keys != tr.keys
    assert (tr.prompts[:, -1] == C.VOCAB.index(":")).all()                     # prompts end at one position


def test_vocabulary_extends_the_arithmetic_one():
    assert C.VOCAB[: len(_task.VOCAB)] == _task.VOCAB
    assert (C.PAD, C.EOS) == (_task.PAD, _task.EOS) and C.VOCAB_SIZE == len(set(C.VOCAB))
    # every prompt and every canonical solution of every candidate fits
    pool = C.candidates()
    assert (pool.prompts != C.PAD).any(axis=1).all()
    assert ((pool.solutions == C.EOS).sum(-1) == (np.arange(C.MAX_MODES) < pool.n_modes[:, None])).all()


@pytest.mark.parametrize("kw", [dict(target_max=100), dict(target_max=0), dict(min_modes=3, max_modes=2),
                                dict(max_modes=9), dict(numbers=(2, 2, 3)), dict(numbers=(2, 3))])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError, match=next(iter(kw)) if "numbers" not in kw else "numbers"):
        C.candidates(**kw)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="n_train"):
        C.make_splits(0, n_train=len(C.candidates()), n_eval=1)
    with pytest.raises(ValueError, match="completion"):
        C.encode_completions(["(10+11)*12+9"])
    with pytest.raises(ValueError, match="completion"):
        C.encode_completions(["2^3"])
    with pytest.raises(ValueError, match="verify"):
        C.verify(jnp.zeros((2, 12), jnp.int32), jnp.array([2, 3, 4]), 9)
    with pytest.raises(ValueError, match="device_verify"):
        C.device_verify(jnp.zeros((2, 3, 12), jnp.int32), jnp.array([2, 3, 4]), jnp.array([9, 9]))


# ---------------------------------------------------------------- host reward
RIGHT = ["(12-7)*5", "5*(12-7)", "(5)*((12)-7)", "((12-7)*5)", "( 12 - 7 ) * 5"]
WRONG = ["12+7+5", "12-7", "(12-7)*5*1", "(12-7)*5+0", "(12-7)*5-5+5", "5*5", "(7-12)*5", "(12-7)*05",
         "12*5-7*5", "-5*(7-12)", "5(12-7)", "(12-7*5", "12-7)*5", "(12-7)*5)", "(12-7)**5", "12-7*5", "+12-7",
         "(12-7)*5=25", "<answer>(12-7)*5</answer>", "(12−7)*5", "(12-7)×5", "()", "5*()", "12/(7-7)*5"]


def test_reward_on_right_and_wrong_answers():
    for text in RIGHT:
        assert C.reward(text, (5, 7, 12), 25) == 1.0, text
    for text in WRONG:
        assert C.reward(text, (5, 7, 12), 25) == 0.0, text
    # exact arithmetic: intermediate fractions, and a value that is only near the target
    assert C.reward("12/(3/2)", (2, 3, 12), 8) == 1.0 and C.reward("12*(2/3)", (2, 3, 12), 8) == 1.0
    assert C.reward("7/3*3", (3, 3, 7), 7) == 1.0 and C.reward("2/3+12", (2, 3, 12), 12) == 0.0
    assert C.reward("12/(4-4)", (4, 4, 12), 0) == 0.0                      # division by zero


MALICIOUS = ["999999999999**99", "9" * 10_000, "(" * 10_000 + "5" + ")" * 10_000, "1+" * 5_000 + "1",
             "x" * 10_000, "", " ", "٣+٤*٥", "²+³", "１+２", "\x00\x00", "🤖" * 100, "\ud800", "5" * 64,
             "(" * 9 + "5" + ")" * 9, None, 25, b"(12-7)*5", ["(12-7)*5"]]


def test_malicious_input_gives_zero_and_is_refused_before_any_arithmetic(monkeypatch):
    calls = []
    real_eval, real_tok = C.evaluate, C._tokens
    monkeypatch.setattr(C, "evaluate", lambda t: calls.append("eval") or real_eval(t))
    monkeypatch.setattr(C, "_tokens", lambda s: calls.append(len(s)) or real_tok(s))
    for text in MALICIOUS:
        assert C.reward(text, (5, 7, 12), 25) == 0.0 and C.mode_id(text, (5, 7, 12), 25) == -1
    # over-length text is never even tokenised; nothing here reaches evaluate (numbers are checked first)
    assert "eval" not in calls and all(n <= C.MAX_CHARS for n in calls if n != "eval")
    # the depth cap: MAX_DEPTH nested parentheses parse, one more does not
    assert C.parse("(" * C.MAX_DEPTH + "5" + ")" * C.MAX_DEPTH) == 5
    assert C.parse("(" * (C.MAX_DEPTH + 1) + "5" + ")" * (C.MAX_DEPTH + 1)) is None
    assert C.parse("1+" * 31 + "1") is not None and C.parse("1+" * 32 + "1") is None     # 63 / 65 characters


# ---------------------------------------------------------------- device verifier
_ALPHABET = np.array([C.VOCAB.index(c) for c in "0123456789+-*/()"] + [C.EOS])
_OTHER = np.array([C.PAD, C.VOCAB.index("="), C.VOCAB.index(","), C.VOCAB.index(":"), C.VOCAB_SIZE, -3])


def _batch(problems, rng, g=24, length=C.COMPLETION_LEN):
    """Completions per problem: its modes, re-spelt and re-ordered expressions of its numbers
    (right and wrong), near misses, random strings over the expression alphabet, junk."""
    p = len(problems)
    out = np.full((p, g, length), C.PAD, np.int32)
    for i in range(p):
        a, b, c = (int(x) for x in problems.numbers[i])
        for j in range(g):
            kind = j % 6
            if kind == 0:
                out[i, j, :C.COMPLETION_LEN] = problems.solutions[i, j // 6 % problems.n_modes[i]]
                continue
            if kind in (1, 2):
                x, y, z = rng.permutation([a, b, c])
                o1, o2 = rng.choice(list("+-*/"), 2)
                forms = [f"{x}{o1}{y}{o2}{z}", f"({x}{o1}{y}){o2}{z}", f"{x}{o1}({y}{o2}{z})", f"(({x}){o1}{y}){o2}{z}",
                         f"{x}{o1}{y}", f"{x}{o1}{y}{o2}{z}{o1}{x}", f"{x}{o1}0{y}{o2}{z}", f"{x}{o1}({y}{o2}{z}"]
                text = forms[rng.integers(len(forms))][: length - 1]
                out[i, j, : len(text)] = [C.VOCAB.index(ch) for ch in text]
                out[i, j, len(text)] = C.EOS
            elif kind in (3, 4):
                out[i, j] = rng.choice(_ALPHABET[:-1], length)
                out[i, j, rng.integers(3, length)] = C.EOS
            else:
                out[i, j] = rng.choice(np.concatenate([_ALPHABET, _OTHER]), length)
    return out


def _host_codes(tokens):
    t = np.asarray(tokens)
    out = np.full(t.shape[:2], -1, np.int32)
    for i, j in np.ndindex(*t.shape[:2]):
        text = C.completion_text(t[i, j])
        tree = C.parse(text) if text is not None else None
        out[i, j] = C.tree_code(tree) if tree is not None else -1
    return out


def test_device_verifier_equals_the_host_reward_codes_and_mode_ids(jit_or_eager):
    tr, _ = C.make_splits(0)
    rng = np.random.default_rng(1)
    probs = tr.take(rng.choice(len(tr), 24 if jit_or_eager is jax.jit else 6, replace=False))
    tok = _batch(probs, rng)
    reward, code = jit_or_eager(C.device_verify)(tok, probs.numbers, probs.target)
    host = C.host_rewards(tok, probs.numbers, probs.target)
    np.testing.assert_array_equal(np.asarray(reward), host)
    assert host[:, ::6].all() and (host == 0).mean() > 0.5              # every mode is right; most others not
    np.testing.assert_array_equal(np.asarray(code), _host_codes(tok))
    ids = jit_or_eager(C.device_mode_ids)(reward, code, probs.mode_codes)
    np.testing.assert_array_equal(np.asarray(ids), C.host_mode_ids(tok, probs.numbers, probs.target))


@st.composite
def _strings(draw):
    """A triple and a string over the expression alphabet, its numbers among the pieces."""
    nums = draw(_triples)
    pieces = draw(st.lists(st.sampled_from(list("0123456789+-*/()") + [str(n) for n in nums] * 3), max_size=10))
    return "".join(pieces)[: C.COMPLETION_LEN - 1], nums


@settings(max_examples=150, deadline=None)
@given(_strings())
def test_device_verifier_equals_host_on_any_string(example):
    text, nums = example
    tok = np.full((1, 1, C.COMPLETION_LEN), C.PAD, np.int32)
    tok[0, 0, : len(text)] = [C.VOCAB.index(c) for c in text]
    tok[0, 0, len(text)] = C.EOS
    tree = C.parse(text)
    value = C.evaluate(tree) if tree is not None and sorted(C._leaves(tree)) == sorted(nums) else None
    target = int(value) if value is not None and value.denominator == 1 else 7
    reward, code = _jit_verify(tok, np.array([nums], np.int32), np.array([target], np.int32))
    assert float(reward[0, 0]) == C.reward(text, nums, target)
    assert int(code[0, 0]) == (C.tree_code(tree) if tree is not None else -1)


_jit_verify = jax.jit(C.device_verify)


def test_device_verifier_edges():
    nums, target = np.array([[5, 7, 12]], np.int32), np.array([25], np.int32)

    def run(text, length=C.COMPLETION_LEN, eos=True, tail=(), nums=nums, target=target):
        t = np.full((1, 1, length), C.PAD, np.int32)
        ids = [C.VOCAB.index(c) for c in text] + ([C.EOS] if eos else []) + list(tail)
        t[0, 0, : len(ids)] = ids
        r, c = _jit_verify(t, nums, target)
        return float(r[0, 0]), int(c[0, 0])

    assert run("(12-7)*5")[0] == 1.0
    assert run("(12-7)*5", eos=False) == (0.0, -1)                        # no EOS: no answer
    assert run("(12-7)*5", tail=[C.VOCAB.index("9"), C.EOS, C.PAD])[0] == 1.0   # after EOS: ignored
    # the right numbers, dividing by zero (a repeated number; the verifier takes multisets)
    four = dict(nums=np.array([[4, 4, 12]], np.int32), target=np.array([0], np.int32))
    assert run("12/(4-4)", **four)[0] == 0.0 and run("12/(4-4)", **four)[1] > 0
    assert run("12*(4-4)", **four)[0] == 1.0 and run("12*(4-4)*4", **four)[0] == 0.0
    deep = "(" * C.MAX_DEPTH + "5" + ")" * C.MAX_DEPTH
    assert run(deep, length=2 * C.MAX_DEPTH + 4) == (0.0, 6)              # 5 alone: code 5 + 1
    too_deep = "(" + deep + ")"
    assert run(too_deep, length=2 * C.MAX_DEPTH + 4) == (0.0, -1) and C.parse(too_deep) is None
    assert run("") == (0.0, -1) and run("5*") == (0.0, -1) and run("123") == (0.0, -1)


def test_verify_is_vmappable_and_jittable_per_sequence():
    tok = C.encode_completions(["(12-7)*5", "12+7+5", "5*(12-7)"])
    ok, code = jax.jit(jax.vmap(C.verify, in_axes=(0, None, None)))(tok, jnp.array([5, 7, 12]), 25)
    np.testing.assert_array_equal(np.asarray(ok), [True, False, True])
    assert code[0] == code[2] != code[1] and (np.asarray(code) > 0).all()


# ---------------------------------------------------------------- modes, clusters, metrics
def test_mode_ids_clusters_and_coverage():
    nums, target = (2, 3, 4), 1
    modes = C.solutions(nums, target)
    respelt = ["(3+2)-4", "2+(3-4)", "(2-4)+3", "2-(4-3)", "3-(4-2)", "3-4/2", "2+3-4", "3*4-2", "2+3+4", "2-(4)"]
    ids = [C.mode_id(t, nums, target) for t in respelt]
    assert ids[:7] == [modes.index(C.canonical(C.parse(t))) for t in respelt[:7]] and ids[0] == ids[6]
    assert ids[7:] == [-1, -1, -1] and len(set(ids[:7])) == len(modes)
    tok = C.encode_completions(respelt)[None]
    reward, code = _jit_verify(tok, jnp.array([nums]), jnp.array([target]))
    mode_codes = np.full((1, C.MAX_MODES), -1, np.int32)
    mode_codes[0, : len(modes)] = [C.tree_code(t) for t in modes]
    dev_ids = C.device_mode_ids(reward, code, jnp.asarray(mode_codes))
    np.testing.assert_array_equal(np.asarray(dev_ids)[0], ids)
    distinct, coverage = C.mode_metrics(dev_ids, jnp.array([len(modes)]))
    assert float(distinct[0]) == len(modes) and float(coverage[0]) == 1.0
    distinct, coverage = C.mode_metrics(dev_ids[:, [0, 6, 7, 1]], jnp.array([len(modes)]))
    assert float(distinct[0]) == 2 and float(coverage[0]) == pytest.approx(2 / len(modes))
    # clusters: one per canonical form (right or wrong); unparsable answers get fresh ids
    tok = C.encode_completions(["(3+2)-4", "2+3-4", "3*4-2", "4*3-2", "2+", "3-4/2", "2+", "4*3-2", "", "2+3+4"])
    _, code = _jit_verify(tok[None], jnp.array([nums]), jnp.array([target]))      # same shape: no recompile
    np.testing.assert_array_equal(np.asarray(C.device_cluster_ids(code))[0], [0, 0, 1, 1, 4, 2, 5, 1, 6, 3])
