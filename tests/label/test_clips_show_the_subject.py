"""Every frame of every clip of a real round shows what is judged, and the pairs with nothing to judge are the
pairs the noiseless synthetic teacher calls equal: both returns the same.

A round here is what the preference loop samples: episodes of the fixed-horizon
environment under a random policy (an untrained agent: CartPole falls within
~20 of its 500 steps, then the cart drifts off), cut into 14 pairs of 20-step
fragments by :func:`jaxweight.preference.random_fragments`. Every clip is decoded and
checked by pixels: the subject's colours (the cart, live or dimmed; the
pendulum's rod and bob) are in every frame.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

pytest.importorskip("PIL", reason="clips need Pillow (the label extra)")
pytest.importorskip("gymnax", reason="real rounds need gymnax (the rl extra)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxweight.label.board import idle_pairs  # noqa: E402
from jaxweight.label.render import get_renderer, render_clip  # noqa: E402
from tests.label.conftest import gif_frames  # noqa: E402

PAIRS, L = 14, 20


@functools.lru_cache(maxsize=None)
def _round(env_id: str, seed: int, episodes: int = 6):
    """``(obs f32[P, 2, L+1, D], returns f32[P, 2])`` of one round sampled from random-policy episodes."""
    from jaxweight.preference import random_fragments
    from jaxweight.preference.data import Trajectories

    env, params, run = _episodes(env_id)
    horizon = int(params.max_steps_in_episode)
    obs, acts, rews = run(jax.random.split(jax.random.key(seed), episodes))
    traj = Trajectories(obs=obs, acts=acts, rews=rews.astype(jnp.float32),
                        lengths=jnp.full((episodes,), horizon, jnp.int32), terminal=jnp.zeros((episodes,), bool))
    pairs = random_fragments(jax.random.key(seed + 1), traj, L, PAIRS, warning_threshold=0)
    return np.asarray(pairs.obs, np.float32), np.asarray(pairs.rews, np.float32).sum(-1)


@functools.lru_cache(maxsize=None)
def _episodes(env_id: str):
    """``(env, params, run(keys) -> (obs, acts, rews))``: whole random-policy episodes, compiled once per env."""
    from jaxweight.rl.envs import make_env

    env, params = make_env(env_id)
    horizon = int(params.max_steps_in_episode)
    space = env.action_space(params)

    def episode(key):
        k0, k1 = jax.random.split(key)
        obs0, state = env.reset(k0, params)

        def step(carry, k):
            state, obs = carry
            ka, ks = jax.random.split(k)
            act = space.sample(ka)
            nxt, state, rew = env.step_env(ks, state, act, params)[:3]  # fixed horizon: no early reset
            return (state, nxt), (nxt, act, rew)

        _, (obs, acts, rews) = jax.lax.scan(step, (state, obs0), jax.random.split(k1, horizon))
        return jnp.concatenate([obs0[None], obs]), acts, rews

    return env, params, jax.jit(jax.vmap(episode))


def _shows(frame: np.ndarray, colours) -> bool:
    return any(bool(np.all(frame == np.asarray(c, np.uint8), axis=-1).any()) for c in colours)


@pytest.mark.parametrize(("env_id", "seed"), [("cartpole", 0), ("cartpole", 1), ("pendulum", 0)])
def test_every_frame_of_every_clip_of_a_round_shows_the_subject(env_id, seed):
    obs, returns = _round(env_id, seed)
    r = get_renderer(env_id)
    assert r.subject_rgb, "a renderer the page supports names its subject's colours"
    missing = []
    for p in range(PAIRS):
        for side in (0, 1):
            frames = gif_frames(render_clip(r, obs[p, side]))
            assert len(frames) == L + 1
            missing += [(p, side, t) for t, fr in enumerate(frames) if not _shows(fr, r.subject_rgb)]
    assert missing == [], f"frames without the {env_id} subject: {missing[:10]}"
    if env_id == "cartpole":  # the round is the hard case of a person's round 0: most fragments fallen
        far = np.abs(obs[..., 0]).max(axis=-1) > 3.2                    # left the old fixed view
        assert far.any(), "the sampled round should hold fragments whose cart left the track's view"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_idle_pairs_are_the_pairs_whose_returns_tie(seed):
    """CartPole pays 1 for each step that ends live: a pair has nothing to judge exactly when its returns tie."""
    obs, returns = _round("cartpole", seed)
    idle = idle_pairs(get_renderer("cartpole"), obs)
    np.testing.assert_array_equal(idle, returns[:, 0] == returns[:, 1])
    live = np.array([[get_renderer("cartpole").live(obs[p, s])[1:].sum() for s in (0, 1)] for p in range(PAIRS)])
    np.testing.assert_array_equal(live, returns)                          # the live frames are the paid steps
    assert idle.any() and not idle.all()
