"""A compact PPO agent (purejaxrl-style, flax + optax): config, hyperparameters, network, state and loss.

Used by :class:`~jaxweight.rl.ppo_agent.PPOAgent`. Every state
leaf has an explicit dtype and every continuous hyperparameter is an array
leaf (vmappable, never recompiles). Not rejax's PPO: rejax 0.1.3 keeps Python
scalars in its train state, bakes the learning rate into a static optimizer
and its rollouts drop the pre-reset final observation that fragments need.

Example::

    import jax, jax.numpy as jnp
    from jaxweight.rl.ppo import ActorCritic, PPOConfig, PPOHParams
    cfg, hp = PPOConfig(num_envs=2, num_steps=8), PPOHParams.create(learning_rate=3e-4)
    net = ActorCritic(action_dim=2, discrete=True, hidden_sizes=(8,))
    params = net.init(jax.random.key(0), jnp.zeros((1, 4)))
    logits, log_std, value = net.apply(params, jnp.zeros((3, 4)))
    assert logits.shape == (3, 2) and value.shape == (3,) and cfg.batch_size == 16

References:
  Schulman et al. 2017 (PPO, arXiv:1707.06347); purejaxrl (Lu et al. 2022).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax import struct

from .._util import check_value
from .normalization import ObsNorm, obs_norm_apply

__all__ = ["PPOConfig", "PPOHParams", "PPOState", "ActorCritic", "Transition", "orthogonal", "gae", "ADVANTAGES",
           "ppo_loss", "ppo_loss_fresh_gae", "split_unrolls", "adam_with_learning_rate", "set_learning_rate"]

Array = jax.Array


@struct.dataclass
class PPOConfig:
    """Structural PPO settings (static; changing them recompiles).

    Attributes:
      num_envs: parallel environments per update (E).
      num_steps: rollout length per environment per update (S); an update uses
        ``E * S`` transitions.
      num_minibatches: minibatches per epoch (must divide ``E * S``).
      update_epochs: passes over each rollout.
      hidden_sizes: MLP widths of the actor and of the critic.
      activation: ``"tanh"`` or ``"relu"`` (any ``flax.linen`` activation name).
      max_grad_norm: global-norm gradient clipping of actor and critic together
        (0.5); ``None``: no clipping (brax's PPO clips nothing).
      normalize_observations: keep running mean and variance of the observations
        in the agent state (:class:`ObsNorm`, updated with every rollout before
        the update, as brax's PPO) and feed the networks ``clip((obs - mean) /
        std, +-10)``; what MuJoCo-class observations (positions next to
        velocities of tens) need. Off by default (the built-in environments'
        runs are unchanged).
      reward_scaling: the rewards PPO learns from are multiplied by this
        (brax's ``reward_scaling``; 1.0 leaves them as they are). Static: a new
        value recompiles (a float leaf of :class:`PPOHParams` would change the
        layout of every saved loop state).
      init_log_std: initial value of the state-independent, learned
        ``log_std`` of continuous actions (0.0: std 1, as before; actions are
        clipped to the action space, so with ``[-1, 1]`` actions a std of 1
        puts about a third of the samples on the bounds; brax's tanh-squashed
        policy starts near 0.7 before the squashing).
      absorbing_bootstrap: training rollouts only, for a
        :class:`~jaxweight.rl.fixed_horizon.FixedHorizon` environment: when
        an environment enters its absorbing state, PPO ends the episode there and
        resets it, adding the discounted value of absorbing forever,
        ``gamma * r_abs / (1 - gamma)`` with ``r_abs`` the reward of an absorbing
        step (0 for the true reward; the learned reward of ``(terminal obs,
        action, terminal obs)``), instead of stepping through the rest of the
        horizon. The same objective as the absorbing MDP (up to the horizon's
        cut-off of that geometric sum), so a constant shift of a learned reward
        still changes nothing; but the agent learns from live steps instead of up
        to ``horizon`` absorbing ones per episode (brax's InvertedPendulum falls
        within ~10 of its 1000 steps at first). Samples for the teacher and
        evaluations still run the whole fixed horizon.
      tanh_squash: continuous actions only: the Gaussian is over pre-squash
        actions ``u`` (what the transitions store and the ratios use) and the
        environment gets ``low + (tanh(u) + 1) * (high - low) / 2`` instead of
        ``clip(u, low, high)``; the entropy bonus adds the tanh log-Jacobian at a
        reparameterised sample (brax's ``NormalTanhDistribution``). Off by default.
      value_hidden_sizes: MLP widths of the critic if not ``None`` (default:
        ``hidden_sizes``, as before; brax's PPO uses ``(256,) * 5``).
      state_dependent_std: continuous actions only: the policy's output layer
        also gives the std per state, ``softplus(raw) + 0.001`` (brax's PPO
        policy; about 0.69 at the start, so ``init_log_std`` is unused), instead
        of the state-independent ``log_std`` parameter. Off by default.
      policy_head_scale: scale of the orthogonal initialisation of the policy's
        output layer (0.01 by default, purejaxrl's; brax's PPO initialises it
        like its hidden layers, lecun-uniform, so its initial means are ~100x
        larger).
      skip_obs: the actor and the critic see ``obs[..., skip_obs:]`` (0: all of
        it; the observation normaliser still keeps statistics of every entry).
        For observations whose first entries are the current position, kept
        for a reward model (seals-style brax ids, :attr:`BraxEnv.positions
        <jaxweight.rl.brax_envs.BraxEnv.positions>`): the agent then
        sees brax's own observation. A position grows without bound over an
        episode, so a policy that sees it meets normalised inputs it never saw
        as the body moves on.
      gae_per_minibatch: brax's PPO: minibatches are whole unrolls (``num_envs /
        num_minibatches`` environments x ``num_steps`` steps each) and every
        minibatch recomputes its advantages and value targets with the current
        critic before its gradient step, instead of once per update with the
        rollout's critic. Off by default (needs ``num_envs`` to be a multiple
        of ``num_minibatches``).
      unroll_length: with ``gae_per_minibatch`` only: each environment's
        ``num_steps``-step rollout is cut into unrolls of this many steps, each
        bootstrapped from the observation after it, and minibatches draw whole
        unrolls of every environment (brax's PPO: ``unroll_length`` 20, 8 of
        them per environment and update on HalfCheetah). ``num_steps`` must be
        a multiple of it and ``num_envs * num_steps / unroll_length`` a
        multiple of ``num_minibatches``. ``None`` (default): one unroll of
        ``num_steps`` per environment.
      advantage: ``"gae"`` (default): generalised advantage estimates,
        ``A_t = sum_k (gamma * lambda)^k delta_{t+k}``. ``"lambda_return"``:
        brax's PPO, ``A_t = r_t + gamma * (1 - done_t) * G_{t+1} - V(s_t)``
        with ``G`` the lambda-returns (the value targets of both), which
        weighs ``delta_{t+1}`` by ``gamma`` instead of ``gamma * lambda``; the
        two agree at ``gae_lambda = 1``.
    """

    num_envs: int = struct.field(pytree_node=False, default=16)
    num_steps: int = struct.field(pytree_node=False, default=128)
    num_minibatches: int = struct.field(pytree_node=False, default=4)
    update_epochs: int = struct.field(pytree_node=False, default=4)
    hidden_sizes: tuple = struct.field(pytree_node=False, default=(64, 64))
    activation: str = struct.field(pytree_node=False, default="tanh")
    max_grad_norm: float | None = struct.field(pytree_node=False, default=0.5)
    normalize_observations: bool = struct.field(pytree_node=False, default=False)
    reward_scaling: float = struct.field(pytree_node=False, default=1.0)
    init_log_std: float = struct.field(pytree_node=False, default=0.0)
    absorbing_bootstrap: bool = struct.field(pytree_node=False, default=False)
    tanh_squash: bool = struct.field(pytree_node=False, default=False)
    value_hidden_sizes: tuple | None = struct.field(pytree_node=False, default=None)
    policy_head_scale: float = struct.field(pytree_node=False, default=0.01)
    state_dependent_std: bool = struct.field(pytree_node=False, default=False)
    skip_obs: int = struct.field(pytree_node=False, default=0)
    gae_per_minibatch: bool = struct.field(pytree_node=False, default=False)
    unroll_length: int | None = struct.field(pytree_node=False, default=None)
    advantage: str = struct.field(pytree_node=False, default="gae")

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps


@struct.dataclass
class PPOHParams:
    """Continuous PPO hyperparameters, all ``f32[]`` leaves (vmappable, never recompile).

    Attributes:
      learning_rate: Adam step size (default 1e-3).
      gamma, gae_lambda: discount and GAE lambda (0.99, 0.95).
      clip_eps: PPO ratio clipping (0.2).
      ent_coef, vf_coef: entropy bonus and value-loss weights (0.01, 0.5).
      vf_clip: if > 0, clip the value update to ``+-vf_clip`` around the
        rollout's values (purejaxrl clips with ``clip_eps``); 0 (default, as
        Stable-Baselines3) does not clip: clipping slows the critic badly when
        returns are large, as with a learned reward of unknown scale.
      anneal_steps: if > 0, the learning rate decays linearly from
        ``learning_rate`` to 0 over this many trained environment steps
        (purejaxrl's annealing); 0 keeps it constant (default).
    """

    learning_rate: Array
    gamma: Array
    gae_lambda: Array
    clip_eps: Array
    ent_coef: Array
    vf_coef: Array
    vf_clip: Array
    anneal_steps: Array

    @classmethod
    def create(cls, learning_rate=1e-3, gamma=0.99, gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01, vf_coef=0.5,
               vf_clip=0.0, anneal_steps=0.0):
        """Validated hyperparameters.

        Raises:
          ValueError: naming the value and its range: ``learning_rate``,
            ``clip_eps``, ``ent_coef``, ``vf_coef``, ``vf_clip``, ``anneal_steps``
            must be finite and >= 0; ``gamma`` and ``gae_lambda`` in [0, 1].
        """
        check_value(learning_rate, "learning_rate", ge=0.0)
        check_value(gamma, "gamma", ge=0.0, le=1.0)
        check_value(gae_lambda, "gae_lambda", ge=0.0, le=1.0)
        for name, v in (("clip_eps", clip_eps), ("ent_coef", ent_coef), ("vf_coef", vf_coef), ("vf_clip", vf_clip),
                        ("anneal_steps", anneal_steps)):
            check_value(v, name, ge=0.0)
        f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
        return cls(f(learning_rate), f(gamma), f(gae_lambda), f(clip_eps), f(ent_coef), f(vf_coef), f(vf_clip),
                   f(anneal_steps))

    def current_learning_rate(self, steps: Array) -> Array:
        """``f32[]`` learning rate after ``steps`` trained environment steps."""
        anneal = self.anneal_steps
        frac = jnp.clip(1.0 - steps.astype(jnp.float32) / jnp.where(anneal > 0, anneal, 1.0), 0.0, 1.0)
        return self.learning_rate * jnp.where(anneal > 0, frac, 1.0)


def adam_with_learning_rate(learning_rate: Any, *transforms: optax.GradientTransformation,
                            eps: float = 1e-8) -> optax.GradientTransformation:
    """``transforms`` (e.g. gradient clipping), then Adam, its learning rate a leaf of the optimizer state.

    ``optax.inject_hyperparams`` keeps the learning rate in the state, so the agents set it before
    every update (:func:`set_learning_rate`: PPO's annealing, a learning rate per seed under
    ``vmap``) and a new value never recompiles.

    Args:
      learning_rate: the initial value (replaced by :func:`set_learning_rate` before each use).
      *transforms: gradient transformations applied before Adam.
      eps: Adam's epsilon.
    """
    def make(learning_rate):
        return optax.chain(*transforms, optax.adam(learning_rate, eps=eps))

    return optax.inject_hyperparams(make)(learning_rate=learning_rate)


def set_learning_rate(opt_state: Any, learning_rate: Array) -> Any:
    """The state of :func:`adam_with_learning_rate` with its learning rate set to ``learning_rate`` (a copy)."""
    hyper = {**opt_state.hyperparams, "learning_rate": jnp.asarray(learning_rate, jnp.float32)}
    return opt_state._replace(hyperparams=hyper)


def orthogonal(scale: float = 1.0) -> Callable[[Array, Sequence[int], Any], Array]:
    """Orthogonal initializer (as ``flax.linen.initializers.orthogonal``) without LAPACK.

    The orthonormal factor of a Gaussian matrix comes from classical
    Gram-Schmidt with re-orthogonalisation (the ``Q`` of a QR decomposition
    with a positive ``R`` diagonal, i.e. Haar-distributed). jaxlib's batched
    LAPACK QR kernel schedules its batch on XLA's intra-op thread pool and can
    deadlock when two of them run at once on a 2-thread pool, which is what
    ``jax.vmap`` over seeds of a jitted ``init`` produces on a 2-core CPU.

    Returns:
      ``init(key, shape, dtype=f32) -> [*shape]`` whose last axis is the output
      axis (orthonormal rows or columns of the ``[prod(shape[:-1]), shape[-1]]``
      matrix, times ``scale``).
    """

    def init(key, shape, dtype=jnp.float32):
        n_rows, n_cols = int(np.prod(shape[:-1])), int(shape[-1])
        m, n = max(n_rows, n_cols), min(n_rows, n_cols)
        q = _orthonormal(key, m, n)
        if n_rows < n_cols:
            q = q.T
        return (scale * q).reshape(shape).astype(dtype)

    return init


@partial(jax.jit, static_argnums=(1, 2))
def _orthonormal(key: Array, m: int, n: int) -> Array:
    """``f32[m, n]`` (``m >= n``): Gram-Schmidt ``Q`` of a Gaussian matrix.

    Jitted so that it is traced once per shape: flax traces every initializer again
    (``jax.eval_shape``) at each ``apply`` to check the parameter shapes, and a
    loop traced afresh each time slows down the tracing of every program that
    applies the network.
    """
    a = jax.random.normal(key, (m, n), jnp.float32)

    def column(j, q):
        v = a[:, j]
        for _ in range(2):  # twice is enough in float32 ("twice is enough", Giraud et al. 2005)
            v = v - q @ (q.T @ v)
        return q.at[:, j].set(v / jnp.linalg.norm(v))

    return jax.lax.fori_loop(0, n, column, jnp.zeros((m, n), jnp.float32))


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs (purejaxrl initialisation).

    ``__call__(obs f32[..., D]) -> (out f32[..., A], log_std f32[A] | f32[..., A], value f32[...])``;
    ``out`` are logits (discrete) or the Gaussian mean (continuous; a
    state-independent ``log_std`` parameter, or with ``state_dependent_std``
    ``log(softplus(raw) + 0.001)`` from the same output layer; zeros for discrete).
    Both networks read ``obs[..., skip_obs:]``.
    """

    action_dim: int
    discrete: bool
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    init_log_std: float = 0.0
    value_hidden_sizes: Sequence[int] | None = None
    policy_head_scale: float = 0.01
    state_dependent_std: bool = False
    skip_obs: int = 0

    @nn.compact
    def __call__(self, obs):
        act = getattr(nn, self.activation)
        ortho = orthogonal
        obs = obs[..., self.skip_obs:]
        x = obs
        for h in self.hidden_sizes:
            x = act(nn.Dense(h, kernel_init=ortho(np.sqrt(2)), bias_init=nn.initializers.zeros)(x))
        scale_head = self.state_dependent_std and not self.discrete
        out = nn.Dense(self.action_dim * (2 if scale_head else 1), kernel_init=ortho(self.policy_head_scale),
                       bias_init=nn.initializers.zeros)(x)
        v = obs
        for h in (self.hidden_sizes if self.value_hidden_sizes is None else self.value_hidden_sizes):
            v = act(nn.Dense(h, kernel_init=ortho(np.sqrt(2)), bias_init=nn.initializers.zeros)(v))
        v = nn.Dense(1, kernel_init=ortho(1.0), bias_init=nn.initializers.zeros)(v)[..., 0]
        if self.discrete:
            log_std = jnp.zeros((self.action_dim,), jnp.float32)
        elif scale_head:
            out, raw = jnp.split(out, 2, axis=-1)
            log_std = jnp.log(jax.nn.softplus(raw) + 0.001)
        else:
            init = (nn.initializers.zeros if self.init_log_std == 0.0
                    else nn.initializers.constant(self.init_log_std))
            log_std = self.param("log_std", init, (self.action_dim,))
        return out, log_std, v


def _sample_action(key, out, log_std, discrete):
    if discrete:
        a = jax.random.categorical(key, out, axis=-1)
        return a.astype(jnp.int32)
    return out + jnp.exp(log_std) * jax.random.normal(key, out.shape, out.dtype)


def _log_prob_entropy(out, log_std, a, discrete):
    if discrete:
        logp_all = jax.nn.log_softmax(out, axis=-1)
        logp = jnp.take_along_axis(logp_all, a[..., None].astype(jnp.int32), axis=-1)[..., 0]
        ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
        return logp, ent
    var = jnp.exp(2 * log_std)
    logp = -0.5 * jnp.sum((a - out) ** 2 / var + 2 * log_std + jnp.log(2 * jnp.pi), axis=-1)
    ent = jnp.sum(0.5 + 0.5 * jnp.log(2 * jnp.pi) + jnp.broadcast_to(log_std, out.shape), axis=-1)
    return logp, ent


@struct.dataclass
class PPOState:
    """PPO train state (every leaf an array with an explicit dtype; what changes, no settings).

    The hyperparameters (:class:`PPOHParams`) come with every ``train`` call
    (the loop's config holds them).

    Attributes:
      params: actor-critic parameters.
      opt_state: optax state (:func:`adam_with_learning_rate`: the learning rate, gradient clipping, Adam moments).
      env_state: batched env state ``[E]`` of the training environments.
      obs: ``f32[E, D]`` current observations of the training environments.
      steps: ``i32[]`` environment steps trained so far.
      episodes: ``i32[]`` training episodes finished so far.
      obs_norm: :class:`ObsNorm` with ``PPOConfig.normalize_observations``, else
        ``None`` (no leaves: the state of a run without it is what it was).
    """

    params: Any
    opt_state: Any
    env_state: Any
    obs: Array
    steps: Array
    episodes: Array
    obs_norm: Any = None


@struct.dataclass
class Transition:
    obs: Array
    action: Array
    logp: Array
    value: Array
    reward: Array
    done: Array




ADVANTAGES = ("gae", "lambda_return")


def gae(traj: Transition, last_value: Array, hp: PPOHParams, advantage: str = "gae") -> tuple[Array, Array]:
    """Advantages and value targets of a ``[T, envs]`` rollout (scan backwards).

    ``last_value`` ``[envs]``: the values after the last step. ``advantage``: ``"gae"`` (generalised advantage
    estimates) or ``"lambda_return"`` (brax's: ``r_t + gamma * (1 - done_t) * G_{t+1} - V_t``); the value targets
    ``G`` are the lambda-returns in both. Returns ``(advantages, targets)``, each ``[T, envs]``.
    """
    def f(carry, t):
        adv, next_value = carry
        nonterm = 1.0 - t.done.astype(jnp.float32)
        delta = t.reward + hp.gamma * next_value * nonterm - t.value
        adv = delta + hp.gamma * hp.gae_lambda * nonterm * adv
        return (adv, t.value), adv

    _, adv = jax.lax.scan(f, (jnp.zeros_like(last_value), last_value), traj, reverse=True)
    targets = adv + traj.value
    if advantage == "lambda_return":  # Python branch on a static setting
        next_targets = jnp.concatenate([targets[1:], last_value[None]], axis=0)
        adv = traj.reward + hp.gamma * (1.0 - traj.done.astype(jnp.float32)) * next_targets - traj.value
    return adv, targets


def split_unrolls(traj: Transition, last_obs: Array, unroll_length: int) -> tuple[Transition, Array]:
    """Cut a ``[T, E]`` rollout into ``K = T / unroll_length`` unrolls per environment.

    Args:
      traj: the rollout, leaves ``[T, E, ...]``.
      last_obs: ``[E, ...]``, the observations after its last step.
      unroll_length: ``L``, a divisor of ``T``.

    Returns:
      ``(unrolls, bootstrap_obs)``: leaves ``[K * E, L, ...]`` (unroll ``k`` of environment ``e`` at row
      ``k * E + e``) and ``[K * E, ...]``, the observation after each unroll (the next unroll's first, or
      ``last_obs``).
    """
    t, e = traj.done.shape
    k = t // unroll_length

    def cut(x):
        x = x.reshape((k, unroll_length, e) + x.shape[2:])
        return jnp.swapaxes(x, 1, 2).reshape((k * e, unroll_length) + x.shape[3:])

    after = jnp.concatenate([traj.obs[unroll_length::unroll_length], last_obs[None]], axis=0)
    return jax.tree.map(cut, traj), after.reshape((k * e,) + after.shape[2:])


def ppo_loss_fresh_gae(network: nn.Module, discrete: bool, params: Any, traj: Transition, last_obs: Array,
                       hp: PPOHParams, obs_norm: ObsNorm | None = None, tanh_key: Array | None = None,
                       advantage: str = "gae") -> Array:
    """:func:`ppo_loss` of a ``[T, e]`` slice of whole unrolls, its advantages (:func:`gae`'s ``advantage``) and
    value targets recomputed with ``params``' critic (no gradient through them; brax's PPO). ``last_obs``
    ``[e, ...]``: the observations after the last step (bootstrap values)."""
    _, _, value = network.apply(params, obs_norm_apply(obs_norm, traj.obs))
    _, _, last_value = network.apply(params, obs_norm_apply(obs_norm, last_obs))
    adv, targets = gae(traj.replace(value=jax.lax.stop_gradient(value)), jax.lax.stop_gradient(last_value), hp,
                       advantage)
    flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), (traj, adv, targets))
    return ppo_loss(network, discrete, params, *flat, hp, obs_norm, tanh_key)


def _tanh_log_det_jacobian(u: Array) -> Array:
    """``log(1 - tanh(u)^2)`` computed stably (brax's ``TanhBijector``)."""
    return 2.0 * (jnp.log(2.0) - u - jax.nn.softplus(-2.0 * u))


def ppo_loss(network: nn.Module, discrete: bool, params: Any, batch: Transition, adv: Array, targets: Array,
             hp: PPOHParams, obs_norm: ObsNorm | None = None, tanh_key: Array | None = None) -> Array:
    """The clipped PPO objective (normalised advantages, optionally clipped value loss, entropy bonus).

    ``batch.obs`` are raw observations; ``obs_norm`` (if any) normalises them for the networks.
    """
    out, log_std, value = network.apply(params, obs_norm_apply(obs_norm, batch.obs))
    logp, ent = _log_prob_entropy(out, log_std, batch.action, discrete)
    if tanh_key is not None:  # entropy of the squashed policy: + E[log |d tanh(u) / du|], one reparameterised sample
        u = out + jnp.exp(log_std) * jax.random.normal(tanh_key, out.shape, out.dtype)
        ent = ent + jnp.sum(_tanh_log_det_jacobian(u), axis=-1)
    ratio = jnp.exp(logp - batch.logp)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - hp.clip_eps, 1 + hp.clip_eps) * adv).mean()
    v_clip = batch.value + jnp.clip(value - batch.value, -hp.vf_clip, hp.vf_clip)
    vf_loss = jnp.square(value - targets)
    vf_loss = jnp.where(hp.vf_clip > 0, jnp.maximum(vf_loss, jnp.square(v_clip - targets)), vf_loss)
    vf = 0.5 * vf_loss.mean()
    return pg + hp.vf_coef * vf - hp.ent_coef * ent.mean()
