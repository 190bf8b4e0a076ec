"""Clips of fragments: what they show, the renderer registry, speed, and no JAX on the way."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

PIL = pytest.importorskip("PIL", reason="rendering needs Pillow (the label extra)")
from PIL import Image  # noqa: E402

from jaxweight.label import render  # noqa: E402
from jaxweight.label.render import HEIGHT, WIDTH, Renderer, get_renderer, register_renderer, render_clip  # noqa: E402
from tests.label.conftest import gif_frames  # noqa: E402


def _where(frame: np.ndarray, colour_index: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel rows and columns drawn in one palette colour."""
    rgb = np.asarray(render._PALETTE[colour_index], np.uint8)
    ys, xs = np.nonzero(np.all(frame == rgb, axis=-1))
    return ys, xs


def test_cartpole_clip_is_an_animated_gif_with_one_frame_per_observation():
    obs = np.zeros((21, 4), np.float32)
    gif = render_clip("cartpole", obs)
    im = Image.open(io.BytesIO(gif))
    assert im.format == "GIF" and im.n_frames == 21 and im.size == (WIDTH, HEIGHT)
    assert im.info["loop"] == 0 and im.info["duration"] == 100
    im.seek(20)
    assert im.info["duration"] == 500  # the last frame pauses before the loop restarts


def test_cartpole_draws_the_cart_at_x_and_the_pole_leaning_with_theta():
    obs = np.array([[-2.0, 0, 0, 0], [2.0, 0, 0, 0], [0.0, 0, 0.2, 0], [0.0, 0, -0.2, 0]], np.float32)
    f = gif_frames(render_clip("cartpole", obs))
    cart = [_where(fr, render.CART)[1].mean() for fr in f[:2]]
    assert cart[0] < WIDTH / 2 - 80 and cart[1] > WIDTH / 2 + 80        # x = -2 left, x = +2 right
    pole_right = _where(f[2], render.POLE)
    pole_left = _where(f[3], render.POLE)
    assert pole_right[1].max() > WIDTH / 2 + 8                          # theta > 0 leans right (gym)
    assert pole_left[1].min() < WIDTH / 2 - 8
    assert pole_right[0].max() < render._CP_TRACK_Y and pole_left[0].max() < render._CP_TRACK_Y  # above the track


def _banner(frame: np.ndarray) -> bool:
    return bool(np.all(frame[2, :40] == render._PALETTE[render.BANNER]))


def test_a_fall_freezes_the_last_live_frame_dimmed_with_the_step_it_fell_at():
    """Live for 5 steps, then out: frames 5.. are frame 4 again, dimmed, with a banner; the time bar goes on."""
    obs = np.zeros((11, 4), np.float32)
    obs[:, 2] = np.linspace(0.0, 0.5, 11)                               # 0.25 rad > 12 degrees from frame 5 on
    obs[:, 0] = np.linspace(0.0, 1.0, 11)
    live = render.cartpole_live(obs)
    assert live.tolist() == [True] * 5 + [False] * 6
    f = gif_frames(render_clip("cartpole", obs))
    assert not any(_banner(fr) for fr in f[:5]) and all(_banner(fr) for fr in f[5:])
    assert all(_where(fr, render.CART)[0].size > 0 for fr in f[:5])
    cart_at = [_where(fr, render.CART_DIM)[1].mean() for fr in f[5:]]
    assert np.ptp(cart_at) == 0 and cart_at[0] == pytest.approx(_where(f[4], render.CART)[1].mean())  # frozen at 4
    below = lambda fr: fr[:-8]  # noqa: E731 - all but the time bar
    assert all(np.array_equal(below(f[5]), below(fr)) for fr in f[6:])
    assert not np.array_equal(f[5][-6:], f[10][-6:])                   # time still runs


def test_a_clip_fallen_from_its_start_shows_its_first_frame_dimmed_and_the_view_follows_the_cart():
    obs = np.zeros((6, 4), np.float32)
    obs[:, 0] = np.linspace(40.0, 60.0, 6)                              # far off the track, as after a long fall
    obs[:, 2] = 2.0
    f = gif_frames(render_clip("cartpole", obs))
    for fr in f:
        ys, xs = _where(fr, render.CART_DIM)
        assert xs.size > 0 and 0 < xs.min() and xs.max() < WIDTH       # the cart in view, dimmed
        assert _banner(fr)
    assert all(np.array_equal(f[0][:-8], fr[:-8]) for fr in f[1:])      # frame 0, frozen


def test_captions_follow_the_environments_reward_when_the_pole_swings_back_up():
    """A pole that falls, swings back through upright and falls again: each frame is drawn down (dimmed,
    with the banner) exactly where FixedHorizonCartPole pays 0 for the step that ends in it."""
    jnp = pytest.importorskip("jax.numpy")
    from jaxweight.rl.envs import FixedHorizonCartPole

    env = FixedHorizonCartPole()
    theta = np.array([0.0, 0.1, 0.3, 0.6, 0.25, 0.05, -0.1, -0.4, -0.9, -0.15, 0.0], np.float32)
    obs = np.zeros((theta.size, 4), np.float32)
    obs[:, 2] = theta
    obs[:, 0] = np.linspace(0.0, 0.5, theta.size)
    paid = np.asarray([float(env.transition_reward(env.default_params, None, None, jnp.asarray(o))) for o in obs])
    f = gif_frames(render_clip("cartpole", obs))
    for t in range(1, len(f)):                       # frame t ends step t (frame 0 is the start state)
        assert _banner(f[t]) == (paid[t] == 0.0), (t, paid[t])
        assert (_where(f[t], render.CART)[0].size > 0) == (paid[t] == 1.0)  # live colours only where paid
    assert paid[1:].sum() == sum(not _banner(fr) for fr in f[1:])           # the live frames are the return
    assert paid[5] == 1.0 and paid[3] == 0.0        # it did swing back


def test_the_whole_pole_stays_in_view_at_any_angle_and_place():
    rng = np.random.default_rng(0)
    obs = np.stack([rng.uniform(-60, 60, 64), np.zeros(64), rng.uniform(-np.pi, np.pi, 64), np.zeros(64)], 1)
    obs[:8, 0] = [-2.4, 2.4, -2.0, 2.0, -1.6, 1.6, 0.0, 3.0]
    obs[:8, 2] = [-np.pi / 2, np.pi / 2, -np.pi / 2, np.pi / 2, -np.pi / 2, np.pi / 2, np.pi, np.pi / 2]
    for fr in gif_frames(render_clip("cartpole", obs.astype(np.float32))):
        ys, xs = np.nonzero(np.all((fr == render._PALETTE[render.POLE]) | (fr == render._PALETTE[render.POLE_DIM]),
                                   axis=-1))
        assert xs.size > 20 and xs.min() > 0 and xs.max() < WIDTH - 1 and ys.min() > 0 and ys.max() < HEIGHT - 6


def test_the_view_follows_a_cart_past_the_edge_while_it_is_live():
    """A renderer without ``live`` (every frame live) still keeps the cart in view: the camera moves."""
    r = get_renderer("cartpole")
    follow = Renderer("cartpole-free", 4, lambda o: render._frames(o, render._cartpole_one, None,
                                                                   base=render._cartpole_base), subject_rgb=r.subject_rgb)
    obs = np.zeros((4, 4), np.float32)
    obs[:, 0] = [0.0, 3.0, -8.0, 1e30]
    for fr in gif_frames(render_clip(follow, obs)):
        xs = _where(fr, render.CART)[1]
        assert xs.size > 0 and xs.min() > 0 and xs.max() < WIDTH - 1


def test_pendulum_up_is_up_and_positive_theta_turns_counter_clockwise():
    th = np.array([0.0, np.pi, np.pi / 2], np.float32)
    obs = np.stack([np.cos(th), np.sin(th), np.zeros(3)], 1)
    f = gif_frames(render_clip("pendulum", obs))
    bob = [(_where(fr, render.POLE)[0].mean(), _where(fr, render.POLE)[1].mean()) for fr in f]
    py, px = render._PD_PIVOT[1], render._PD_PIVOT[0]
    assert bob[0][0] < py - 50 and abs(bob[0][1] - px) < 3             # theta 0: straight up
    assert bob[1][0] > py + 50                                          # theta pi: hanging down
    assert bob[2][1] < px - 50 and abs(bob[2][0] - py) < 3             # theta pi/2: to the left (gym)


def test_frozen_source_is_the_last_live_frame():
    live = np.array([0, 1, 1, 0, 0, 1, 0], bool)
    assert render.frozen_source(live).tolist() == [0, 1, 2, 2, 2, 5, 5]


def test_non_finite_observations_draw_a_cross_not_an_error():
    obs = np.array([[0, 0, 0, 0], [np.nan, 0, 0, 0], [np.inf, 0, 0, 0]], np.float32)
    f = gif_frames(render_clip("cartpole", obs))
    assert _where(f[0], render.BOUND)[0].size < 200                    # the bound marks only
    assert _where(f[1], render.BOUND)[0].size > 1000 and _where(f[2], render.BOUND)[0].size > 1000
    assert _where(f[1], render.CART)[0].size == 0


def test_registry_finds_exact_ids_then_the_longest_family_and_names_the_known_ones():
    made = []

    def brax(env_id):
        made.append(env_id)
        return Renderer(env_id, 2, lambda o: [Image.new("RGB", (8, 8), (40 * i, 0, 0)) for i in range(len(o))])

    register_renderer("test-brax:", brax)
    try:
        r = get_renderer("test-brax:ant")
        assert r.name == "test-brax:ant" and made == ["test-brax:ant"]
        gif = render_clip(r, np.zeros((3, 2), np.float32))             # an RGB renderer is quantised
        assert Image.open(io.BytesIO(gif)).n_frames == 3
        with pytest.raises(ValueError, match="already registered.*replace=True"):
            register_renderer("test-brax:", brax)
        with pytest.raises(ValueError, match=r"no renderer for environment 'humanoid'.*'cartpole'.*register_renderer"):
            get_renderer("humanoid")
    finally:
        render._REGISTRY.pop("test-brax:")
    assert get_renderer("cartpole").obs_dim == 4 and get_renderer("pendulum").obs_dim == 3


def test_built_in_environment_objects_map_to_their_renderer():
    envs = pytest.importorskip("jaxweight.rl.envs", reason="needs gymnax (the rl extra)")
    assert get_renderer(envs.FixedHorizonCartPole(horizon=50)).name == "cartpole"
    assert get_renderer(envs.FixedHorizonPendulum()).name == "pendulum"
    with pytest.raises(ValueError, match="pass the id"):
        get_renderer(object())


@pytest.mark.parametrize(("obs", "match"), [
    (np.zeros((5, 3)), r"4 values per frame"),
    (np.zeros((5,)), r"shape \(T, D\)"),
    (np.zeros((0, 4)), r"T >= 1"),
])
def test_bad_observations_are_refused(obs, match):
    with pytest.raises(ValueError, match=match):
        render_clip("cartpole", obs)


@pytest.mark.parametrize("ms", [0, 10, 2.5, True])
def test_bad_frame_ms_is_refused(ms):
    with pytest.raises(ValueError, match="frame_ms must be an int >= 20"):
        render_clip("cartpole", np.zeros((2, 4)), frame_ms=ms)


def test_rendering_imports_no_jax():
    """Host-side only: importing the package and rendering a pair never loads JAX (so never compiles)."""
    code = textwrap.dedent("""
        import sys, numpy as np
        from jaxweight.label import render_clip
        from jaxweight.label.log import LabelLog
        from jaxweight.label.board import LabelBoard
        render_clip("pendulum", np.zeros((4, 3), np.float32))
        print(sorted(m for m in sys.modules if m == "jax" or m.startswith("jax.")))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize(("env", "dim"), [("cartpole", 4), ("pendulum", 3)])
def test_render_time_of_a_pair_is_recorded(env, dim, record_property):
    """Measured, not asserted (a shared CPU): the median time to render both clips of a 20-step pair."""
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(2, 21, dim)).astype(np.float32)
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        gifs = [render_clip(env, obs[0]), render_clip(env, obs[1])]
        times.append(time.perf_counter() - t0)
    ms = 1e3 * float(np.median(times))
    record_property(f"render_pair_ms_{env}", ms)
    print(f"\n[label] {env}: a 21-frame pair renders in {ms:.1f} ms (median of 10; max {1e3 * max(times):.1f} ms), "
          f"{sum(map(len, gifs))} bytes")
    assert all(Image.open(io.BytesIO(g)).n_frames == 21 for g in gifs)
