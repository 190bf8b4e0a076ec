"""imitation (HumanCompatibleAI) <-> jaxweight: trajectories, fragment pairs and reward-net weights.

Both ways, optional imports only: :func:`trajectories_from_imitation` /
:func:`fragment_pairs_from_imitation` read ``TrajectoryWithRew`` objects by
attribute (imitation need not be installed); :func:`trajectories_to_imitation` /
:func:`fragment_pairs_to_imitation` build them (needs imitation);
:func:`reward_params_to_state_dict` / :func:`reward_params_from_state_dict` map
:class:`~jaxweight.preference.RewardMLP` params (kernels ``[in, out]``) to a
``BasicRewardNet`` ``state_dict`` (``mlp.dense0.weight`` ``[out, in]``, ...;
ensembles to ``members.{k}.mlp.*``) and back. Both nets concatenate state,
action (one-hot), next state and done in that order: equal weights, equal rewards.

Example::

    import jax, numpy as np
    from jaxweight.interop import imitation as imx
    from jaxweight.preference import Box, Discrete, RewardMLP, example_inputs, fragment_pairs_from_arrays
    net = RewardMLP(hidden_sizes=(4,), observation_space=Box((3,)), action_space=Discrete(2))
    pairs = fragment_pairs_from_arrays(np.zeros((1, 2, 3, 3)), np.zeros((1, 2, 2), np.int32))
    params = net.init(jax.random.key(0), *example_inputs(pairs))
    sd = imx.reward_params_to_state_dict(params, as_numpy=True)   # BasicRewardNet.load_state_dict(sd)
    assert sd["mlp.dense0.weight"].shape == (4, 5)                 # [out, in]: 3 obs + 2 one-hot actions
    back = imx.reward_params_from_state_dict(sd)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxweight.preference.data import (
    FragmentPairs,
    Trajectories,
    fragment_pairs_from_arrays,
    trajectories_from_arrays,
)

__all__ = [
    "trajectories_from_imitation",
    "fragment_pairs_from_imitation",
    "trajectories_to_imitation",
    "fragment_pairs_to_imitation",
    "reward_params_to_state_dict",
    "reward_params_from_state_dict",
]

_IMITATION_HINT = "pip install imitation (it brings torch)"


# ----------------------------------------------------------------------------- imitation -> jaxweight

def trajectories_from_imitation(trajectories: Sequence[Any], *, horizon: int | None = None) -> Trajectories:
    """Convert imitation ``TrajectoryWithRew`` objects into :class:`~jaxweight.preference.Trajectories`.

    Anything with ``obs`` (``[T_n + 1, ...]``), ``acts`` (``[T_n, ...]``) and optionally ``rews``
    (``[T_n]``, zeros when missing) and ``terminal`` (default True) attributes works; imitation is
    never imported. ``DictObs`` observations are not supported.

    Args:
      trajectories: ``N`` episodes.
      horizon: padded length ``T`` (default: the longest episode).

    Raises:
      ValueError: no episode, an object without ``obs``/``acts``, non-array observations, or the
        shape errors of :func:`jaxweight.preference.trajectories_from_arrays`.
    """
    if len(trajectories) == 0:
        raise ValueError("trajectories must contain at least one episode")
    obs, acts, rews, term = [], [], [], []
    for i, t in enumerate(trajectories):
        if not hasattr(t, "obs") or not hasattr(t, "acts"):
            raise ValueError(f"trajectories[{i}] has no obs/acts attributes: {type(t).__name__}")
        if not isinstance(t.obs, np.ndarray | jax.Array):
            raise ValueError(f"trajectories[{i}].obs must be an array (DictObs is not supported)")
        obs.append(t.obs)
        acts.append(t.acts)
        r = getattr(t, "rews", None)
        rews.append(np.zeros(len(t.acts), np.float32) if r is None else r)
        term.append(bool(getattr(t, "terminal", True)))
    return trajectories_from_arrays(obs, acts, rews, term, horizon=horizon)


def fragment_pairs_from_imitation(pairs: Sequence[tuple[Any, Any]]) -> FragmentPairs:
    """Convert imitation's ``[(TrajectoryWithRew, TrajectoryWithRew), ...]`` fragment pairs.

    All fragments must have the same length ``L``. imitation is never imported.

    Raises:
      ValueError: no pair, or fragments of different lengths.
    """
    if len(pairs) == 0:
        raise ValueError("pairs must contain at least one pair")
    lens = {len(f.acts) for pair in pairs for f in pair}
    if len(lens) != 1:
        raise ValueError(f"all fragments must have the same length, got lengths {sorted(lens)}")
    obs = np.stack([np.stack([np.asarray(f.obs) for f in pair]) for pair in pairs])
    acts = np.stack([np.stack([np.asarray(f.acts) for f in pair]) for pair in pairs])
    rews = np.stack([
        np.stack([np.zeros(len(f.acts)) if getattr(f, "rews", None) is None else np.asarray(f.rews) for f in pair])
        for pair in pairs
    ])
    term = np.array([[bool(getattr(f, "terminal", False)) for f in pair] for pair in pairs])
    return fragment_pairs_from_arrays(obs, acts, rews, term)


# ----------------------------------------------------------------------------- jaxweight -> imitation

def _types():
    try:
        from imitation.data import types  # noqa: PLC0415
    except ImportError as e:
        raise ImportError(f"converting to imitation objects needs imitation: {_IMITATION_HINT}") from e
    return types


def _traj(types, obs, acts, rews, terminal):
    return types.TrajectoryWithRew(obs=obs, acts=acts, infos=None, terminal=bool(terminal),
                                   rews=np.asarray(rews, np.float32))


def trajectories_to_imitation(trajs: Trajectories) -> list[Any]:
    """One ``imitation.data.types.TrajectoryWithRew`` per episode (padding cut off; needs imitation).

    Episode ``n`` keeps ``lengths[n]`` transitions: ``obs[n, :L+1]``, ``acts[n, :L]``,
    ``rews[n, :L]`` and ``terminal[n]``. Round trip: ``trajectories_from_imitation(out)`` gives
    ``trajs`` back (same horizon with ``horizon=trajs.horizon``).

    Raises:
      ImportError: imitation is not installed.
    """
    types = _types()
    obs, acts, rews, lengths, term = jax.device_get((trajs.obs, trajs.acts, trajs.rews, trajs.lengths,
                                                     trajs.terminal))
    out = []
    for n, k in enumerate(np.asarray(lengths).tolist()):  # host-side unpacking into Python objects
        out.append(_traj(types, obs[n, :k + 1], acts[n, :k], rews[n, :k], term[n]))
    return out


def fragment_pairs_to_imitation(pairs: FragmentPairs, *, only_valid: bool = True) -> list[tuple[Any, Any]]:
    """imitation's fragment-pair list ``[(TrajectoryWithRew, TrajectoryWithRew), ...]`` (needs imitation).

    Args:
      pairs: ``P`` fragment pairs.
      only_valid: leave out pairs whose ``valid`` flag is False (padding).

    Raises:
      ImportError: imitation is not installed.
    """
    types = _types()
    obs, acts, rews, term, valid = jax.device_get((pairs.obs, pairs.acts, pairs.rews, pairs.terminal,
                                                   pairs.valid))
    keep = np.flatnonzero(np.asarray(valid)) if only_valid else np.arange(len(valid))
    return [tuple(_traj(types, obs[p, j], acts[p, j], rews[p, j], term[p, j]) for j in range(2))
            for p in keep.tolist()]


# ----------------------------------------------------------------------------- reward-net weights

_LAYER = re.compile(r"^dense(\d+|_final)$")
_KEY = re.compile(r"^(?:(?P<prefix>.*?)\.)?(?P<layer>dense(?:\d+|_final))\.(?P<kind>weight|bias)$")


def _torch():
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:
        raise ImportError("reward-net state_dicts need torch (pip install torch), or pass as_numpy=True") from e
    return torch


def _layers(params: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    inner = params.get("params", params) if isinstance(params, Mapping) else None
    if not isinstance(inner, Mapping) or not inner:
        raise ValueError("params must be RewardMLP parameters: {'params': {'dense0': {...}, ..., 'dense_final': {...}}}")
    bad = [k for k in inner if not _LAYER.match(str(k))]
    if bad or "dense_final" not in inner:
        raise ValueError(f"params must hold RewardMLP layers dense0, dense1, ..., dense_final only, got "
                         f"{sorted(map(str, inner))}")
    for name, layer in inner.items():
        if not isinstance(layer, Mapping) or set(layer) != {"kernel", "bias"}:
            raise ValueError(f"params layer {name!r} must have exactly 'kernel' and 'bias'")
    return dict(inner)


def _order(names) -> list[str]:
    return sorted(names, key=lambda n: (n == "dense_final", int(n[5:]) if n != "dense_final" else 0))


def reward_params_to_state_dict(params: Mapping[str, Any], *, prefix: str = "mlp",
                                member_prefix: str = "members", as_numpy: bool = False) -> dict[str, Any]:
    """RewardMLP flax parameters -> imitation ``BasicRewardNet`` (or ``RewardEnsemble``) ``state_dict``.

    Args:
      params: ``{"params": {"dense0": {"kernel": f32[in, h], "bias": f32[h]}, ..., "dense_final": ...}}``
        (or the inner dict). With a leading member axis (``kernel: f32[M, in, h]``, from
        ``ensemble_init``) the keys are ``{member_prefix}.{k}.{prefix}.dense0.weight`` etc.
      prefix: the submodule holding the MLP (``"mlp"`` in ``BasicRewardNet``; ``""`` for a bare
        ``build_mlp`` ``Sequential``).
      member_prefix: the ``ModuleList`` of an ensemble.
      as_numpy: NumPy arrays instead of torch tensors (no torch needed).

    Returns:
      ``{"mlp.dense0.weight": [h, in], "mlp.dense0.bias": [h], ..., "mlp.dense_final.weight": [1, h],
      "mlp.dense_final.bias": [1]}`` (float32), ready for ``net.load_state_dict``.

    Raises:
      ValueError: params that are not RewardMLP layers, or inconsistent ensemble axes.
      ImportError: torch is missing and ``as_numpy`` is False.
    """
    layers = _layers(params)
    host = {n: {k: np.asarray(jax.device_get(v), np.float32) for k, v in layer.items()} for n, layer in layers.items()}
    ndims = {v["kernel"].ndim for v in host.values()}
    if ndims not in ({2}, {3}):
        raise ValueError(f"kernels must all be [in, out] or all [M, in, out], got ranks {sorted(ndims)}")
    ensemble = ndims == {3}
    members = {v["kernel"].shape[0] for v in host.values()} if ensemble else {1}
    if len(members) != 1:
        raise ValueError(f"ensemble kernels disagree on the number of members: {sorted(members)}")
    pre = f"{prefix}." if prefix else ""
    out: dict[str, np.ndarray] = {}
    for m in range(members.pop()):
        mp = f"{member_prefix}.{m}." if ensemble else ""
        for name in _order(host):
            k = host[name]["kernel"][m] if ensemble else host[name]["kernel"]
            b = host[name]["bias"][m] if ensemble else host[name]["bias"]
            out[f"{mp}{pre}{name}.weight"] = np.ascontiguousarray(k.T)
            out[f"{mp}{pre}{name}.bias"] = np.ascontiguousarray(b)
    if as_numpy:
        return out
    th = _torch()
    return {k: th.from_numpy(v.copy()) for k, v in out.items()}


def reward_params_from_state_dict(state_dict: Mapping[str, Any], *, prefix: str = "mlp",
                                  member_prefix: str = "members") -> dict[str, Any]:
    """imitation ``BasicRewardNet`` / ``RewardEnsemble`` ``state_dict`` -> RewardMLP flax parameters.

    Accepts torch tensors or arrays. Keys other than ``[{member_prefix}.{k}.]{prefix}.dense*.weight|bias``
    (normalisation buffers and the like) are refused, so nothing is dropped silently.

    Returns:
      ``{"params": {"dense0": {"kernel": f32[in, h], "bias": f32[h]}, ..., "dense_final": ...}}``
      (jax arrays); an ensemble's weights get a leading member axis ``M``.

    Raises:
      ValueError: unknown keys, a missing weight or bias, members with different layers, or
        weight/bias shapes that do not chain.
    """
    pre = f"{prefix}." if prefix else ""
    ens = re.compile(rf"^{re.escape(member_prefix)}\.(\d+)\.(.*)$")
    by_member: dict[int | None, dict[str, dict[str, np.ndarray]]] = {}
    for key, value in state_dict.items():
        m = ens.match(key)
        member, rest = (int(m.group(1)), m.group(2)) if m else (None, key)
        if not rest.startswith(pre):
            raise ValueError(f"state_dict key {key!r} is not a {prefix or 'MLP'} Linear weight or bias")
        km = _KEY.match(rest[len(pre):])
        if km is None or km.group("prefix"):
            raise ValueError(f"state_dict key {key!r} is not a {prefix or 'MLP'} Linear weight or bias "
                             "(only dense*/dense_final weights and biases map to RewardMLP)")
        arr = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        by_member.setdefault(member, {}).setdefault(km.group("layer"), {})[km.group("kind")] = arr
    if not by_member:
        raise ValueError("state_dict is empty")
    if None in by_member and len(by_member) > 1:
        raise ValueError("state_dict mixes ensemble members and a single net")
    members = sorted(by_member, key=lambda x: -1 if x is None else x)
    if members != [None] and members != list(range(len(members))):
        raise ValueError(f"ensemble members must be numbered 0..M-1, got {members}")

    def convert(layers: dict[str, dict[str, np.ndarray]], who: str) -> dict[str, dict[str, np.ndarray]]:
        if "dense_final" not in layers:
            raise ValueError(f"{who}: no dense_final layer")
        names = _order(layers)
        hidden = [n for n in names if n != "dense_final"]
        if hidden != [f"dense{i}" for i in range(len(hidden))]:
            raise ValueError(f"{who}: hidden layers must be dense0..dense{len(hidden) - 1}, got {hidden}")
        out, width = {}, None
        for n in names:
            if set(layers[n]) != {"weight", "bias"}:
                raise ValueError(f"{who}: layer {n} needs both weight and bias")
            w, b = layers[n]["weight"], layers[n]["bias"]
            if w.ndim != 2 or b.shape != (w.shape[0],):
                raise ValueError(f"{who}: layer {n} has weight {w.shape} and bias {b.shape}")
            if width is not None and w.shape[1] != width:
                raise ValueError(f"{who}: layer {n} takes {w.shape[1]} inputs but the previous layer gives {width}")
            width = w.shape[0]
            out[n] = {"kernel": np.asarray(w.T, np.float32), "bias": np.asarray(b, np.float32)}
        return out

    per = [convert(by_member[m], "state_dict" if m is None else f"state_dict member {m}") for m in members]
    if len(per) == 1 and members == [None]:
        tree = per[0]
    else:
        shapes = [jax.tree.map(np.shape, p) for p in per]
        if any(s != shapes[0] for s in shapes):
            raise ValueError("ensemble members have different layer shapes")
        tree = jax.tree.map(lambda *xs: np.stack(xs), *per)
    return {"params": jax.tree.map(jax.numpy.asarray, tree)}
