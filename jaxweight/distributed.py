"""Multi-device and multi-host helpers: meshes, data-parallel steps, weight broadcast.

jaxweight's step functions are pure jitted functions over pytrees, so scaling
them out needs no new algorithm, only JAX's own machinery:

* **Meshes and shardings** (:func:`make_mesh`, :func:`split_devices`,
  :func:`replicated`, :func:`batch_sharding`): one named ``"data"`` axis.
* **Data parallelism**: :func:`data_parallel_jit` jits an unchanged one-device
  step with the batch sharded and everything else replicated (XLA inserts the
  gradient all-reduce), :func:`data_parallel_grad` is the explicit version
  (``jax.shard_map`` + ``lax.pmean``), and :func:`data_parallel_train_step`
  builds a whole optax step from a per-batch gradient function.
* **Reward-model training** (:func:`reward_train_step`): the one reward train
  step ``jaxweight.preference.train_step`` under ``shard_map`` with
  ``axis_name`` (whole epochs: ``jaxweight.preference.train_reward(..., mesh=)``).
* **Several processes / hosts**: :func:`initialize_cpu_cluster` (or plain
  ``jax.distributed.initialize`` on GPU/TPU), :func:`shard_batch` and
  :func:`replicate` build global arrays from what each process holds,
  :func:`to_host` reads results back, :func:`broadcast_from_process0` and
  :func:`broadcast_weight_sync` push the learner's weights from process 0 to the
  actors of every process with :class:`jaxweight.sync.WeightSync` semantics.

The same code runs on one device, on several devices of one process and on
several processes: every helper works from the process-local view. See
``docs/multihost.md`` for the step-by-step guide.

Example (one process, 8 devices)::

    mesh = make_mesh()                                   # all devices on axis "data"
    params = replicate(params, mesh)
    step = data_parallel_train_step(grad_fn, optax.adamw(1e-3), mesh)
    params, opt_state, aux = step(params, opt_state, shard_batch(batch, mesh))
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .sync import Placement, UpdateMap, WeightSync

__all__ = [
    "DATA_AXIS",
    "make_mesh",
    "split_devices",
    "replicated",
    "batch_sharding",
    "replicate",
    "shard_batch",
    "to_host",
    "data_parallel_jit",
    "data_parallel_grad",
    "data_parallel_train_step",
    "reward_train_step",
    "initialize_cpu_cluster",
    "broadcast_from_process0",
    "broadcast_weight_sync",
]

DATA_AXIS = "data"


# ------------------------------------------------------------------ meshes
def make_mesh(devices: Sequence[jax.Device] | None = None, axis_name: str = DATA_AXIS) -> Mesh:
    """A 1-D mesh over ``devices`` (default: every device of every process).

    The mesh uses ``Auto`` axis types, so shardings are propagated by XLA and
    unchanged one-device code runs on it.

    Args:
      devices: the devices; all of ``jax.devices()`` by default.
      axis_name: name of the mesh axis.

    Returns:
      ``jax.sharding.Mesh`` of shape ``(len(devices),)``.
    """
    devs = list(jax.devices() if devices is None else devices)
    if not devs:
        raise ValueError("devices must not be empty")
    return jax.make_mesh((len(devs),), (axis_name,), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=devs)


def split_devices(devices: Sequence[jax.Device] | None = None, num_actor: int = 1
                  ) -> tuple[list[jax.Device], list[jax.Device]]:
    """Split local devices into (learner devices, actor devices); the actors get the last ``num_actor``.

    Raises:
      ValueError: unless ``1 <= num_actor < len(devices)``.
    """
    devs = list(jax.local_devices() if devices is None else devices)
    if isinstance(num_actor, bool) or not isinstance(num_actor, int) or not 1 <= num_actor < len(devs):
        raise ValueError(f"num_actor must be an int in [1, {len(devs) - 1}], got {num_actor!r}")
    return devs[: len(devs) - num_actor], devs[len(devs) - num_actor :]


def replicated(mesh: Mesh) -> NamedSharding:
    """``NamedSharding(mesh, P())``: a full copy on every device of ``mesh``."""
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, axis_name: str = DATA_AXIS) -> NamedSharding:
    """``NamedSharding(mesh, P(axis_name))``: leading (batch) axis split over ``axis_name``."""
    return NamedSharding(mesh, P(axis_name))


# ------------------------------------------------------- global arrays
def replicate(tree: Any, mesh: Mesh) -> Any:
    """Every leaf as a global array replicated over ``mesh``.

    Each process passes the same values (e.g. the same seed-initialised params,
    or the result of :func:`broadcast_from_process0`); only its own devices are
    written, so this also works when ``mesh`` spans several processes.
    """
    sh = replicated(mesh)

    def one(x):
        x = np.asarray(jax.device_get(x)) if not isinstance(x, np.ndarray) else x
        return jax.make_array_from_callback(x.shape, sh, lambda idx: x[idx])

    return jax.tree.map(one, tree)


def shard_batch(local_batch: Any, mesh: Mesh, axis_name: str = DATA_AXIS, *, batch_axis: int = 0) -> Any:
    """Global arrays whose batch axis is split over ``axis_name``.

    Args:
      local_batch: pytree of arrays with a batch axis ``B_local`` at
        ``batch_axis``: this process's part of the batch (with one process: the
        whole batch). Every process passes the same ``B_local``; the global
        batch is their concatenation in process order.
      mesh: the data mesh.
      axis_name: the mesh axis to split over.
      batch_axis: position of the batch axis (1 for ensemble batches ``[M, B, ...]``).

    Returns:
      The global batch (``B_local * num_processes`` along ``batch_axis``), sharded.

    Raises:
      ValueError: ``B_local`` is not a multiple of this process's devices on the
        mesh, or the leaves disagree on ``B_local``.
    """
    leaves = jax.tree.leaves(local_batch)
    if not leaves:
        return local_batch
    sizes = {int(np.shape(x)[batch_axis]) if np.ndim(x) > batch_axis else None for x in leaves}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            f"local_batch leaves must share a batch axis at position {batch_axis}, got sizes "
            f"{sorted(map(str, sizes))}"
        )
    (b,) = sizes
    n_local = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
    if n_local == 0 or b % n_local:
        raise ValueError(
            f"local_batch size {b} must be a positive multiple of the {n_local} devices this "
            f"process holds on the mesh"
        )
    sh = NamedSharding(mesh, P(*([None] * batch_axis), axis_name))
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sh, np.asarray(jax.device_get(x))),
                        local_batch)


def to_host(tree: Any) -> Any:
    """NumPy copies of (global) arrays on every process.

    Replicated arrays are read from a local copy; sharded arrays spanning other
    processes are all-gathered (a collective: every process must call it).
    """
    from jax.experimental import multihost_utils

    def one(x):
        if not isinstance(x, jax.Array):
            return np.asarray(x)
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        if x.is_fully_addressable:
            return np.asarray(x)
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)


# ---------------------------------------------------------- data parallel
def data_parallel_jit(step_fn: Callable, mesh: Mesh, *, batch_argnums: Sequence[int] = (1,),
                      axis_name: str = DATA_AXIS, donate_argnums: Sequence[int] = ()) -> Callable:
    """Jit an unchanged one-device step for data parallelism over ``mesh``.

    The arguments in ``batch_argnums`` are split along their leading axis,
    every other argument and every output is replicated. The step computes on
    the *global* batch (a mean over the batch stays a mean over all of it,
    masked means included), so the result equals the one-device result up to
    float summation order; XLA inserts the all-reduce of the gradients.

    Args:
      step_fn: ``(*args) -> outputs``, e.g. ``(params, batch) -> (loss, grads)``.
      mesh: the data mesh (may span several processes).
      batch_argnums: positions of the batch arguments.
      axis_name: mesh axis the batch is split over.
      donate_argnums: forwarded to ``jax.jit``.

    Returns:
      The jitted function. Pass global arrays (:func:`replicate`, :func:`shard_batch`).
    """
    batch_argnums = tuple(batch_argnums)

    def wrapped(*args):
        args = [jax.lax.with_sharding_constraint(a, batch_sharding(mesh, axis_name)) if i in batch_argnums
                else a for i, a in enumerate(args)]
        return step_fn(*args)

    return jax.jit(wrapped, out_shardings=replicated(mesh), donate_argnums=tuple(donate_argnums))


def data_parallel_grad(grad_fn: Callable[[Any, Any], Any], mesh: Mesh, *, axis_name: str = DATA_AXIS,
                       weighted: bool = False) -> Callable[[Any, Any], Any]:
    """Explicit data parallelism: ``grad_fn`` on each device's shard, then ``lax.pmean``.

    Args:
      grad_fn: ``(params, batch_shard) -> tree`` (gradients, losses, metrics), a
        mean over the shard. With ``weighted=True`` it returns ``(tree, weight)``
        where ``weight: f32[]`` is the shard's share (e.g. its number of valid
        items) and the result is ``psum(tree * weight) / psum(weight)``: the
        exact global masked mean even when shards hold different numbers of
        valid items.
      mesh: the data mesh; params are replicated, the batch split on its
        leading axis over ``axis_name``.
      axis_name: the mesh axis.
      weighted: see above.

    Returns:
      ``(params, batch) -> tree`` (replicated), jittable. With equal shards and
      ``weighted=False`` the result is the mean of per-shard means, i.e. the
      global mean.
    """
    def body(params, batch):
        # differentiate w.r.t. a per-device copy: a gradient w.r.t. the replicated params
        # would already be summed over devices by shard_map's autodiff
        out = grad_fn(_varying(params, axis_name), batch)
        if not weighted:
            return jax.lax.pmean(out, axis_name)
        tree, w = out
        w = jnp.asarray(w, jnp.float32)
        total = jax.lax.psum(w, axis_name)
        scale = jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), 0.0)
        return jax.lax.psum(jax.tree.map(lambda g: g * scale.astype(g.dtype), tree), axis_name)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(axis_name)), out_specs=P())


def data_parallel_train_step(grad_fn: Callable[[Any, Any], tuple[Any, Any]], optimizer: Any, mesh: Mesh, *,
                             axis_name: str = DATA_AXIS, weighted: bool = False,
                             donate: bool = True) -> Callable:
    """A jitted optax step whose gradients are averaged over the data axis.

    Args:
      grad_fn: ``(params, batch_shard) -> (grads, aux)``: the per-batch gradient
        function of the one-device trainer (``aux``: metrics, averaged too). With
        ``weighted=True`` it returns ``((grads, aux), weight)``; see
        :func:`data_parallel_grad`.
      optimizer: an ``optax.GradientTransformation``.
      mesh: the data mesh.
      axis_name: the mesh axis.
      weighted: weight each shard by its returned weight.
      donate: donate ``params`` and ``opt_state``.

    Returns:
      ``step(params, opt_state, batch) -> (params, opt_state, aux)``; params and
      optimiser state replicated, every device applies the same update.
    """
    import optax

    dp = data_parallel_grad(grad_fn, mesh, axis_name=axis_name, weighted=weighted)

    def step(params, opt_state, batch):
        grads, aux = dp(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, aux

    return jax.jit(step, out_shardings=replicated(mesh), donate_argnums=(0, 1) if donate else ())


def _varying(tree: Any, axis_name: str) -> Any:
    """Mark replicated values as per-device inside ``shard_map``.

    Under ``shard_map`` the gradient with respect to a replicated (device-invariant)
    input is implicitly summed over the axis; differentiating with respect to
    a per-device copy keeps the gradient local, so the explicit reduction that
    follows is the only one.
    """
    def one(x):
        try:
            return jax.lax.pcast(x, (axis_name,), to="varying")
        except ValueError:  # already per-device
            return x

    return jax.tree.map(one, tree)


# ---------------------------------------------------- reward-model training
def reward_train_step(trainer: Any, mesh: Mesh, *, axis_name: str = DATA_AXIS) -> Callable:
    """Data-parallel ``jaxweight.preference.train_step``: every member's batch split over devices.

    No second implementation: this is ``jax.shard_map`` of
    :func:`jaxweight.preference.train_step` with ``axis_name``, the one reward
    train step of jaxweight. Each device computes the gradient of its rows of
    every minibatch; the shard gradients (and per-minibatch counts and loss
    sums) are added with ``lax.psum``, which gives the full-batch gradient of
    the one-device step, with gradient accumulation, the Lp penalty added once
    per non-empty minibatch, imitation's in-place weight-decay regulariser,
    AdamW and the metrics exactly as on one device. Ensembles train every
    member at once (``vmap``) on its own batch. For whole epochs over a buffer
    use ``jaxweight.preference.train_reward(..., mesh=mesh)``.

    Args:
      trainer: a :class:`jaxweight.preference.RewardTrainer` (or its ``TrainerConfig``).
      mesh: the data mesh (may span several processes).
      axis_name: the mesh axis the batch is split over.

    Returns:
      ``step(state, pairs, prefs, mask=None) -> (state, metrics)`` (jitted), with
      the shapes of ``train_step``: ``pairs [B, ...]`` / ``prefs f32[B]`` /
      ``mask bool[B]``, or ``[M, B, ...]`` for ensembles. Pass the state
      replicated (:func:`replicate`) and the batch split along ``B``
      (:func:`shard_batch` with ``batch_axis=1`` for ensembles); with one process
      plain arrays work too.

    Raises:
      ValueError: ``B`` is not a multiple of the number of devices, or the
        per-device batch ``B / n`` and ``minibatch_size`` do not divide one
        another.

    Example::

        trainer = RewardTrainer(RewardMLP(), num_members=3)
        step = reward_train_step(trainer, make_mesh())
        state, metrics = step(replicate(state, mesh), pairs, prefs)   # == trainer.step(state, pairs, prefs)
    """
    from .preference.training import _local_batch, train_step

    config = getattr(trainer, "config", trainer)
    _local_batch(config, int(mesh.shape[axis_name]), axis_name)
    spec = P(None, axis_name) if config.ensemble else P(axis_name)
    lead = (config.num_members, config.batch_size) if config.ensemble else (config.batch_size,)
    sharded = jax.shard_map(
        lambda state, pairs, prefs, mask: train_step(state, pairs, prefs, config, mask, axis_name=axis_name),
        mesh=mesh, in_specs=(P(), spec, spec, spec), out_specs=(P(), P()),
    )

    @jax.jit
    def step(state, pairs, prefs, mask=None):
        if tuple(np.shape(prefs)) != lead:
            raise ValueError(f"prefs must have shape {lead}, got {tuple(np.shape(prefs))}")
        mask = jnp.ones(lead, bool) if mask is None else jnp.asarray(mask, bool)
        return sharded(state, pairs, jnp.asarray(prefs, jnp.float32), mask)

    return step


# -------------------------------------------------------------- multi-host
def initialize_cpu_cluster(coordinator_address: str, num_processes: int, process_id: int, *,
                           local_device_count: int | None = None, bind_coordinator: str | None = None,
                           gloo_hostname: str | None = None, initialization_timeout: int = 300) -> None:
    """``jax.distributed.initialize`` for CPU hosts, with gloo collectives.

    Call it first thing in every process, before any other JAX call. On GPU and
    TPU use ``jax.distributed.initialize`` directly (NCCL / ICI collectives need
    no extra setting).

    Args:
      coordinator_address: ``"host:port"`` of process 0's coordinator service.
      num_processes: total number of processes.
      process_id: this process's index in ``[0, num_processes)``.
      local_device_count: CPU devices per process (``jax_num_cpu_devices``);
        leave None to use one (or what ``XLA_FLAGS`` says).
      bind_coordinator: address the coordinator listens on (jax's default is
        every interface, ``[::]:port``); e.g. ``"127.0.0.1:port"`` for a
        single-machine run that must stay on loopback.
      gloo_hostname: address gloo's TCP transport binds to; by default gloo
        uses this machine's hostname. ``"127.0.0.1"`` keeps a single-machine run
        on loopback. (Uses a jax-internal backend hook; raises RuntimeError if
        the CPU backend is already initialised.)
      initialization_timeout: seconds to wait for every process to join.

    Example::

        initialize_cpu_cluster("10.0.0.1:4321", num_processes=2, process_id=rank)
        mesh = make_mesh()          # spans both hosts' devices
    """
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be an int >= 1, got {num_processes!r}")
    if not isinstance(process_id, int) or not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must be an int in [0, {num_processes}), got {process_id!r}")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if local_device_count is not None:
        jax.config.update("jax_num_cpu_devices", int(local_device_count))
    jax.distributed.initialize(
        coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id,
        coordinator_bind_address=bind_coordinator, initialization_timeout=initialization_timeout,
    )
    if gloo_hostname is not None:
        _pin_gloo_hostname(gloo_hostname)


def _pin_gloo_hostname(hostname: str) -> None:
    # jax creates gloo collectives without a hostname; the only way to choose
    # the interface is to register the CPU backend factory ourselves.
    from jax._src import distributed as _dist
    from jax._src import xla_bridge
    from jax._src.lib import _jax

    def factory():
        coll = _jax.make_gloo_tcp_collectives(distributed_client=_dist.global_state.client, hostname=hostname)
        return xla_bridge.make_cpu_client(collectives=coll)

    xla_bridge.register_backend_factory("cpu", factory, priority=0, fail_quietly=False)


def broadcast_from_process0(tree: Any, *, is_source: bool | None = None) -> Any:
    """Process 0's values of ``tree`` on every process (host NumPy arrays).

    A collective: every process calls it with a tree of the same structure,
    shapes and dtypes (non-source processes may pass stale values or zeros).
    With one process it returns NumPy copies.

    Args:
      tree: pytree of arrays.
      is_source: whether this process provides the data (default: process 0).
    """
    from jax.experimental import multihost_utils

    return multihost_utils.broadcast_one_to_all(tree, is_source=is_source)


def broadcast_weight_sync(interval: int, placement: Placement = None, update_map: UpdateMap | None = None,
                          *, is_source: bool | None = None, donate: bool = True) -> WeightSync:
    """A :class:`~jaxweight.sync.WeightSync` whose fired copies come from process 0.

    Every process calls the hook in lockstep once per collected batch with
    ``(learner_params, actor_params)``; process 0 passes its live learner
    weights, the others pass any tree of the same shape (e.g. their actor
    params). On a fire the learner tree of process 0 is broadcast to all
    processes and placed on ``placement`` (default: this process's first local
    device); between fires each process keeps its actor copy. Counters are
    identical on all processes, so ``state_dict()`` may be saved from any.

    Example::

        hook = broadcast_weight_sync(4)
        for batch in range(n):
            actor = hook(learner if jax.process_index() == 0 else actor, actor)
    """
    dest = placement if placement is not None else jax.local_devices()[0]

    def transport(tree, where):
        host = broadcast_from_process0(tree, is_source=is_source)
        return jax.device_put(host, where if where is not None else dest)

    return WeightSync(interval, placement=dest, update_map=update_map, donate=donate, transport=transport)
