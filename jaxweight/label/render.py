"""Fragments as animated GIF clips a browser plays: host-side NumPy and Pillow, no JAX.

A :class:`Renderer` draws the observations ``f32[T, D]`` of one fragment as
``T`` frames; :func:`render_clip` encodes them as a looping animated GIF. The
frames are drawn straight into a small fixed palette (Pillow mode ``"P"``), so
encoding needs no colour quantisation: a pair of 21-frame clips takes a few
milliseconds. Nothing here imports JAX or calls compiled code; observations
that arrive as JAX arrays are copied to the host once with ``np.asarray``.

Renderers are found by environment id in a registry: exact ids (``"cartpole"``,
``"pendulum"``, the built-in fixed-horizon environments of
:mod:`jaxweight.rl.envs`) or families by prefix (an id ending in
``":"``, e.g. a future ``"brax:"`` whose factory receives ``"brax:ant"`` and
can load that system). :func:`register_renderer` adds one; :func:`get_renderer`
finds one or names the ids it knows.

Every frame shows what is judged. A renderer may say which frames are *live*
(``Renderer.live``: the subject is in play and earns reward; CartPole: the
cart within its bounds and the pole within 12 degrees). A stretch that is not
live is drawn as such: the last live frame frozen and dimmed with "down since
step k of L: no reward while down" (or, with no live frame before it, the
fragment's first frame dimmed with "down at the clip's start"). Live is the
quantity the reward pays, frame by frame: a CartPole pole that swings back
through upright earns reward again and is drawn live again. CartPole's view
follows the cart (the bounds and a 0.5 m scale drawn on the track) and keeps
the whole pole in view, whatever its angle.

Example::

    import io
    import numpy as np
    from PIL import Image
    from jaxweight.label import render_clip
    obs = np.zeros((21, 4), np.float32)                 # a CartPole fragment of 20 steps
    obs[:, 2] = np.linspace(0.0, 0.5, 21)               # the pole falls to the right
    gif = render_clip("cartpole", obs)                  # bytes of an animated GIF
    assert Image.open(io.BytesIO(gif)).n_frames == 21
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["Renderer", "register_renderer", "get_renderer", "renderer_ids", "env_id", "render_clip",
           "check_fragment_obs", "cartpole_live", "frozen_source", "WIDTH", "HEIGHT"]

#: frame size in pixels (every built-in renderer draws this size)
WIDTH, HEIGHT = 320, 200
#: the largest pixel coordinate handed to Pillow (far-away objects are drawn at the edge)
_FAR = 10_000.0

# One palette for every built-in clip: index -> RGB.
_PALETTE = [
    (250, 250, 247),  # 0 background
    (120, 120, 120),  # 1 track / pivot
    (38, 70, 120),    # 2 cart / rod
    (214, 120, 40),   # 3 pole / bob
    (20, 20, 20),     # 4 axle, arrows
    (205, 60, 60),    # 5 bounds, missing data
    (190, 200, 215),  # 6 time bar track
    (70, 130, 200),   # 7 time bar fill, velocity
    (168, 180, 198),  # 8 cart / rod, dimmed (a fallen or absorbed stretch)
    (226, 196, 168),  # 9 pole / bob, dimmed
    (236, 236, 232),  # 10 background of a dimmed frame
    (255, 246, 214),  # 11 banner
    (250, 226, 226),  # 12 out-of-bounds track
]
BG, TRACK, CART, POLE, AXLE, BOUND, BAR_BG, BAR, CART_DIM, POLE_DIM, BG_DIM, BANNER, OUT = range(len(_PALETTE))
_FLAT_PALETTE = [c for rgb in _PALETTE for c in rgb]


@dataclasses.dataclass(frozen=True)
class Renderer:
    """How to draw fragments of one environment.

    Attributes:
      name: the environment id it was registered under (e.g. ``"cartpole"``).
      obs_dim: the observation size ``D`` it expects (``None``: any).
      draw: ``draw(obs f32[T, D]) -> list of T PIL images`` (one size, mode ``"P"``
        with a palette, or ``"RGB"``; ``render_clip`` quantises RGB frames).
      frame_ms: how long each frame shows, in milliseconds (GIF stores centiseconds;
        browsers show delays under 20 ms as 100 ms, so keep it >= 20).
      goal: one sentence telling the person what good behaviour looks like
        (shown above the clips).
      live: ``live(obs f32[..., T, D]) -> bool[..., T]`` (any leading axes), the frames where the subject is
        in play (CartPole: cart in bounds and pole within 12 degrees, the frames
        that earn reward), or None: every frame. A pair whose two fragments have
        as many live frames after the first has nothing to judge (see
        :func:`~jaxweight.label.board.idle_pairs`).
      subject_rgb: the colours the subject is drawn in (live and dimmed): a clip
        shows its subject when every frame has a pixel of one of them (the
        page's tests check this for every clip of a round).
    """

    name: str
    obs_dim: int | None
    draw: Callable[[np.ndarray], list[Image.Image]]
    frame_ms: int = 100
    goal: str = ""
    live: Callable[[np.ndarray], np.ndarray] | None = None
    subject_rgb: tuple[tuple[int, int, int], ...] = ()


#: id (exact, or a family prefix ending in ":") -> factory(env_id) -> Renderer
_REGISTRY: dict[str, Callable[[str], Renderer]] = {}


def register_renderer(name: str, factory: Callable[[str], Renderer], *, replace: bool = False) -> None:
    """Register the renderer factory of an environment id or a family of ids.

    Args:
      name: an exact id (``"cartpole"``), or a prefix ending in ``":"``
        (``"brax:"``) that serves every id starting with it.
      factory: ``factory(env_id) -> Renderer``, called with the full id each
        time a renderer is looked up (a family factory can load the named system).
      replace: overwrite an existing registration of ``name``.

    Raises:
      ValueError: an empty ``name``, a non-callable ``factory``, or ``name``
        already registered without ``replace=True``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise ValueError(f"factory must be callable (env_id -> Renderer), got {type(factory).__name__}")
    if name in _REGISTRY and not replace:
        raise ValueError(f"a renderer is already registered for {name!r}; pass replace=True to overwrite it")
    _REGISTRY[name] = factory


def renderer_ids() -> list[str]:
    """The registered ids and family prefixes, sorted."""
    return sorted(_REGISTRY)


def env_id(env: Any) -> str:
    """The registry id of ``env``: a string as given, or a built-in environment object's name.

    Args:
      env: an id (``"cartpole"``, ``"brax:ant"``) or an instance of a built-in
        fixed-horizon environment (:data:`jaxweight.rl.envs.ENVS`).

    Raises:
      ValueError: an object that is not a built-in environment (pass its id instead).
    """
    if isinstance(env, str):
        return env
    from jaxweight.rl.envs import ENVS  # an env object exists, so gymnax and JAX are loaded already

    for name, cls in ENVS.items():
        if isinstance(env, cls):
            return name
    raise ValueError(f"env must be an environment id (one of {renderer_ids()}) or a built-in environment, "
                     f"got {type(env).__name__}; pass the id it should be drawn as")


def get_renderer(env: Any) -> Renderer:
    """The :class:`Renderer` of an environment id (exact match first, then the longest family prefix).

    Args:
      env: an id or a built-in environment object (see :func:`env_id`).

    Raises:
      ValueError: no renderer for that id (the message lists the known ones and
        how to add one).
    """
    name = env_id(env)
    factory = _REGISTRY.get(name)
    if factory is None:
        families = [k for k in _REGISTRY if k.endswith(":") and name.startswith(k)]
        if families:
            factory = _REGISTRY[max(families, key=len)]
    if factory is None:
        raise ValueError(f"no renderer for environment {name!r}; known: {renderer_ids()}. "
                         "Add one with jaxweight.label.register_renderer(name, factory)")
    out = factory(name)
    if not isinstance(out, Renderer):
        raise ValueError(f"the renderer factory of {name!r} returned {type(out).__name__}, not a Renderer")
    return out


def check_fragment_obs(obs: Any, obs_dim: int | None, name: str = "obs") -> np.ndarray:
    """``obs`` as ``f32[T, D]`` on the host, checked against the renderer's ``D``.

    Raises:
      ValueError: not rank 2, ``T == 0``, or ``D != obs_dim``.
    """
    a = np.asarray(obs, dtype=np.float32)
    if a.ndim != 2 or a.shape[0] < 1:
        raise ValueError(f"{name} must have shape (T, D) with T >= 1 (one row per frame), got {a.shape}")
    if obs_dim is not None and a.shape[1] != obs_dim:
        raise ValueError(f"{name} must have {obs_dim} values per frame for this environment, got shape {a.shape}")
    return a


def render_clip(env: Any, obs: Any, *, frame_ms: int | None = None) -> bytes:
    """One fragment as the bytes of a looping animated GIF (``T`` frames, the last held 5x longer).

    Args:
      env: an environment id, a built-in environment object or a :class:`Renderer`.
      obs: ``f32[T, D]`` observations of the fragment, one frame each (pass all
        ``L + 1`` of a :class:`~jaxweight.preference.FragmentPairs` fragment).
        Non-finite rows are drawn as a red cross.
      frame_ms: milliseconds per frame (default: the renderer's).

    Returns:
      The GIF file's bytes.

    Raises:
      ValueError: no renderer for ``env``; ``obs`` of the wrong shape; ``frame_ms < 20``.
    """
    r = env if isinstance(env, Renderer) else get_renderer(env)
    ms = r.frame_ms if frame_ms is None else frame_ms
    if not isinstance(ms, int) or isinstance(ms, bool) or ms < 20:
        raise ValueError(f"frame_ms must be an int >= 20 (browsers slow shorter delays to 100 ms), got {ms!r}")
    frames = r.draw(check_fragment_obs(obs, r.obs_dim))
    frames = [f if f.mode == "P" else f.convert("RGB").quantize(colors=255) for f in frames]
    durations = [ms] * len(frames)
    durations[-1] = ms * 5  # a pause marks where the loop restarts
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=durations, loop=0,
                   optimize=False, disposal=1)
    return buf.getvalue()


# ---------------------------------------------------------------- drawing helpers
def _canvas(bg: int = BG) -> Image.Image:
    img = Image.new("P", (WIDTH, HEIGHT), bg)
    img.putpalette(_FLAT_PALETTE)
    return img


_FONT: Any = None


def _font() -> Any:
    global _FONT
    if _FONT is None:
        from PIL import ImageFont

        try:
            _FONT = ImageFont.load_default(size=13)
        except TypeError:  # pragma: no cover - Pillow < 10.1: the bitmap font
            _FONT = ImageFont.load_default()
    return _FONT


def _time_bar(draw: ImageDraw.ImageDraw, t: int, n: int) -> None:
    """A thin bar along the bottom edge: how far into the fragment this frame is."""
    y0 = HEIGHT - 6
    draw.rectangle((0, y0, WIDTH - 1, HEIGHT - 1), fill=BAR_BG)
    frac = (t + 1) / n
    draw.rectangle((0, y0, max(1, round(frac * (WIDTH - 1))), HEIGHT - 1), fill=BAR)


def _banner(draw: ImageDraw.ImageDraw, text: str) -> None:
    """A strip along the top edge that says why the frame is frozen."""
    draw.rectangle((0, 0, WIDTH - 1, 20), fill=BANNER)
    draw.text((WIDTH / 2, 10), text, fill=AXLE, font=_font(), anchor="mm")


def _missing(draw: ImageDraw.ImageDraw) -> None:
    """A red cross: this frame's observation is not finite."""
    m = 40
    draw.line((m, m, WIDTH - m, HEIGHT - m - 10), fill=BOUND, width=5)
    draw.line((m, HEIGHT - m - 10, WIDTH - m, m), fill=BOUND, width=5)


def _clamp(v: float) -> float:
    return float(min(max(v, -_FAR), _FAR))


def frozen_source(live: np.ndarray) -> np.ndarray:
    """``i32[T]``: the frame each frame shows: itself when live, else the last live frame before it
    (the first frame when there is none).

    Example: ``frozen_source(np.array([1, 1, 0, 0, 1, 0], bool)).tolist() == [0, 1, 1, 1, 4, 4]``.
    """
    t = np.arange(live.shape[0])
    return np.maximum(np.maximum.accumulate(np.where(live, t, -1)), 0)


def _frames(obs: np.ndarray, draw_one: Callable[[ImageDraw.ImageDraw, np.ndarray, bool], None],
            live: np.ndarray | None = None, *, base: Callable[[np.ndarray, bool], Image.Image]) -> list[Image.Image]:
    """One image per row of ``obs``. Rows that are not ``live`` show the last live row, dimmed, with a banner."""
    n = len(obs)
    finite = np.all(np.isfinite(obs), axis=1)
    live = finite if live is None else (np.asarray(live, bool) & finite)
    src = frozen_source(live)
    # where each not-live stretch starts (the step the subject fell at), and whether a live frame came before it
    starts = np.maximum.accumulate(np.where(~live & np.concatenate([[True], live[:-1]]), np.arange(n), 0))
    had_live = np.maximum.accumulate(live)
    out = []
    for t in range(n):  # one frame per row: host drawing, not array math
        dim = not live[t]
        row = obs[src[t]]
        if not finite[t] or not finite[src[t]]:
            img = _canvas()
            d = ImageDraw.Draw(img)
            _missing(d)
        else:
            img = base(row, dim)
            d = ImageDraw.Draw(img)
            draw_one(d, row, dim)
            if dim:
                _banner(d, f"down since step {starts[t]} of {n - 1}: no reward while down" if had_live[t]
                        else "down at the clip's start: no reward while down")
        _time_bar(d, t, n)
        out.append(img)
    return out


# ---------------------------------------------------------------- CartPole
# gym / gymnax CartPole: x_threshold 2.4, theta_threshold 12 degrees, pole half-length 0.5.
_CP_X_BOUND = 2.4
_CP_THETA_BOUND = 12 * 2 * math.pi / 360
_CP_VIEW = 2.9            # half-width of the view in metres
_CP_SCALE = WIDTH / (2 * _CP_VIEW)
_CP_MARGIN = 1.1          # the view follows the cart so that it stays this far inside the edge (the pole: 1 m)
_CP_TRACK_Y = 130         # pixel row of the track
_CP_POLE = 1.0 * _CP_SCALE  # the full pole (2 x half-length)
_CP_CART_W, _CP_CART_H = 0.5 * _CP_SCALE, 0.3 * _CP_SCALE


def cartpole_live(obs: np.ndarray) -> np.ndarray:
    """``bool[..., T]`` of ``obs f32[..., T, 4]``: the cart within 2.4 m and the pole within 12 degrees
    (the frames CartPole pays 1 for)."""
    o = np.asarray(obs, np.float64)
    return (np.abs(o[..., 0]) <= _CP_X_BOUND) & (np.abs(o[..., 2]) <= _CP_THETA_BOUND)


def _cartpole_camera(x: float) -> float:
    """The view's centre: 0 while the cart is well inside the view, else following it."""
    edge = _CP_VIEW - _CP_MARGIN
    return float(x - min(max(x, -edge), edge))


def _cartpole_base(o: np.ndarray, dim: bool) -> Image.Image:
    img = _canvas(BG_DIM if dim else BG)
    d = ImageDraw.Draw(img)
    cam = _cartpole_camera(_clamp(float(o[0])))
    px = lambda x: WIDTH / 2 + (x - cam) * _CP_SCALE  # noqa: E731
    y = _CP_TRACK_Y
    lo, hi = px(-_CP_X_BOUND), px(_CP_X_BOUND)
    if lo > 0:  # out of bounds: a tinted track
        d.rectangle((0, y - 2, lo, y + 12), fill=OUT)
    if hi < WIDTH:
        d.rectangle((hi, y - 2, WIDTH, y + 12), fill=OUT)
    d.line((0, y, WIDTH, y), fill=TRACK, width=2)
    first = math.ceil((cam - _CP_VIEW) / 0.5)
    for k in range(first, first + int(2 * _CP_VIEW / 0.5) + 2):  # a 0.5 m scale: motion shows as the view moves
        xp = px(k * 0.5)
        d.line((xp, y + 3, xp, y + (8 if k % 2 == 0 else 5)), fill=TRACK, width=1)
    for bx in (lo, hi):  # the bounds the cart must stay within
        if -5 <= bx <= WIDTH + 5:
            d.line((bx, y - 10, bx, y + 10), fill=BOUND, width=3)
    if cam != 0.0:  # the view has moved: say where it is
        side = "right" if cam > 0 else "left"
        d.text((6, HEIGHT - 24), f"view follows the cart: {abs(cam):.1f} m {side} of centre", fill=TRACK,
               font=_font())
    return img


def _cartpole_one(d: ImageDraw.ImageDraw, o: np.ndarray, dim: bool) -> None:
    x, theta = _clamp(float(o[0])), float(o[2])
    cx = WIDTH / 2 + (x - _cartpole_camera(x)) * _CP_SCALE
    top = _CP_TRACK_Y - _CP_CART_H / 2
    d.rectangle((cx - _CP_CART_W / 2, top, cx + _CP_CART_W / 2, _CP_TRACK_Y + _CP_CART_H / 2),
                fill=CART_DIM if dim else CART)
    # theta = 0 is upright, positive leans right (tip at x + l sin theta)
    tx, ty = cx + _CP_POLE * math.sin(theta), top - _CP_POLE * math.cos(theta)
    d.line((cx, top, tx, ty), fill=POLE_DIM if dim else POLE, width=6)
    d.ellipse((cx - 3, top - 3, cx + 3, top + 3), fill=AXLE)


def _cartpole(env_name: str) -> Renderer:
    return Renderer(
        name=env_name, obs_dim=4, draw=lambda obs: _frames(obs, _cartpole_one, cartpole_live(obs),
                                                           base=_cartpole_base),
        frame_ms=100, live=cartpole_live, subject_rgb=(_PALETTE[CART], _PALETTE[CART_DIM]),
        goal="Keep the pole upright and the cart between the red marks (shown at 1/5 speed). "
             "A dimmed, frozen stretch is down (the pole past 12 degrees or the cart past a mark): it earns "
             "nothing until the pole is back up within the marks.",
    )


# ---------------------------------------------------------------- Pendulum
_PD_PIVOT = (WIDTH / 2, 92)
_PD_ROD = 70.0
_PD_MAX_SPEED = 8.0  # gym / gymnax Pendulum max_speed


def _pendulum_base() -> Image.Image:
    img = _canvas()
    d = ImageDraw.Draw(img)
    px, py = _PD_PIVOT
    d.ellipse((px - _PD_ROD - 4, py - _PD_ROD - 4, px + _PD_ROD + 4, py + _PD_ROD + 4), outline=BAR_BG, width=1)
    d.line((px, py - _PD_ROD - 10, px, py - _PD_ROD + 2), fill=BOUND, width=3)  # the goal: straight up
    return img


def _pendulum_one(d: ImageDraw.ImageDraw, o: np.ndarray, dim: bool = False) -> None:
    cos, sin, thdot = float(o[0]), float(o[1]), float(o[2])
    norm = math.hypot(cos, sin) or 1.0
    cos, sin = cos / norm, sin / norm
    px, py = _PD_PIVOT
    # theta = 0 is upright; positive theta turns counter-clockwise (gym's renderer)
    tx, ty = px - _PD_ROD * sin, py - _PD_ROD * cos
    d.line((px, py, tx, ty), fill=CART, width=8)
    d.ellipse((tx - 7, ty - 7, tx + 7, ty + 7), fill=POLE)
    d.ellipse((px - 4, py - 4, px + 4, py + 4), fill=AXLE)
    # angular velocity: a bar from the centre line, pointing where the bob would move at the top
    # (counter-clockwise, positive theta_dot, moves it left)
    y = HEIGHT - 18
    w = max(-1.0, min(1.0, thdot / _PD_MAX_SPEED)) * (WIDTH / 2 - 10)
    d.line((WIDTH / 2, y - 5, WIDTH / 2, y + 5), fill=TRACK, width=1)
    if abs(w) >= 1:
        d.rectangle((min(WIDTH / 2, WIDTH / 2 - w), y - 3, max(WIDTH / 2, WIDTH / 2 - w), y + 3), fill=BAR)


def _pendulum(env_name: str) -> Renderer:
    base = _pendulum_base()
    return Renderer(  # Pendulum never ends early: every frame is live
        name=env_name, obs_dim=3, draw=lambda obs: _frames(obs, _pendulum_one, base=lambda o, dim: base.copy()),
        frame_ms=100, subject_rgb=(_PALETTE[CART], _PALETTE[POLE]),
        goal="Swing the pendulum up and hold it still at the top, by the red mark (shown at 1/2 speed).",
    )


register_renderer("cartpole", _cartpole)
register_renderer("pendulum", _pendulum)
