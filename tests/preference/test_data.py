"""Trajectories / FragmentPairs containers and converters."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxweight import preference as pf
from jaxweight.interop import imitation as imx


@dataclasses.dataclass
class FakeTrajectoryWithRew:
    """Stands in for imitation's TrajectoryWithRew (imitation is never imported)."""

    obs: np.ndarray
    acts: np.ndarray
    rews: np.ndarray
    infos: object = None
    terminal: bool = True


def _episodes():
    obs = [np.arange(11 * 2, dtype=np.float64).reshape(11, 2), np.ones((8, 2))]
    acts = [np.arange(10), np.arange(7)]
    rews = [np.ones(10), 2 * np.ones(7)]
    return obs, acts, rews


def test_trajectories_from_arrays_pads_and_casts():
    obs, acts, rews = _episodes()
    t = pf.trajectories_from_arrays(obs, acts, rews, [True, False])
    assert t.obs.shape == (2, 11, 2) and t.obs.dtype == jnp.float32
    assert t.acts.shape == (2, 10) and t.acts.dtype == jnp.int32
    assert t.rews.dtype == jnp.float32 and t.lengths.dtype == jnp.int32 and t.terminal.dtype == jnp.bool_
    np.testing.assert_array_equal(t.lengths, [10, 7])
    np.testing.assert_array_equal(t.obs[0], obs[0])
    np.testing.assert_array_equal(t.obs[1, 8:], 0.0)  # padding
    np.testing.assert_array_equal(t.rews[1], [2] * 7 + [0] * 3)
    assert t.num_trajectories == 2 and t.horizon == 10 and t.obs_shape == (2,) and t.act_shape == ()
    mask = np.asarray(t.step_mask())
    assert mask[1].sum() == 7 and mask[0].all()
    dones = np.asarray(t.dones())
    assert dones[0, 9] and dones.sum() == 1  # only the terminal episode's last step
    s, a, s2, d = t.transitions()
    np.testing.assert_array_equal(s2[0, :-1], s[0, 1:])
    ex = pf.example_inputs(t)
    assert [x.shape for x in ex] == [(1, 2), (1,), (1, 2), (1,)]
    np.testing.assert_array_equal(ex[2], obs[0][1:2])
    t2 = pf.trajectories_from_arrays(obs, acts, horizon=12)
    assert t2.horizon == 12 and bool(t2.terminal.all()) and float(jnp.abs(t2.rews).sum()) == 0.0


def test_trajectories_from_arrays_errors():
    obs, acts, rews = _episodes()
    with pytest.raises(ValueError, match="at least one episode"):
        pf.trajectories_from_arrays([], [])
    with pytest.raises(ValueError, match=r"obs\[1\] must have len\(acts\[1\]\) \+ 1"):
        pf.trajectories_from_arrays(obs, [acts[0], np.arange(3)])
    with pytest.raises(ValueError, match="rews must have one entry"):
        pf.trajectories_from_arrays(obs, acts, rews[:1])
    with pytest.raises(ValueError, match=r"rews\[0\] must have"):
        pf.trajectories_from_arrays(obs, acts, [np.ones(3), rews[1]])
    with pytest.raises(ValueError, match="horizon must be"):
        pf.trajectories_from_arrays(obs, acts, horizon=5)
    with pytest.raises(ValueError, match="terminal must have shape"):
        pf.trajectories_from_arrays(obs, acts, terminal=[True])
    with pytest.raises(ValueError, match="per-step shape"):
        pf.trajectories_from_arrays([obs[0], np.ones((8, 3))], acts)


def test_image_obs_keep_uint8():
    obs = [np.zeros((4, 8, 8, 3), np.uint8)]
    t = pf.trajectories_from_arrays(obs, [np.zeros(3, np.int64)])
    assert t.obs.dtype == jnp.uint8 and t.acts.dtype == jnp.int32


def test_trajectories_from_imitation_duck_typed():
    obs, acts, rews = _episodes()
    trajs = [FakeTrajectoryWithRew(o, a, r, terminal=term) for o, a, r, term in zip(obs, acts, rews, [False, True])]
    t = imx.trajectories_from_imitation(trajs)
    np.testing.assert_array_equal(t.terminal, [False, True])
    np.testing.assert_array_equal(t.lengths, [10, 7])
    np.testing.assert_allclose(t.rews[0, :10], 1.0)
    with pytest.raises(ValueError, match="at least one"):
        imx.trajectories_from_imitation([])
    with pytest.raises(ValueError, match="DictObs"):
        imx.trajectories_from_imitation([FakeTrajectoryWithRew({"a": 1}, np.zeros(2), np.zeros(2))])


def test_fragment_pairs_from_imitation_and_arrays():
    f = lambda v, term: FakeTrajectoryWithRew(np.full((4, 2), v), np.zeros(3, int), np.full(3, v), terminal=term)  # noqa: E731
    pairs = imx.fragment_pairs_from_imitation([(f(1.0, False), f(2.0, True)), (f(3.0, False), f(4.0, False))])
    assert pairs.obs.shape == (2, 2, 4, 2) and pairs.num_pairs == 2 and pairs.fragment_length == 3
    np.testing.assert_array_equal(pairs.terminal, [[False, True], [False, False]])
    np.testing.assert_allclose(pairs.rews[1, 1], 4.0)
    assert bool(pairs.valid.all())
    d = np.asarray(pairs.dones())
    assert d.shape == (2, 2, 3) and d[0, 1, 2] and d.sum() == 1
    with pytest.raises(ValueError, match="same length"):
        imx.fragment_pairs_from_imitation([(f(1.0, False), FakeTrajectoryWithRew(np.zeros((3, 2)), np.zeros(2), np.zeros(2)))])
    with pytest.raises(ValueError, match="acts must have shape"):
        pf.fragment_pairs_from_arrays(np.zeros((2, 2, 4, 1)), np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match=r"obs must have shape \(P, 2"):
        pf.fragment_pairs_from_arrays(np.zeros((2, 3, 4, 1)), np.zeros((2, 3, 3)))


def test_concatenate_and_returns():
    obs, acts, rews = _episodes()
    a = pf.trajectories_from_arrays(obs[:1], acts[:1], rews[:1])
    b = pf.trajectories_from_arrays(obs[1:], acts[1:], rews[1:])
    c = pf.concatenate_trajectories([b, a])
    assert c.horizon == 10 and c.num_trajectories == 2
    np.testing.assert_array_equal(c.lengths, [7, 10])
    p = pf.fragment_pairs_from_arrays(np.zeros((1, 2, 3, 1)), np.zeros((1, 2, 2)))
    assert pf.data.concatenate_pairs([p, p]).num_pairs == 2
    np.testing.assert_allclose(pf.discounted_returns(jnp.array([[1.0, 1.0, 1.0]]), 0.5), [1.75])
    np.testing.assert_allclose(pf.discounted_returns(jnp.array([2.0, 3.0]), 0.0), 2.0)
