"""Reusable contract checks every jaxweight state type must pass.

Use the single pieces, or :func:`check_state_contract` for all of them::

    from tests.contracts import check_state_contract

    def test_contract(tmp_path):
        cfg = mymod.config(...)
        check_state_contract(
            init=lambda: mymod.init(cfg),
            update=lambda s, x, c: mymod.update(s, x, c),
            update_args=(x, cfg),
            update_args_alt=(x2, cfg2),     # same shapes, new values (e.g. new hyperparameters)
            batched_init=lambda keys: jax.vmap(...)(keys),   # optional
            tmp_path=tmp_path,
        )

The checks:
- ``jit == eager`` for ``update`` (exact by default; ``rtol``/``atol`` for float math
  that XLA may fuse differently);
- ``jax.vmap`` over a batch of states (and optionally over ``update_args``) equals the
  per-element results;
- a second jitted call with new values of the same shapes compiles nothing
  (counted traces, and ``jax.log_compiles`` to be sure nothing is recompiled);
- leaf dtypes and shapes of the state are the same before and after ``update``;
- checkpoint round trip through ``jaxweight.checkpoint`` is exact.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxweight import checkpoint

__all__ = [
    "assert_trees_close",
    "assert_same_structure",
    "assert_jit_matches_eager",
    "assert_no_retrace",
    "assert_vmap_matches_loop",
    "assert_checkpoint_roundtrip",
    "check_state_contract",
    "CompileCounter",
    "BAD_INPUT_MODES",
    "run_eager_or_checked",
    "debug_checks",
    "checked_and_plain",
]


def _np(x):
    if jax.dtypes.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(x))
    return np.asarray(x)


def assert_trees_close(a: Any, b: Any, rtol: float = 0.0, atol: float = 0.0, err: str = "") -> None:
    """Same structure and (close or exactly equal) leaves; NaNs compare equal."""
    ta, tb = jax.tree_util.tree_structure(a), jax.tree_util.tree_structure(b)
    assert ta == tb, f"{err}tree structures differ:\n{ta}\n{tb}"
    fa = jax.tree_util.tree_flatten_with_path(a)[0]
    fb = jax.tree_util.tree_leaves(b)
    for (path, x), y in zip(fa, fb):
        x, y = _np(x), _np(y)
        where = f"{err}leaf {jax.tree_util.keystr(path)}"
        assert x.shape == y.shape, f"{where}: shape {x.shape} != {y.shape}"
        assert x.dtype == y.dtype, f"{where}: dtype {x.dtype} != {y.dtype}"
        if rtol == 0 and atol == 0 or not np.issubdtype(x.dtype, np.inexact):
            np.testing.assert_array_equal(x, y, err_msg=where)
        else:
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=where)


def assert_same_structure(a: Any, b: Any, err: str = "") -> None:
    """Same tree structure, leaf shapes and dtypes (values may differ)."""
    ta, tb = jax.tree_util.tree_structure(a), jax.tree_util.tree_structure(b)
    assert ta == tb, f"{err}tree structures differ:\n{ta}\n{tb}"
    fa = jax.tree_util.tree_flatten_with_path(a)[0]
    for (path, x), y in zip(fa, jax.tree_util.tree_leaves(b)):
        where = f"{err}leaf {jax.tree_util.keystr(path)}"
        assert jnp.shape(x) == jnp.shape(y), f"{where}: shape {jnp.shape(x)} != {jnp.shape(y)}"
        assert jnp.result_type(x) == jnp.result_type(y), f"{where}: dtype {jnp.result_type(x)} != {jnp.result_type(y)}"
        if isinstance(x, jax.Array):
            assert not getattr(x, "weak_type", False), f"{where}: weakly typed leaf (recompiles on new values)"


def assert_jit_matches_eager(fn: Callable, *args: Any, rtol: float = 0.0, atol: float = 0.0) -> Any:
    """``jax.jit(fn)(*args)`` equals ``fn(*args)``; returns the jitted result."""
    eager = fn(*args)
    jitted = jax.jit(fn)(*args)
    assert_trees_close(jitted, eager, rtol=rtol, atol=atol, err="jit vs eager: ")
    return jitted


class CompileCounter:
    """Counts XLA compilations while active (via ``jax.log_compiles``' log records)."""

    def __init__(self):
        self.messages: list[str] = []

    def __enter__(self):
        self._handler = _ListHandler(self.messages)
        self._logger = logging.getLogger("jax")
        self._old_level = self._logger.level
        self._logger.addHandler(self._handler)
        self._logger.setLevel(logging.WARNING)
        self._ctx = jax.log_compiles(True)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        self._logger.removeHandler(self._handler)
        self._logger.setLevel(self._old_level)
        return False

    @property
    def count(self) -> int:
        return sum("Compiling" in m for m in self.messages)


class _ListHandler(logging.Handler):
    def __init__(self, sink):
        super().__init__(level=logging.DEBUG)
        self.sink = sink

    def emit(self, record):
        self.sink.append(record.getMessage())


def assert_no_retrace(fn: Callable, args_a: Sequence[Any], args_b: Sequence[Any]) -> None:
    """A jitted ``fn`` traced on ``args_a`` is not traced or compiled again for ``args_b``.

    ``args_b`` must have the same shapes/dtypes as ``args_a`` with new values
    (e.g. a config with other hyperparameter values). Static configuration that
    differs between the two would rightly retrace: keep it the same.
    """
    # chex counts the traces (a second one raises, naming the function); the compile log
    # counter catches a recompilation without a retrace
    chex.clear_trace_counter()  # chex counts per code location: forget earlier contracts' traces
    jitted = jax.jit(chex.assert_max_traces(lambda *a: fn(*a), n=1))
    jax.block_until_ready(jitted(*args_a))
    with CompileCounter() as cc:
        try:
            jax.block_until_ready(jitted(*args_b))
        except AssertionError as e:
            raise AssertionError(
                f"second call with new values retraced (a Python scalar or weak type in the inputs?): {e}"
            ) from None
    assert cc.count == 0, f"second call compiled again: {cc.messages}"


def assert_vmap_matches_loop(fn: Callable, in_axes: Any, *args: Any, rtol: float = 0.0,
                             atol: float = 0.0) -> Any:
    """``jax.vmap(fn, in_axes)(*args)`` equals stacking ``fn`` on each slice.

    The loop over the batch here is test code only (it is the reference).
    Returns the vmapped result.
    """
    out = jax.vmap(fn, in_axes=in_axes)(*args)
    axes = in_axes if isinstance(in_axes, tuple | list) else (in_axes,) * len(args)
    sizes = {jax.tree_util.tree_leaves(a)[0].shape[ax] for a, ax in zip(args, axes) if ax is not None}
    assert len(sizes) == 1, f"inconsistent batch sizes {sizes}"
    (n,) = sizes
    for i in range(n):
        sl = [a if ax is None else jax.tree.map(lambda x: x[i], a) for a, ax in zip(args, axes)]
        ref = fn(*sl)
        got = jax.tree.map(lambda x: x[i], out)
        assert_trees_close(got, ref, rtol=rtol, atol=atol, err=f"vmap element {i}: ")
    return out


def assert_checkpoint_roundtrip(tree: Any, tmp_path, target: Any | None = None) -> Any:
    """Save with ``jaxweight.checkpoint`` and load back: exactly equal, same dtypes/shapes."""
    path = tmp_path / "contract.ckpt"
    checkpoint.save(path, tree, metadata={"contract": True})
    tgt = target if target is not None else jax.tree.map(jnp.zeros_like, tree)
    back = checkpoint.load(path, tgt)
    assert_trees_close(back, tree, err="checkpoint round trip: ")
    return back


def check_state_contract(
    *,
    init: Callable[[], Any],
    update: Callable[..., Any],
    update_args: Sequence[Any] = (),
    update_args_alt: Sequence[Any] | None = None,
    batched_init: Callable[[], Any] | None = None,
    batched_update_in_axes: Any = None,
    batched_update_args: Sequence[Any] | None = None,
    tmp_path=None,
    rtol: float = 0.0,
    atol: float = 0.0,
) -> None:
    """Run every contract on one state type.

    Args:
      init: ``() -> state``.
      update: ``(state, *update_args) -> state`` (or ``-> (state, ...)``; the first
        element is taken as the new state).
      update_args: extra arguments of ``update``.
      update_args_alt: same shapes, different values (new hyperparameters); checks
        that the jitted ``update`` compiles nothing the second time.
      batched_init: ``() -> batched state`` (leading axis); if given, ``jax.vmap(update)``
        over it is compared with per-element updates.
      batched_update_in_axes / batched_update_args: in_axes for ``update_args`` under
        vmap (default: broadcast, i.e. ``None``) and their batched values.
      tmp_path: pytest's ``tmp_path``; enables the checkpoint round trip.
      rtol, atol: tolerance for jit vs eager and vmap vs loop (0 = exact).
    """

    def new_state(*a):
        out = update(*a)
        return out[0] if isinstance(out, tuple) else out

    state = init()
    # dtypes/shapes stable, no weak types
    after = new_state(state, *update_args)
    assert_same_structure(state, after, err="update changed the state layout: ")
    # jit == eager
    assert_jit_matches_eager(new_state, state, *update_args, rtol=rtol, atol=atol)
    # jitted init works and equals eager init
    assert_trees_close(jax.jit(init)(), state, err="jit(init) vs init: ")
    # no recompilation with new values
    if update_args_alt is not None:
        assert_no_retrace(new_state, (state, *update_args), (after, *update_args_alt))
    # vmap over a batch of states
    if batched_init is not None:
        bstate = batched_init()
        if batched_update_args is None:
            axes = (0,) + (None,) * len(update_args)
            assert_vmap_matches_loop(new_state, axes, bstate, *update_args, rtol=rtol, atol=atol)
        else:
            extra = batched_update_in_axes if batched_update_in_axes is not None else (0,) * len(batched_update_args)
            axes = (0, *extra)
            assert_vmap_matches_loop(new_state, axes, bstate, *batched_update_args, rtol=rtol, atol=atol)
    # checkpoint round trip
    if tmp_path is not None:
        assert_checkpoint_roundtrip(after, tmp_path, target=init())


BAD_INPUT_MODES = ["eager", "checked_jit"]


def run_eager_or_checked(mode: str, fn: Callable, value: Any) -> Any:
    """``fn(value)`` eagerly (a Python number) or under ``jaxweight.checked(jax.jit(fn))`` (a traced f32).

    The bad-input suites run each hyperparameter case both ways and expect the same error.
    """
    if mode == "eager":
        return fn(value)
    import jaxweight

    return jaxweight.checked(jax.jit(fn))(jnp.float32(value))


@contextlib.contextmanager
def debug_checks():
    """``jax_debug_nans`` and ``jax_debug_infs`` on: any op that makes a NaN or inf raises.

    Every component must run under it on ordinary input (CONVENTIONS: no NaN or inf as a
    sentinel in a state or an output).
    """
    with jax.debug_nans(True), jax.debug_infs(True):
        yield


def checked_and_plain(f: Callable, jit_or_eager: Callable, *args: Any) -> tuple[Any, Any]:
    """``(f(*args) under debug_checks(), f(*args) without)``, eager or jitted both times.

    Eager, the checks see every op; jitted, they see the program's outputs.
    """
    g = jit_or_eager(f)
    with debug_checks():
        got = jax.block_until_ready(g(*args))
    return got, g(*args)
