"""Multi-device and multi-host helpers: meshes, data-parallel steps, global arrays.

Generic JAX machinery, no jaxweight concept: meshes and shardings (one named
``"data"`` axis), data parallelism (:func:`data_parallel_jit` for an unchanged
one-device step, :func:`data_parallel_grad` / :func:`data_parallel_train_step`
with ``shard_map`` and ``lax.pmean``), and several processes
(:func:`initialize_cpu_cluster`, :func:`shard_batch`, :func:`replicate`,
:func:`to_host`, :func:`broadcast_from_process0`). The same code runs on one
device, several devices and several processes. Guide: ``docs/guides/multihost.md``.

Example::

    import jax, jax.numpy as jnp, optax
    from jaxweight import distributed as dist

    def grad_fn(params, batch):                      # (params, batch shard) -> (grads, aux)
        loss, g = jax.value_and_grad(lambda p: jnp.mean((batch["x"] @ p - batch["y"]) ** 2))(params)
        return g, loss

    mesh, opt = dist.make_mesh(), optax.sgd(0.1)     # every device on axis "data"
    params = dist.replicate(jnp.zeros(3), mesh)
    step = dist.data_parallel_train_step(grad_fn, opt, mesh)
    batch = dist.shard_batch({"x": jnp.ones((8, 3)), "y": jnp.ones(8)}, mesh)
    params, opt_state, loss = step(params, opt.init(params), batch)
    assert float(loss) == 1.0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ._util import varying

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
    "initialize_cpu_cluster",
    "broadcast_from_process0",
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
        out = grad_fn(varying(params, axis_name), batch)
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

    In every process, first thing::

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
