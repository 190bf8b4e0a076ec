"""maxent_grpo's ``controller_state.json`` <-> :class:`jaxweight.maxent.ControllerState`.

The layout maxent_grpo writes and reads::

    {"beta": 0.04, "tau": 0.3, "tau_log": -1.2, "tau_entropy_ema": 2.1,
     "meta": {"version": 1, "controller": {"enabled": true, "method": "analytic", ...}}}

``meta`` is present only when a meta-controller is saved with the state. An entropy EMA
that was never measured is ``"tau_entropy_ema": null`` (maxent_grpo writes NaN or ``tau``
for it); reading, a missing, null, NaN or non-numeric EMA is "not measured"
(``has_entropy_ema`` False), so the flag round-trips.

Example::

    import tempfile, os
    from jaxweight import maxent
    from jaxweight.interop import maxent_grpo

    cfg = maxent.config(tau=0.3, beta=0.04)
    path = os.path.join(tempfile.mkdtemp(), "controller_state.json")
    maxent_grpo.save_controller_state(path, maxent.init(cfg), cfg.meta)
    state = maxent_grpo.load_controller_state(path)
    assert abs(float(state.denom) - 0.34) < 1e-6       # maxent_grpo's loader rule: tau + beta

References:
  maxent-grpo, ``maxent_grpo.training.weighting`` (``controller_state.json``),
  https://github.com/liv-daliberti/maxent-grpo
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from .._util import StateFileError, atomic_write_json
from ..maxent import ControllerState, MaxEntConfig, MetaController, config, init

__all__ = [
    "CONTROLLER_STATE_FILENAME",
    "STATE_VERSION",
    "ControllerFile",
    "controller_state_dict",
    "save_controller_state",
    "load_controller_state",
    "load_controller_file",
    "state_from_dict",
    "meta_to_payload",
    "meta_from_payload",
]

CONTROLLER_STATE_FILENAME = "controller_state.json"
STATE_VERSION = 1


class ControllerFile(NamedTuple):
    """What a ``controller_state.json`` holds: the state and the meta-controller settings."""

    state: ControllerState
    meta: MetaController


def _meta_of(meta: Any) -> MetaController | None:
    if meta is None or isinstance(meta, MetaController):
        return meta
    if isinstance(meta, MaxEntConfig):
        return meta.meta
    raise ValueError(f"meta must be a MetaController or MaxEntConfig, got {type(meta).__name__}")


def meta_to_payload(meta: MetaController | MaxEntConfig, state: ControllerState | None = None) -> dict[str, Any]:
    """maxent_grpo's ``meta.controller`` payload (host only).

    ``last_*_grad`` come from ``state`` when given. ``tau_min`` / ``tau_max``
    are jaxweight extras (maxent_grpo ignores unknown keys).
    """
    meta = _meta_of(meta)
    tg = state.last_tau_grad if state is not None else meta.last_tau_grad
    bg = state.last_beta_grad if state is not None else meta.last_beta_grad
    return {
        "enabled": bool(meta.enabled),
        "method": str(meta.method),
        "learning_rate": float(meta.learning_rate),
        "tau_learning_rate": float(meta.tau_learning_rate),
        "beta_learning_rate": float(meta.beta_learning_rate),
        "beta_grad_clip": float(meta.beta_grad_clip),
        "update_interval": int(meta.update_interval),
        "objective": str(meta.objective),
        "analytic_steps": int(meta.analytic_steps),
        "optimizer": str(meta.optimizer),
        "truncation_steps": int(meta.truncation_steps),
        "use_hessian": bool(meta.use_hessian),
        "last_tau_grad": float(tg),
        "last_beta_grad": float(bg),
        "tau_min": float(meta.tau_min),
        "tau_max": float(meta.tau_max),
    }


def meta_from_payload(payload: Any, base: MetaController | None = None) -> MetaController:
    """Settings from a ``meta.controller`` payload; unreadable fields keep ``base``'s values.

    Mirrors maxent_grpo's lenient ``apply_state``: fields that are missing or
    do not parse are left as they are; negative rates / bounds are ignored
    the same way (they would be refused by :func:`jaxweight.maxent.config`).
    """
    out = base if base is not None else MetaController()
    if not isinstance(payload, dict):
        return out
    kw: dict[str, Any] = {}
    if "enabled" in payload:
        kw["enabled"] = bool(payload["enabled"])
    for k in ("method", "objective", "optimizer"):
        if payload.get(k) and isinstance(payload[k], str):
            kw[k] = str(payload[k])
    for k in ("learning_rate", "tau_learning_rate", "beta_learning_rate", "beta_grad_clip",
              "last_tau_grad", "last_beta_grad", "tau_min", "tau_max"):
        if k in payload:
            try:
                v = float(payload[k])
            except (TypeError, ValueError):
                continue
            if math.isfinite(v) and (v >= 0 or k in ("last_tau_grad", "last_beta_grad", "tau_max")):
                kw[k] = v
    for k in ("update_interval", "analytic_steps", "truncation_steps"):
        if k in payload:
            try:
                kw[k] = max(1, int(payload[k]))
            except (TypeError, ValueError, OverflowError):
                pass
    if "use_hessian" in payload:
        kw["use_hessian"] = bool(payload["use_hessian"])
    # a file with reversed tau bounds: drop the cap rather than build settings that would be refused
    tmin, tmax = float(kw.get("tau_min", out.tau_min)), float(kw.get("tau_max", out.tau_max))
    if tmax > 0 and tmin > tmax:
        kw["tau_max"] = 0.0
    return out.replace(**kw)


def controller_state_dict(state: ControllerState, meta: MetaController | MaxEntConfig | None = None) -> dict:
    """maxent_grpo's ``controller_state.json`` payload (host only).

    Returns:
      ``{"beta", "tau", "tau_log", "tau_entropy_ema"}`` (an EMA not measured yet,
      ``has_entropy_ema`` False, is written as ``None``: JSON ``null``, maxent_grpo's
      "unset", which it reads as ``tau``) plus ``"meta": {"version": 1,
      "controller": {...}}`` when ``meta`` is given.

    Raises:
      ValueError: ``state`` is a batch of controllers (leaves that are not 0-d).
    """
    meta = _meta_of(meta)
    st = jax.device_get(state)
    if any(np.ndim(x) for x in jax.tree.leaves(st)):
        raise ValueError("controller_state_dict takes one controller (0-d leaves), not a batch")
    out: dict[str, Any] = {
        "beta": float(st.beta),
        "tau": float(st.tau),
        "tau_log": float(st.log_tau),
        "tau_entropy_ema": float(st.entropy_ema) if bool(st.has_entropy_ema) else None,
    }
    if meta is not None:
        out["meta"] = {"version": STATE_VERSION, "controller": meta_to_payload(meta, st)}
    return out


def save_controller_state(
    path: str | os.PathLike, state: ControllerState, meta: MetaController | MaxEntConfig | None = None
) -> Path:
    """Write :func:`controller_state_dict` as JSON, atomically.

    The file is written to a temporary file in the same folder and renamed
    over ``path`` (a crash leaves the old file or the new one); parent folders
    are created; a bare file name works.

    Returns:
      The path written.
    """
    return atomic_write_json(path, controller_state_dict(state, meta))


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def state_from_dict(payload: Any, source: str = "controller state") -> ControllerFile:
    """:class:`ControllerFile` from a decoded ``controller_state.json`` payload.

    Rules (maxent_grpo's loader): a missing or non-numeric ``tau_log`` becomes
    ``ln(max(tau, 1e-8))``; a missing / null / non-numeric / non-finite
    ``tau_entropy_ema`` is maxent_grpo's "not measured" (its ``None`` / NaN): the state
    gets ``has_entropy_ema`` False (value 0), and the first valid measurement starts the
    EMA; and **``denom = tau + beta``** (1 if that is <= 0), the rule the original
    applies when it restores a controller; the next controller update resets ``denom`` to
    ``tau``.

    Raises:
      StateFileError: not an object, or ``tau`` / ``beta`` missing,
        non-numeric, non-finite or negative (the message names ``source`` and
        the field).
    """
    if not isinstance(payload, dict):
        raise StateFileError(f"{source}: expected a JSON object, got {type(payload).__name__}")
    vals = {}
    for field in ("tau", "beta"):
        if field not in payload:
            raise StateFileError(f"{source}: missing field {field!r}")
        v = payload[field]
        if not _number(v) or not math.isfinite(float(v)) or float(v) < 0:
            raise StateFileError(f"{source}: field {field!r} must be a finite number >= 0, got {v!r}")
        vals[field] = float(v)
    tau, beta = vals["tau"], vals["beta"]
    tau_log = payload.get("tau_log")
    tau_log = float(tau_log) if _number(tau_log) and math.isfinite(float(tau_log)) else math.log(max(tau, 1e-8))
    ema = payload.get("tau_entropy_ema")
    has_ema = _number(ema) and math.isfinite(float(ema))
    denom = tau + beta if tau + beta > 0 else 1.0

    meta_payload = payload.get("meta")
    if meta_payload is not None and not isinstance(meta_payload, dict):
        raise StateFileError(f"{source}: field 'meta' must be an object, got {type(meta_payload).__name__}")
    ctrl = meta_payload.get("controller") if isinstance(meta_payload, dict) else None
    if ctrl is not None and not isinstance(ctrl, dict):
        raise StateFileError(f"{source}: field 'meta.controller' must be an object, got {type(ctrl).__name__}")
    meta = meta_from_payload(ctrl)

    f32 = np.float32
    state = init(config(tau, beta, denom=denom)).replace(
        log_tau=jax.numpy.asarray(f32(tau_log)),
        entropy_ema=jax.numpy.asarray(f32(ema if has_ema else 0.0)),
        has_entropy_ema=jax.numpy.asarray(has_ema),
        last_tau_grad=jax.numpy.asarray(f32(meta.last_tau_grad)),
        last_beta_grad=jax.numpy.asarray(f32(meta.last_beta_grad)),
    )
    return ControllerFile(state=state, meta=meta)


def load_controller_file(path: str | os.PathLike) -> ControllerFile:
    """Read a ``controller_state.json`` (maxent_grpo's or ours): state and meta settings.

    See :func:`state_from_dict` for the rules.

    Raises:
      FileNotFoundError: the file does not exist.
      StateFileError: binary, truncated or invalid JSON, not an object, or
        ``tau`` / ``beta`` missing or not a finite number >= 0 (the message
        names the file and the field).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"controller state file not found: {path}")
    if path.is_dir():
        raise StateFileError(f"{path}: is a directory, not a controller state file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StateFileError(f"{path}: not a text (UTF-8 JSON) controller state file ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise StateFileError(f"{path}: empty file, not a controller state")
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as e:
        raise StateFileError(f"{path}: not valid JSON, truncated or corrupted ({e})") from None
    return state_from_dict(payload, str(path))


def load_controller_state(path: str | os.PathLike) -> ControllerState:
    """The :class:`~jaxweight.maxent.ControllerState` of a ``controller_state.json``.

    Same rules and errors as :func:`load_controller_file` (which also returns
    the meta-controller settings).
    """
    return load_controller_file(path).state
