"""Reward networks in flax: imitation's ``BasicRewardNet`` and friends, ensembles as stacked params.

Hashable spaces (:class:`Box`, :class:`Discrete`, ...; :func:`as_space` converts
gym/gymnax ones) and :func:`preprocess` (stable-baselines3's ``preprocess_obs``);
:class:`RewardMLP` (``BasicRewardNet``: state / action / next state / done,
flattened and concatenated, ReLU MLP); potential shaping (:class:`ShapedRewardNet`);
ensembles as member-stacked params: :func:`ensemble_init`, :func:`ensemble_apply`
(the one way reward nets are applied, differentiable), :func:`ensemble_moments`
(ddof 1), :func:`add_std`, :func:`ensemble_reward`.

Example::

    import jax.numpy as jnp
    from jaxweight.preference import Box, Discrete, RewardMLP, ensemble_apply, ensemble_init, ensemble_moments
    net = RewardMLP(observation_space=Box((4,)), action_space=Discrete(2))
    inputs = (jnp.zeros((7, 4)), jnp.zeros((7,), jnp.int32), jnp.zeros((7, 4)), jnp.zeros((7,), bool))
    params = ensemble_init(0, net, inputs, num_members=5)     # leaves [5, ...]
    r = ensemble_apply(net, params, *inputs)                  # f32[7, 5]
    mean, var = ensemble_moments(r)                           # f32[7], f32[7]

References:
  imitation ``rewards/reward_nets.py`` and ``util/networks.py``
  (https://github.com/HumanCompatibleAI/imitation).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from .._util import as_key, check_static_int, check_value, concrete

Array = jax.Array

__all__ = [
    "Box",
    "Discrete",
    "MultiDiscrete",
    "MultiBinary",
    "Space",
    "as_space",
    "is_image_space",
    "flat_dim",
    "preprocess",
    "valid_inputs",
    "check_inputs",
    "RewardMLP",
    "PotentialMLP",
    "ShapedRewardNet",
    "basic_shaped_reward_net",
    "ensemble_init",
    "ensemble_apply",
    "ensemble_moments",
    "add_std",
    "ensemble_reward",
    "num_members",
]


# -------------------------------------------------------------------- spaces
def _as_tuple(x: Any) -> float | tuple:
    a = np.asarray(x, dtype=np.float64)
    return float(a) if a.ndim == 0 else tuple(a.reshape(-1).tolist())


@dataclasses.dataclass(frozen=True)
class Box:
    """A box of real (or integer, e.g. uint8 image) values.

    Attributes:
      shape: per-step shape.
      low, high: bounds (scalar or flattened tuple); only used to recognise images.
      dtype: numpy dtype name (``"float32"``, ``"uint8"``, ...).
    """

    shape: tuple[int, ...]
    low: float | tuple = -math.inf
    high: float | tuple = math.inf
    dtype: str = "float32"

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "low", _as_tuple(self.low))
        object.__setattr__(self, "high", _as_tuple(self.high))
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)


@dataclasses.dataclass(frozen=True)
class Discrete:
    """``n`` categories; values are integers ``0 .. n-1`` of shape ``()``."""

    n: int

    def __post_init__(self):
        if int(self.n) < 1:
            raise ValueError(f"Discrete n must be >= 1, got {self.n}")
        object.__setattr__(self, "n", int(self.n))

    @property
    def shape(self) -> tuple[int, ...]:
        return ()


@dataclasses.dataclass(frozen=True)
class MultiDiscrete:
    """Several categorical variables with ``nvec[i]`` categories; values ``int[k]``."""

    nvec: tuple[int, ...]

    def __post_init__(self):
        nvec = tuple(int(v) for v in np.asarray(self.nvec).reshape(-1))
        if not nvec or min(nvec) < 1:
            raise ValueError(f"MultiDiscrete nvec must be a non-empty list of ints >= 1, got {self.nvec}")
        object.__setattr__(self, "nvec", nvec)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.nvec),)


@dataclasses.dataclass(frozen=True)
class MultiBinary:
    """Binary vector (or array) of shape ``n``."""

    n: int | tuple[int, ...]

    def __post_init__(self):
        n = self.n
        object.__setattr__(self, "n", int(n) if np.ndim(n) == 0 else tuple(int(v) for v in n))

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.n,) if isinstance(self.n, int) else self.n


Space = Box | Discrete | MultiDiscrete | MultiBinary


def as_space(space: Any) -> Space | None:
    """Convert a gymnax / gym / gymnasium space (duck-typed) to our description.

    ``None`` and our own spaces pass through. Discrete spaces with a nonzero
    ``start`` are not supported (stable-baselines3 ignores ``start`` as well).

    Raises:
      ValueError: for unsupported space types (Dict, Tuple, ...).
    """
    if space is None or isinstance(space, Box | Discrete | MultiDiscrete | MultiBinary):
        return space
    name = type(space).__name__
    if name == "Discrete" and hasattr(space, "n"):
        return Discrete(int(space.n))
    if name == "MultiDiscrete" and hasattr(space, "nvec"):
        return MultiDiscrete(tuple(np.asarray(space.nvec).reshape(-1)))
    if name == "MultiBinary" and hasattr(space, "n"):
        return MultiBinary(space.n)
    if name == "Box" and hasattr(space, "shape"):
        dtype = getattr(space, "dtype", np.float32)
        try:
            dtype = np.dtype(dtype).name
        except TypeError:  # jnp scalar types
            dtype = np.dtype(jnp.dtype(dtype)).name
        return Box(tuple(space.shape), getattr(space, "low", -math.inf), getattr(space, "high", math.inf), dtype)
    raise ValueError(f"unsupported space {name}: use Box, Discrete, MultiDiscrete or MultiBinary")


def is_image_space(space: Space | None) -> bool:
    """stable-baselines3's test: a 3-D uint8 Box with bounds exactly [0, 255]."""
    if not isinstance(space, Box) or len(space.shape) != 3 or space.dtype != "uint8":
        return False
    low = np.asarray(space.low)
    high = np.asarray(space.high)
    return bool(np.all(low == 0) and np.all(high == 255))


def flat_dim(space: Space) -> int:
    """Number of features after :func:`preprocess` and flattening."""
    space = as_space(space)
    if isinstance(space, Discrete):
        return space.n
    if isinstance(space, MultiDiscrete):
        return int(sum(space.nvec))
    return int(np.prod(space.shape, dtype=np.int64))


def preprocess(space: Any, x: Array, normalize_images: bool = True, *, name: str = "x") -> Array:
    """Network-ready float32 features of raw values ``x`` of ``space``.

    Args:
      space: the space of ``x`` (ours, gymnax or gym/gymnasium).
      x: ``[..., *space.shape]`` raw values (any leading batch shape).
      normalize_images: divide image spaces (:func:`is_image_space`) by 255.
      name: what ``x`` is, for error messages.

    Returns:
      ``f32[..., *space.shape]`` for Box / MultiBinary, ``f32[..., n]`` for
      Discrete (one-hot), ``f32[..., sum(nvec)]`` for MultiDiscrete.

    Raises:
      ValueError: ``x`` does not end in the space's shape; a concrete discrete
        value outside ``[0, n)`` (traced out-of-range values one-hot to zeros;
        the reward trainer masks and counts them, see :func:`valid_inputs`).
    """
    space = as_space(space)
    x = jnp.asarray(x)
    nd = len(space.shape)
    if x.ndim < nd or tuple(x.shape[x.ndim - nd:]) != tuple(space.shape):
        raise ValueError(f"{name} must have shape (..., {', '.join(map(str, space.shape))}) for {space}, got {x.shape}")
    if isinstance(space, Discrete | MultiDiscrete):
        c = concrete(x)
        if c is not None and c.size and not bool(np.all(_in_range(space, c, np))):
            bad = c[~_in_range(space, c, np)].reshape(-1)[0]
            raise ValueError(f"{name} has value {bad} outside the range of {_space_text(space)} "
                             f"(valid: {_valid_text(space)})")
    if isinstance(space, Discrete):
        return jax.nn.one_hot(x, space.n, dtype=jnp.float32)
    if isinstance(space, MultiDiscrete):
        parts = [jax.nn.one_hot(x[..., i], n, dtype=jnp.float32) for i, n in enumerate(space.nvec)]
        return jnp.concatenate(parts, axis=-1)
    if isinstance(space, MultiBinary):
        return x.astype(jnp.float32)
    if normalize_images and is_image_space(space):
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


def _space_text(space: Space) -> str:
    """``Discrete(2)`` / ``MultiDiscrete([3, 2])`` as a user writes it (the repr elsewhere)."""
    if isinstance(space, Discrete):
        return f"Discrete({space.n})"
    if isinstance(space, MultiDiscrete):
        return f"MultiDiscrete({list(space.nvec)})"
    return repr(space)


def _valid_text(space: Discrete | MultiDiscrete) -> str:
    if isinstance(space, Discrete):
        return f"0 .. {space.n - 1}"
    return "0 .. nvec[i] - 1 at position i, nvec = " + str(list(space.nvec))


def _in_range(space: Space, x: Any, xp: Any = jnp) -> Any:
    """Element-wise: ``0 <= x < n`` for Discrete / MultiDiscrete values (``[..., k]`` for MultiDiscrete)."""
    if isinstance(space, Discrete):
        return (x >= 0) & (x < space.n)
    return (x >= 0) & (x < xp.asarray(space.nvec))


def valid_inputs(module: nn.Module, obs: Array, acts: Array, lead: int = 1) -> Array:
    """Which items a reward module can score: ``bool[*obs.shape[:lead]]``.

    An item (e.g. a fragment pair, ``lead = 1`` for ``[P, 2, L+1, ...]``) is
    valid when every float observation / action entry is finite and every
    discrete one lies inside the module's space (``observation_space`` /
    ``action_space`` attributes, looked up on ``module`` or its ``base``).
    """

    def ok(x, space):
        x = jnp.asarray(x)
        good = jnp.isfinite(x) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.ones(x.shape, bool)
        space = as_space(space)
        if isinstance(space, Discrete | MultiDiscrete):
            good = good & _in_range(space, x)
        return jnp.all(good.reshape(good.shape[:lead] + (-1,)), axis=-1)

    return ok(obs, _space_of(module, "observation_space")) & ok(acts, _space_of(module, "action_space"))


def _space_of(module: nn.Module, attr: str) -> Any:
    """``module.<attr>`` (a space), looked up through ``base`` wrappers; ``None`` if no module has one."""
    m = module
    while m is not None:
        sp = getattr(m, attr, None)
        if sp is not None:
            return sp
        m = getattr(m, "base", None)
    return None


def check_inputs(module: nn.Module, obs: Any, acts: Any, *, names: tuple[str, str] = ("obs", "acts"),
                 where: Any = None) -> None:
    """Refuse concrete discrete observations / actions outside the reward module's spaces (host side).

    The entry check of the reward trainer on data whose values are known now:
    a value outside ``Discrete(n)`` / ``MultiDiscrete(nvec)`` is a mismatch of
    the data and the net, so it raises here. Traced values (under ``jax.jit``)
    are not checked: training masks and counts them (:func:`valid_inputs`), as
    it does NaN / inf entries, which this check leaves alone.

    Args:
      module: the reward module (spaces from ``observation_space`` /
        ``action_space``, on it or its ``base``).
      obs, acts: ``[*items, ...]`` observations and actions, e.g. ``[P, 2, L+1, ...]`` of pairs.
      names: how the caller names ``obs`` and ``acts`` in the message (e.g. ``"buffer.pairs.acts"``).
      where: optional ``bool[*items]``: only these items are checked (e.g. the
        filled buffer slots); a traced ``where`` skips the check.

    Raises:
      ValueError: naming the argument and index, the value, the space and its
        valid values, e.g. ``buffer.pairs.acts[0, 1, 2] has value 7, outside the
        action space Discrete(2) of the reward net (valid actions: 0 .. 1)``.
    """
    for x, attr, name, what in ((obs, "observation_space", names[0], "observation"),
                                (acts, "action_space", names[1], "action")):
        space = as_space(_space_of(module, attr))
        if not isinstance(space, Discrete | MultiDiscrete):
            continue
        c = concrete(x)
        w = None if where is None else concrete(where)
        if c is None or c.size == 0 or (where is not None and w is None):
            continue
        bad = ~_in_range(space, c, np)
        if np.issubdtype(c.dtype, np.inexact):
            bad &= np.isfinite(c)  # NaN / inf are bad data: masked and counted, not refused
        if w is not None:
            w = np.asarray(w, bool)
            bad &= w.reshape(w.shape + (1,) * (bad.ndim - w.ndim))
        if bool(np.any(bad)):
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            v = c[idx]
            raise ValueError(
                f"{name}[{', '.join(map(str, idx))}] has value {v.item()}, outside the {what} space "
                f"{_space_text(space)} of the reward net (valid {what}s: {_valid_text(space)}); "
                f"{int(np.sum(bad))} such value(s) in all"
            )


def _features(space: Space | None, x: Array, batch_shape: tuple[int, ...], normalize_images: bool, name: str) -> Array:
    """Preprocess (if ``space``) and flatten to ``f32[*batch_shape, F]``."""
    x = jnp.asarray(x)
    if space is None:
        if not jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != jnp.bool_:
            raise ValueError(
                f"{name} has integer dtype {x.dtype}: pass its space (e.g. Discrete(n) or an image Box) "
                "so it is one-hot encoded / scaled like imitation does"
            )
        feats = x.astype(jnp.float32)
    else:
        feats = preprocess(space, x, normalize_images, name=name)
    nb = len(batch_shape)
    if tuple(feats.shape[:nb]) != tuple(batch_shape):
        raise ValueError(f"{name} must have leading batch shape {batch_shape} (the shape of done), got {x.shape}")
    return feats.reshape(*batch_shape, -1)


# ------------------------------------------------------------------ networks
class RewardMLP(nn.Module):
    """imitation's ``BasicRewardNet``: an MLP on ``[state, action, next_state, done]``.

    The enabled inputs are preprocessed (when their space is given), flattened
    per step and concatenated in the order state, action, next state, done (one
    float column); ReLU hidden layers; one linear output, squeezed. The batch
    shape of every input is the shape of ``done`` (any rank), so the same module
    scores ``[B]`` transitions, ``[N, T]`` trajectories or ``[P, 2, L]`` fragments.

    Attributes:
      hidden_sizes: widths of the hidden layers (imitation default ``(32, 32)``).
      use_state, use_action, use_next_state, use_done: which inputs to use.
      observation_space, action_space: optional spaces; needed for integer
        inputs (discrete actions are one-hot encoded, uint8 images scaled).
      normalize_images: scale image observations to [0, 1].
      activation: hidden activation (ReLU as in imitation).

    Call:
      ``net.apply(params, state, action, next_state, done) -> f32[*done.shape]``.

    Raises:
      ValueError: no input enabled.
    """

    hidden_sizes: Sequence[int] = (32, 32)
    use_state: bool = True
    use_action: bool = True
    use_next_state: bool = False
    use_done: bool = False
    observation_space: Any = None
    action_space: Any = None
    normalize_images: bool = True
    activation: Callable[[Array], Array] = nn.relu

    def __post_init__(self):
        object.__setattr__(self, "hidden_sizes", tuple(int(h) for h in self.hidden_sizes))
        object.__setattr__(self, "observation_space", as_space(self.observation_space))
        object.__setattr__(self, "action_space", as_space(self.action_space))
        if not (self.use_state or self.use_action or self.use_next_state or self.use_done):
            raise ValueError("RewardMLP needs at least one input: set use_state, use_action, use_next_state or use_done")
        super().__post_init__()

    @nn.compact
    def __call__(self, state: Array, action: Array, next_state: Array, done: Array) -> Array:
        batch_shape = tuple(jnp.shape(done))
        parts = []
        if self.use_state:
            parts.append(_features(self.observation_space, state, batch_shape, self.normalize_images, "state"))
        if self.use_action:
            parts.append(_features(self.action_space, action, batch_shape, self.normalize_images, "action"))
        if self.use_next_state:
            parts.append(_features(self.observation_space, next_state, batch_shape, self.normalize_images, "next_state"))
        if self.use_done:
            parts.append(jnp.asarray(done, jnp.float32)[..., None])
        x = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1)
        first = "dense0" if self.hidden_sizes else "dense_final"
        if self.has_variable("params", first):  # applied with params: their input width must match
            want = int(self.get_variable("params", first)["kernel"].shape[0])
            if x.shape[-1] != want:
                names = [n for n, on in (("state", self.use_state), ("action", self.use_action),
                                         ("next_state", self.use_next_state), ("done", self.use_done)) if on]
                detail = " + ".join(f"{n} {p.shape[-1]}" for n, p in zip(names, parts))
                raise ValueError(
                    f"RewardMLP got {x.shape[-1]} input features ({detail}) but its params expect {want}: "
                    "the observation / action sizes differ from the ones the net was initialised with"
                )
        # one 2-D matrix of rows: XLA's CPU dot kernels are faster on [rows, features] than on
        # the same contraction with several batch dimensions
        x = x.reshape(-1, x.shape[-1])
        for i, width in enumerate(self.hidden_sizes):
            x = self.activation(nn.Dense(width, name=f"dense{i}")(x))
        return nn.Dense(1, name="dense_final")(x)[:, 0].reshape(batch_shape)


class PotentialMLP(nn.Module):
    """imitation's ``BasicPotentialMLP``: ``phi(state)`` from the flattened, preprocessed state.

    Call: ``potential.apply(params, state) -> f32[batch]`` where the batch shape
    is ``state.shape`` minus the observation space's shape (or minus the last
    axis when no space is given).
    """

    hidden_sizes: Sequence[int] = (32, 32)
    observation_space: Any = None
    normalize_images: bool = True
    activation: Callable[[Array], Array] = nn.relu

    def __post_init__(self):
        object.__setattr__(self, "hidden_sizes", tuple(int(h) for h in self.hidden_sizes))
        object.__setattr__(self, "observation_space", as_space(self.observation_space))
        super().__post_init__()

    @nn.compact
    def __call__(self, state: Array) -> Array:
        state = jnp.asarray(state)
        nd = len(self.observation_space.shape) if self.observation_space is not None else 1
        batch_shape = tuple(state.shape[: state.ndim - nd])
        x = _features(self.observation_space, state, batch_shape, self.normalize_images, "state")
        for i, width in enumerate(self.hidden_sizes):
            x = self.activation(nn.Dense(width, name=f"dense{i}")(x))
        return nn.Dense(1, name="dense_final")(x)[..., 0]


class ShapedRewardNet(nn.Module):
    """Potential-based shaping of a base reward net (imitation ``ShapedRewardNet``).

    ``r(s, a, s', d) = base(s, a, s', d) + discount_factor * (1 - d) * phi(s') - phi(s)``;
    the potential of terminal states is fixed to zero so that shaping keeps the
    optimal policy with variable-length episodes.

    Attributes:
      base: a reward module called as ``base(state, action, next_state, done)``.
      potential: a module called as ``potential(state)``.
      discount_factor: shaping discount in ``[0, 1]`` (static; imitation default 0.99);
        a value outside it, NaN or a traced value raises ``ValueError``.

    References:
      Ng, Harada, Russell (1999), "Policy invariance under reward transformations".
    """

    base: nn.Module
    potential: nn.Module
    discount_factor: float = 0.99

    def __post_init__(self):
        check_value(self.discount_factor, "discount_factor", ge=0.0, le=1.0, static=True)
        super().__post_init__()

    @nn.compact
    def __call__(self, state: Array, action: Array, next_state: Array, done: Array) -> Array:
        r = self.base(state, action, next_state, done)
        new_phi = self.potential(next_state).reshape(r.shape)
        old_phi = self.potential(state).reshape(r.shape)
        return r + self.discount_factor * (1.0 - jnp.asarray(done, jnp.float32)) * new_phi - old_phi


def basic_shaped_reward_net(
    observation_space: Any = None,
    action_space: Any = None,
    *,
    reward_hidden_sizes: Sequence[int] = (32,),
    potential_hidden_sizes: Sequence[int] = (32, 32),
    use_state: bool = True,
    use_action: bool = True,
    use_next_state: bool = False,
    use_done: bool = False,
    discount_factor: float = 0.99,
    normalize_images: bool = True,
) -> ShapedRewardNet:
    """imitation's ``BasicShapedRewardNet``: a :class:`RewardMLP` shaped by a :class:`PotentialMLP`."""
    base = RewardMLP(
        hidden_sizes=reward_hidden_sizes, use_state=use_state, use_action=use_action,
        use_next_state=use_next_state, use_done=use_done, observation_space=observation_space,
        action_space=action_space, normalize_images=normalize_images,
    )
    potential = PotentialMLP(
        hidden_sizes=potential_hidden_sizes, observation_space=observation_space,
        normalize_images=normalize_images,
    )
    return ShapedRewardNet(base=base, potential=potential, discount_factor=discount_factor)


# ------------------------------------------------------------------ ensembles
def ensemble_init(key: Any, module: nn.Module, example_inputs: Sequence[Any], num_members: int) -> Any:
    """Initialise ``num_members`` independent copies of ``module``, params stacked on axis 0.

    Args:
      key: PRNG key or int seed (split into one key per member).
      module: a flax module.
      example_inputs: positional inputs of ``module`` (any batch size, only shapes matter).
      num_members: ``M >= 2``.

    Returns:
      The params pytree with a leading member axis ``M`` on every leaf.

    Raises:
      ValueError: ``num_members < 2`` ("Must be at least 2 member in the ensemble.", as imitation).
    """
    if isinstance(num_members, bool) or not isinstance(num_members, int | np.integer):
        raise ValueError(f"num_members must be a static Python int, got {type(num_members).__name__}")
    if num_members < 2:
        raise ValueError("Must be at least 2 member in the ensemble.")
    keys = jax.random.split(as_key(key), int(num_members))
    return jax.vmap(lambda k: module.init(k, *example_inputs))(keys)


def ensemble_apply(module: nn.Module, params: Any, *inputs: Any, chunk_size: int | None = None,
                   stacked: bool = True) -> Array:
    """Rewards of every member: ``f32[*batch, M]`` (member axis last, like imitation's
    ``predict_processed_all``). Differentiable with respect to ``params``.

    The one way jaxweight applies reward nets: a single net is the case
    ``stacked=False`` (one member, ``M = 1``).

    Args:
      module: reward module, called as ``module.apply(p, *inputs)``.
      params: member-stacked params (leading axis ``M``), or one net's params with ``stacked=False``.
      *inputs: the module's inputs; the batch shape is the shape of the last
        one (``done`` for reward modules).
      chunk_size: optional static row count. All members run at once under
        ``jax.vmap`` by default; with ``chunk_size`` the flattened batch is cut
        into chunks of that many rows and chunks and members are visited with
        ``lax.map``, which keeps the activations cache-sized: for 10^5 rows
        and 5 (32, 32) members this is several times faster on CPU.
      stacked: ``params`` carry the member axis (``False``: a single net, ``M = 1``).
    """
    if not stacked:
        return jnp.asarray(module.apply(params, *inputs), jnp.float32)[..., None]
    if chunk_size is None:
        out = jax.vmap(lambda p: module.apply(p, *inputs))(params)
        return jnp.moveaxis(out, 0, -1)
    chunk = check_static_int(chunk_size, "chunk_size", 1)
    batch = tuple(jnp.shape(inputs[-1]))
    rows = int(np.prod(batch, dtype=np.int64))
    chunk = min(chunk, max(rows, 1))
    n = max(1, -(-rows // chunk))

    def split(x):
        if x is None:
            return None
        x = jnp.asarray(x)
        x = x.reshape((rows,) + x.shape[len(batch):])
        x = jnp.pad(x, [(0, n * chunk - rows)] + [(0, 0)] * (x.ndim - 1))
        return x.reshape((n, chunk) + x.shape[1:])

    chunks = tuple(split(x) for x in inputs)
    out = jax.lax.map(lambda xs: jax.lax.map(lambda p: module.apply(p, *xs), params), chunks)  # [n, M, chunk]
    out = jnp.moveaxis(out, 1, -1).reshape(n * chunk, -1)[:rows]
    return out.reshape(batch + (out.shape[-1],))


def ensemble_moments(member_rewards: Array, axis: int = -1) -> tuple[Array, Array]:
    """Mean and unbiased (ddof=1) variance over the member axis.

    Args:
      member_rewards: ``f32[..., M]`` with ``M >= 2``.

    Returns:
      ``(mean f32[...], var f32[...])`` as imitation's ``RewardEnsemble.predict_reward_moments``.
    """
    r = jnp.asarray(member_rewards, jnp.float32)
    if r.ndim == 0 or r.shape[axis] < 2:
        raise ValueError(f"member_rewards needs a member axis of size >= 2 at axis {axis}, got shape {r.shape}")
    return jnp.mean(r, axis=axis), jnp.var(r, axis=axis, ddof=1)


def add_std(mean: Array, var: Array, alpha: Any = 0.0) -> Array:
    """``mean + alpha * sqrt(var)``: imitation's ``AddSTDRewardWrapper`` (optimism /
    pessimism bonus for the agent's reward; never used to train the reward net).

    Raises:
      ValueError: ``alpha`` NaN or infinite (any finite sign is accepted: ``alpha < 0``
        is pessimism), eagerly or through ``jaxweight.checked`` when traced.
    """
    check_value(alpha, "alpha")
    return _add_std(mean, var, alpha)


def _add_std(mean: Array, var: Array, alpha: Any) -> Array:
    return jnp.asarray(mean, jnp.float32) + jnp.asarray(alpha, jnp.float32) * jnp.sqrt(jnp.maximum(var, 0.0))


def ensemble_reward(module: nn.Module, params: Any, *inputs: Any, alpha: Any = 0.0, stacked: bool = True) -> Array:
    """Processed ensemble reward for the agent: ``add_std(*ensemble_moments(r), alpha)`` of :func:`ensemble_apply`.

    With ``alpha = 0`` this is the member mean (imitation's ``RewardEnsemble.predict``);
    ``alpha=None`` gives the plain member mean without computing the variance.
    A single net (``stacked=False``) gives its own reward (``alpha`` unused).

    Raises:
      ValueError: ``alpha`` NaN or infinite (see :func:`add_std`).
    """
    if alpha is not None:
        check_value(alpha, "alpha")
    return _ensemble_reward(module, params, inputs, alpha, stacked)


def _ensemble_reward(module: nn.Module, params: Any, inputs: Sequence[Any], alpha: Any, stacked: bool = True) -> Array:
    """:func:`ensemble_reward` with a checked ``alpha`` (the agent's per-step reward: no check in the hot loop)."""
    r = ensemble_apply(module, params, *inputs, stacked=stacked)
    if not stacked:
        return r[..., 0]
    if alpha is None:
        return jnp.mean(r, axis=-1)
    return _add_std(*ensemble_moments(r), alpha)


def num_members(module: nn.Module, params: Any, example_inputs: Sequence[Any]) -> int | None:
    """``M`` if ``params`` carry a leading member axis (from :func:`ensemble_init`), else None.

    Compares the params' leaf shapes with ``jax.eval_shape`` of a single ``module.init``.

    Raises:
      ValueError: the shapes match neither a single net nor a stack of them.
    """
    single = jax.eval_shape(lambda: module.init(jax.random.key(0), *example_inputs))
    s_leaves = jax.tree.leaves(single)
    p_leaves = jax.tree.leaves(params)
    if jax.tree.structure(single) != jax.tree.structure(params):
        raise ValueError("params do not have the structure of module.init(...)")
    if all(tuple(a.shape) == tuple(b.shape) for a, b in zip(s_leaves, p_leaves)):
        return None
    ms = {tuple(b.shape)[0] for b in p_leaves if len(b.shape) >= 1}
    if len(ms) == 1 and all(tuple(b.shape[1:]) == tuple(a.shape) for a, b in zip(s_leaves, p_leaves)):
        return int(ms.pop())
    raise ValueError("params are neither the params of module nor a member-stacked ensemble of them")
