"""The preference-comparisons loop on the host (imitation's ``PreferenceComparisons.train``).

:class:`PreferenceComparisons` holds the settings (a
:class:`~jaxweight.preference.loop.LoopConfig` without a plan), builds the
run's config for its totals and runs the pure rounds of
:mod:`jaxweight.preference.loop` round by round, each as four compiled programs
(its phases; vmapped over ``num_seeds`` seeds when asked), compiled once on a
background thread and shared by every round. Between rounds it checks the horizons, reports through
``callback(round)`` and ``progress(round, num_rounds, metrics)``, and with
``checkpoint_dir`` saves the state after every round; ``resume=True``
continues a killed run bit-identically. Every setting that changes results is
fingerprinted in the checkpoint; a resume with other settings is refused with
the list of differences unless ``allow_changed`` is passed. With a host
teacher (``train(..., teacher=HumanTeacher(...))``, one run) a round's first
phase is two programs, ``collect_pairs`` and ``push``, and the teacher answers
on the host between them (both compiled once, like the other phases).

Example::

    import numpy as np
    from jaxweight.preference import Box, Discrete, RewardMLP, trajectories_from_arrays
    from jaxweight.preference.driver import PreferenceComparisons
    from jaxweight.preference.datasets import DatasetGenerator
    rng = np.random.default_rng(0)
    trajs = trajectories_from_arrays([rng.normal(size=(9, 2)) for _ in range(4)],
                                     [rng.integers(0, 2, 8) for _ in range(4)], [rng.normal(size=8)] * 4)
    net = RewardMLP(hidden_sizes=(4,), observation_space=Box((2,)), action_space=Discrete(2))
    pc = PreferenceComparisons(DatasetGenerator(trajs), net, 1, fragment_length=3, initial_epoch_multiplier=1.0)
    plan = pc.plan(0, 20)                         # pc.train(0, 0, 20) runs it; pc.run(0, 0, 20) in one program
    assert plan.schedule == (2, 18) and plan.capacity == 20
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from .. import checkpoint
from .._util import StateFileError, as_key, check_static_int, check_value, progress_bar
from . import _programs, loop
from .buffer import PreferenceBuffer
from .host_teacher import ask_teacher, check_teacher, teacher_kind
from .loop import VARIABLE_HORIZON_MESSAGE, LoopConfig, LoopPlan, LoopState, _jsonable, learned_reward_fn
from .trainer import RewardTrainer

try:  # the agent generators need gymnax (the ``rl`` extra); datasets and the loop itself do not
    from .generators import HostGenerator
except ImportError:  # pragma: no cover - exercised only without gymnax
    HostGenerator = ()

__all__ = ["PreferenceComparisons", "tqdm_progress", "CHECKPOINT_NAME", "COMPILER_OPTIONS"]

Array = jax.Array
logger = logging.getLogger("jaxweight.preference")

#: XLA options of the loop's programs on CPU, by program: LLVM at -O1 instead of -O2 compiles the
#: training phases about a quarter faster and runs them as fast; ``init`` (run once) and ``finish``
#: (an evaluation, ~1% of a round) compile at -O0, about 40% faster again (bench/bench_preference_loop.py)
COMPILER_OPTIONS: dict[str, dict[str, Any]] = {
    "init": {"xla_backend_optimization_level": 0},
    "collect": {"xla_backend_optimization_level": 1},
    "collect_pairs": {"xla_backend_optimization_level": 1},
    "push": {"xla_backend_optimization_level": 0},
    "fit_reward": {"xla_backend_optimization_level": 1},
    "fit_agent": {"xla_backend_optimization_level": 1},
    "finish": {"xla_backend_optimization_level": 0},
}


def _phase_program(phase: Callable) -> Callable:
    """``program(state, run_key, cfg, i, *parts)``: ``phase`` of round ``i`` with ``loop.round_key(run_key, i)``."""
    def program(state, run_key, cfg, i, *parts):
        return phase(state.replace(round=i), loop.round_key(run_key, i), cfg, *parts)
    program.__name__ = program.__qualname__ = phase.__name__.lstrip("_")  # the program's name in profiles
    return program


def _push(state, key, cfg, pairs, prefs, valid):
    """``loop._push`` as a phase (the key is not used: the teacher answered on the host)."""
    del key
    return loop._push(state, pairs, prefs, valid, cfg)


#: name -> program of each phase of a round (``finish`` takes the others' metrics); with a host
#: teacher ``collect_pairs`` (-> pairs, predicted, metrics) and ``push`` stand in for ``collect``
_PHASE_PROGRAMS = {name: _phase_program(f) for name, f in {
    **loop._PHASES, "finish": loop._finish, "collect_pairs": loop._collect_pairs, "push": _push}.items()}
#: the programs of a run, in order: with the synthetic teacher, and with a host teacher
_PROGRAMS = ("init", *loop._PHASES, "finish")
_HOST_TEACHER_PROGRAMS = ("init", "collect_pairs", "push", *list(loop._PHASES)[1:], "finish")
#: the extra arguments of a phase program, batched along the seed axis
_PARTS_AXES = {"finish": (0,), "push": (0, 0, 0)}


CHECKPOINT_NAME = "loop_state.ckpt"
_FINGERPRINT_VERSION = 5
_SETTINGS = loop._STATIC + tuple(loop._HPARAMS)

_ALLOW_VARIABLE_HORIZON_WARNING = (
    "Running with `allow_variable_horizon` set to True. Some algorithms are biased towards shorter or longer "
    "episodes, which may significantly confound results. Additionally, even unbiased algorithms can exploit "
    "the information leak from the termination condition, producing spuriously high performance. See "
    "https://imitation.readthedocs.io/en/latest/getting-started/variable-horizon.html for more information."
)


def _fields(prefix: str, obj: Any, names: Iterable[str]) -> dict[str, Any]:
    return {f"{prefix}/{n}": _jsonable(getattr(obj, n)) for n in names}


def _fingerprint_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``["name (checkpoint X, now Y)", ...]`` for every field that differs (sorted by name)."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, "<absent>"), new.get(k, "<absent>")
        if a != b:
            out.append(f"{k} (checkpoint {a!r}, now {b!r})")
    return out


def tqdm_progress(desc: str = "Preference comparisons") -> Callable[[int, int, dict], None]:
    """A ``progress(round, num_rounds, metrics)`` for :meth:`PreferenceComparisons.train`: a progress bar
    with the reward loss, accuracy and the agent's true return (host side)."""
    bar = None

    def progress(i: int, n: int, host: dict) -> None:
        nonlocal bar
        if bar is None:
            bar = progress_bar(n, desc, initial=i, unit="round", dynamic_ncols=True)
        bar.update(1)
        bar.set_postfix(_postfix(host))
        if i + 1 >= n:
            bar.close()

    return progress


def _postfix(host: dict) -> dict[str, str]:
    out = {"loss": f"{float(np.mean(host['reward_loss'])):.3f}",
           "acc": f"{float(np.mean(host['reward_accuracy'])):.3f}"}
    fresh, decided = np.asarray(host["fresh_accuracy"], np.float64), np.asarray(host["fresh_decided"]) > 0
    if np.any(decided) and np.all(np.asarray(host["round"]) > 0):
        out["new_acc"] = f"{float(np.mean(fresh[decided])):.3f}"
    if np.all(np.asarray(host["gt_episodes"]) > 0):
        out["return"] = f"{float(np.mean(host['gt_return'])):.1f}"
    return out


class PreferenceComparisons:
    """imitation's ``PreferenceComparisons``: the host driver of :mod:`jaxweight.preference.loop`.

    Args:
      generator: a pure trajectory generator (``init``, ``sample``, ``train``;
        optionally ``evaluate`` and ``trained_steps``): ``AgentGenerator`` or
        ``DatasetGenerator``. An ``AgentGenerator`` built without a
        ``reward_apply`` is bound to the learned reward (:func:`~jaxweight.preference.loop.learned_reward_fn`).
      reward_module: the reward network (e.g. :class:`~jaxweight.preference.RewardMLP`).
      num_iterations, fragment_length, transition_oversampling, initial_comparison_frac,
        initial_epoch_multiplier, comparison_queue_size, query_schedule,
        allow_variable_horizon, fragmenter, active_sample_factor,
        uncertainty_on, sample, normalize_agent_reward, eval_episodes,
        temperature, discount, threshold, alpha: the settings, see
        :class:`~jaxweight.preference.loop.LoopConfig` (``pc.config``; readable
        and settable as attributes, validated).
      reward_trainer: a :class:`~jaxweight.preference.RewardTrainer` for
        ``reward_module`` (default: a single net with imitation's defaults).
      progress: ``progress(round, num_rounds, metrics)`` called by :meth:`train`
        after every round, ``True`` for a progress bar (:func:`tqdm_progress`),
        or ``False``/``None`` (default: nothing is printed).

    Raises:
      ValueError: bad sizes or fractions, a trainer for another module, a
        generator without the pure protocol, fragments longer than every episode.
    """

    def __init__(
        self,
        generator: Any,
        reward_module: nn.Module,
        num_iterations: int,
        fragment_length: int = 100,
        transition_oversampling: float = 1,
        initial_comparison_frac: float = 0.1,
        initial_epoch_multiplier: float = 200.0,
        comparison_queue_size: int | None = None,
        query_schedule: str | Callable[[Any], Any] = "hyperbolic",
        allow_variable_horizon: bool = False,
        *,
        reward_trainer: RewardTrainer | None = None,
        fragmenter: str = "random",
        active_sample_factor: float = 4.0,
        uncertainty_on: str = "logit",
        temperature: float = 1.0,
        discount: float = 1.0,
        sample: bool = True,
        threshold: float = 50.0,
        alpha: float = 0.0,
        normalize_agent_reward: bool = True,
        eval_episodes: int = 8,
        progress: bool | Callable[[int, int, dict], Any] | None = None,
    ):
        if isinstance(generator, HostGenerator):
            raise ValueError("generator must be a pure generator, not a HostGenerator (pass HostGenerator.gen)")
        for name in ("init", "sample", "train"):
            if not callable(getattr(generator, name, None)):
                raise ValueError(
                    f"generator must be a pure generator with init/sample/train (e.g. AgentGenerator), "
                    f"got {type(generator).__name__} without {name!r}"
                )
        if reward_trainer is None:
            reward_trainer = RewardTrainer(reward_module)
        if not isinstance(reward_trainer, RewardTrainer):
            raise ValueError(f"reward_trainer must be a RewardTrainer, got {type(reward_trainer).__name__}")
        if reward_trainer.module != reward_module:
            raise ValueError("reward_trainer trains another module than reward_module")
        hp = dict(temperature=temperature, discount=discount, threshold=threshold, alpha=alpha)
        for name, rng in loop._HPARAMS.items():
            check_value(hp[name], name, **rng)
        if getattr(generator, "reward_apply", "absent") is None and hasattr(generator, "with_reward"):
            generator = generator.with_reward(learned_reward_fn(reward_module, reward_trainer.ensemble))
        cfg = LoopConfig(
            num_iterations=check_static_int(num_iterations, "num_iterations", 1),
            fragment_length=check_static_int(fragment_length, "fragment_length", 1),
            transition_oversampling=transition_oversampling, initial_comparison_frac=initial_comparison_frac,
            initial_epoch_multiplier=initial_epoch_multiplier, comparison_queue_size=comparison_queue_size,
            query_schedule=query_schedule, allow_variable_horizon=bool(allow_variable_horizon),
            fragmenter=fragmenter, active_sample_factor=active_sample_factor, uncertainty_on=uncertainty_on,
            sample=bool(sample), normalize_agent_reward=bool(normalize_agent_reward), eval_episodes=eval_episodes,
            generator=generator, reward_module=reward_module, trainer=reward_trainer.config,
            agent_hparams=getattr(generator, "hparams", None),
            **{k: jnp.asarray(v, jnp.float32) for k, v in hp.items()},
        )
        object.__setattr__(self, "config", cfg)
        if cfg.allow_variable_horizon:
            logger.warning(_ALLOW_VARIABLE_HORIZON_WARNING)
        self.progress = progress
        self.reward_module = reward_module
        self.reward_trainer = reward_trainer
        self.ensemble = reward_trainer.ensemble
        self.generator = generator
        self._check_generator()
        self._jit: dict = {}
        self.state: LoopState | None = None
        self.history: list[dict] = []
        self.overrides: list[dict] = []
        self._iteration = 0

    # -------------------------------------------------------------- settings
    def __getattr__(self, name: str) -> Any:
        # the settings live in ONE place, self.config; read them as attributes
        if name in _SETTINGS:
            return getattr(self.__dict__["config"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SETTINGS:  # validated by the config's constructor
            if name in loop._HPARAMS:
                check_value(value, name, **loop._HPARAMS[name])
                value = jnp.asarray(value, jnp.float32)
            object.__setattr__(self, "config", self.__dict__["config"].replace(**{name: value}))
            self.__dict__.get("_jit", {}).clear()
            if name == "fragment_length":
                self._check_generator()
            return
        object.__setattr__(self, name, value)

    def _check_generator(self) -> None:
        """No empty work: fragments must fit in the generator's episodes."""
        gen, cfg = self.generator, self.config
        horizons = getattr(gen, "horizons", None)
        if horizons is not None and len(set(horizons)) > 1 and not cfg.allow_variable_horizon:
            raise ValueError(VARIABLE_HORIZON_MESSAGE.format(horizons=sorted(set(horizons))))
        longest = getattr(gen, "max_length", None)
        if longest is None:
            longest = getattr(gen, "horizon", None)
        if longest is not None and cfg.fragment_length > int(longest):
            raise ValueError(
                f"fragment_length {cfg.fragment_length} is longer than the generator's episodes (at most "
                f"{int(longest)} steps): no fragment fits, so there would be no comparisons; use "
                f"fragment_length <= {int(longest)}"
            )

    def plan(self, total_timesteps: int, total_comparisons: int) -> LoopPlan:
        """The per-round schedule of a run (see :func:`~jaxweight.preference.loop.make_plan`)."""
        return loop.make_plan(self.config, total_timesteps, total_comparisons)

    def config_for(self, total_timesteps: int, total_comparisons: int) -> LoopConfig:
        """The :class:`~jaxweight.preference.loop.LoopConfig` of a run with these totals (the pure API's ``cfg``)."""
        return self.config.replace(plan=self.plan(total_timesteps, total_comparisons))

    def agent_reward(self, state: LoopState) -> loop.AgentReward:
        """The :class:`~jaxweight.preference.loop.AgentReward` the agent trains on after the last finished round."""
        return loop.agent_reward(state, self.config)

    # -------------------------------------------------------------- compiled programs
    @staticmethod
    def _keys(key: Any, num_seeds: int | None) -> tuple[Array, Array]:
        """``(init keys, run keys)``: the run key is the third part of each init key."""
        if num_seeds is None:
            k = as_key(key)
            return k, jax.random.split(k, 3)[2]
        keys = jax.random.split(as_key(key), check_static_int(num_seeds, "num_seeds", 1))
        return keys, jax.vmap(lambda k: jax.random.split(k, 3)[2])(keys)

    @staticmethod
    def _options(name: str) -> dict[str, Any] | None:
        return COMPILER_OPTIONS.get(name) if jax.default_backend() == "cpu" else None

    @staticmethod
    def _raw(name: str, batched: bool) -> Callable:
        """Program ``name`` unjitted: ``init`` or a phase of a round (``_PHASE_PROGRAMS``), vmapped when batched."""
        if name == "init":
            fn, axes = loop.init, (None, 0)
        else:
            fn, axes = _PHASE_PROGRAMS[name], (0, 0, None, None) + _PARTS_AXES.get(name, ())
        return jax.vmap(fn, in_axes=axes) if batched else fn

    def _fn(self, name: str, batched: bool):
        """The jitted program ``name`` (at its :data:`COMPILER_OPTIONS`)."""
        if (name, batched) not in self._jit:
            self._jit[(name, batched)] = jax.jit(self._raw(name, batched), compiler_options=self._options(name))
        return self._jit[(name, batched)]

    def _lower_phase(self, name: str, batched: bool, args: tuple, store: Any) -> tuple[Callable, Any]:
        """Lower phase ``name`` at ``args``: ``(compile() -> callable, the shapes of its outputs)``.

        With a program ``store`` ``(folder, fingerprint, sources)`` a phase
        returning ``(state, metrics)`` is loaded from it (no tracing) or traced,
        exported and stored; the compiled program is then a
        :class:`~jaxweight.preference._programs.FlatProgram`. (``collect_pairs``,
        which returns pairs, is not stored.)
        """
        if store is not None and name != "collect_pairs":
            folder, fingerprint, sources = store
            leaves, in_tree = jax.tree.flatten(args)
            avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
            opts = self._options(name)
            key = _programs.program_key(name, fingerprint, sources, in_tree, avals, opts)
            got = _programs.load(folder, key)
            if got is None:
                got = _programs.export_phase(self._raw(name, batched), args)
                if got is not None:
                    _programs.save(folder, key, *got)
            if got is not None:
                exported, names = got
                lowered = jax.jit(exported.call, compiler_options=opts).lower(*avals)
                state_tree = jax.tree.structure(args[0])
                out = exported.out_avals[state_tree.num_leaves:]
                shapes = {k: jax.ShapeDtypeStruct(a.shape, a.dtype) for k, a in zip(names, out)}
                return (lambda: _programs.FlatProgram(lowered.compile(), in_tree, state_tree, names)), (args[0], shapes)
        lowered = self._fn(name, batched).lower(*args)
        return lowered.compile, lowered.out_info

    def _store(self, plan: LoopPlan, num_seeds: int | None) -> tuple | None:
        """``(folder, fingerprint, sources)`` of the program store, or None where it is off."""
        folder = _programs.store_dir()
        if folder is None:
            return None
        gen = self.generator
        sources = _programs.source_hash([gen, getattr(gen, "env", None), getattr(gen, "base_env", None),
                                         self.reward_module])
        return None if sources is None else (folder, self.fingerprint(plan, num_seeds), sources)

    def _call(self, name: str, batched: bool, cfg: LoopConfig, *args):
        """Run program ``name`` (``init``: ``(keys,)``; a phase: ``(state, run_keys, i[, parts])``)."""
        if name != "init":  # the round index as i32[] (the compiled program's argument type)
            args = (args[0], args[1], jnp.asarray(args[2], jnp.int32), *args[3:])
        aot = self._jit.get(("aot", name, cfg.plan, batched))
        if aot is not None and not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)):
            try:
                compiled = aot.result()  # waits while it still compiles; re-raises its error
                return compiled(cfg, *args) if name == "init" else compiled(*args[:2], cfg, *args[2:])
            except TypeError:  # e.g. weak-typed leaves of a hand-built state: let jit specialise
                pass
        if name == "init":
            return self._fn("init", batched)(cfg, *args)
        return self._fn(name, batched)(args[0], args[1], cfg, *args[2:])

    def _round(self, batched: bool, cfg: LoopConfig, state: LoopState, run_keys: Array, i: int,
               teacher: Any = None):
        """Round ``i``: the three phase programs, then ``finish`` -> ``(state, out)`` (scalars per seed).

        With a host ``teacher``, ``collect`` is ``collect_pairs``, then
        ``teacher.ask`` on the host (the round's ``num_pairs`` pairs), then ``push``.
        """
        parts: dict[str, Array] = {}
        phases = list(loop._PHASES)
        if teacher is not None:
            pairs, predicted, parts = self._call("collect_pairs", batched, cfg, state, run_keys, i)
            prefs, valid = ask_teacher(teacher, i, cfg.plan.schedule[i], pairs, predicted, batched)
            state, out = self._call("push", batched, cfg, state, run_keys, i, pairs, prefs, valid)
            parts = {**parts, **out}
            phases = phases[1:]
        for name in phases:
            state, out = self._call(name, batched, cfg, state, run_keys, i)
            parts.update(out)
        return self._call("finish", batched, cfg, state, run_keys, i, parts)

    def compile(self, total_timesteps: int, total_comparisons: int, *, num_seeds: int | None = None,
                wait: bool = True, teacher: Any = None) -> None:
        """Compile ``init`` and the four programs of a round ahead of time (nothing to do once compiled).

        With a host ``teacher`` (only whether there is one matters) the round's
        programs are ``collect_pairs``, ``push``, ``fit_reward``, ``fit_agent``
        and ``finish`` instead.

        The programs are traced one after another here and compiled, at
        :data:`COMPILER_OPTIONS`, on a background thread as each is traced (XLA
        compiles without the GIL and already uses every core). :meth:`train`
        and :meth:`run` call it with ``wait=False``: round 0 starts as soon as
        ``init`` and its first phase are compiled, while the later phases
        still compile. Where JAX's persistent compilation cache is on, the
        phases are also stored traced (``jaxweight.preference._programs``),
        so a later run with the same settings and code neither traces nor
        compiles them.
        """
        check_teacher(teacher, num_seeds)
        cfg = self.config_for(total_timesteps, total_comparisons)
        batched = num_seeds is not None
        names = _PROGRAMS if teacher is None else _HOST_TEACHER_PROGRAMS
        if any(("aot", n, cfg.plan, batched) not in self._jit for n in names):
            keys, run_keys = self._keys(0, num_seeds)
            i32 = jax.ShapeDtypeStruct((), jnp.int32)
            pool = ThreadPoolExecutor(max_workers=1,
                                      thread_name_prefix="jaxweight-compile")
            store = self._store(cfg.plan, num_seeds)
            try:
                lowered = self._fn("init", batched).lower(cfg, keys)
                state = lowered.out_info
                self._jit[("aot", "init", cfg.plan, batched)] = pool.submit(lowered.compile)
                parts: dict[str, Any] = {}
                answers: tuple = ()
                for name in names[1:]:
                    extra = {"finish": (parts,), "push": answers}.get(name, ())
                    compile_fn, out = self._lower_phase(name, batched, (state, run_keys, cfg, i32) + extra, store)
                    if name == "collect_pairs":  # (pairs, predicted, metrics): push takes the pairs and answers
                        pairs, predicted, shapes = out
                        answers = (pairs, jax.ShapeDtypeStruct(predicted.shape, jnp.float32),
                                   jax.ShapeDtypeStruct(predicted.shape, jnp.bool_))
                    else:
                        shapes = out[1]
                    if name != "finish":
                        parts.update(shapes)
                    self._jit[("aot", name, cfg.plan, batched)] = pool.submit(compile_fn)
            finally:
                pool.shutdown(wait=False)
        if wait:
            for name in names:
                self._jit[("aot", name, cfg.plan, batched)].result()

    def init_run(self, key: Any, total_timesteps: int, total_comparisons: int, *,
                 num_seeds: int | None = None) -> LoopState:
        """The state :meth:`train` starts from: ``loop.init`` (jitted) of ``key``, or of ``num_seeds`` keys split from it."""
        cfg = self.config_for(total_timesteps, total_comparisons)
        return self._call("init", num_seeds is not None, cfg, self._keys(key, num_seeds)[0])

    def run(self, key: Any, total_timesteps: int, total_comparisons: int, *,
            num_seeds: int | None = None) -> tuple[LoopState, dict]:
        """The whole run in one call, no callbacks, no checkpoints; same programs, keys and results as :meth:`train`.

        (``jax.jit(loop.run)`` is the same run as one pure program.)

        Returns:
          ``(state, out)``, every metric with a trailing round axis ``K + 1`` (after the seed axis).
        """
        cfg = self.config_for(total_timesteps, total_comparisons)
        batched = num_seeds is not None
        self.compile(total_timesteps, total_comparisons, num_seeds=num_seeds, wait=False)
        keys, run_keys = self._keys(key, num_seeds)
        state = self._call("init", batched, cfg, keys)
        rows = []
        for i in range(cfg.plan.num_rounds):
            state, out = self._round(batched, cfg, state, run_keys, i)
            rows.append(out)
        return state, {k: jnp.stack([r[k] for r in rows], axis=-1) for k in loop.ROUND_METRICS}

    # -------------------------------------------------------------- fingerprint / resume
    def fingerprint(self, plan: LoopPlan, num_seeds: int | None = None, teacher: Any = None) -> dict[str, Any]:
        """Every setting that changes a run's results, as a flat JSON-ready ``{name: value}``.

        The plan, the seed count, the teacher (:func:`teacher_kind`: ``"synthetic"``
        or a host teacher's ``kind``, e.g. ``"human"``), the loop settings and
        hyperparameters, the reward model (module, trainer config and
        hyperparameters) and the generator (its ``fingerprint()``). Stored in
        every checkpoint; :meth:`train` compares it on resume.
        """
        tcfg = self.reward_trainer.config
        fp: dict[str, Any] = {"version": _FINGERPRINT_VERSION, "num_seeds": num_seeds, "teacher": teacher_kind(teacher)}
        fp.update(_fields("plan", plan, [f.name for f in dataclasses.fields(plan)]))
        fp.update(_fields("loop", self.config, _SETTINGS))
        fp.update(_fields("reward", tcfg, [f.name for f in dataclasses.fields(tcfg) if f.name != "module"]))
        fp["reward/module"] = repr(self.reward_module)
        reg = getattr(self.reward_trainer, "regularizer", None)
        fp["reward/regularizer"] = None if reg is None else repr(reg)
        gen_fp = self.generator.fingerprint() if hasattr(self.generator, "fingerprint") else {}
        fp["generator/type"] = type(self.generator).__name__
        fp.update({f"generator/{k}": _jsonable(v) for k, v in gen_fp.items()})
        return json.loads(json.dumps(fp))

    def check_checkpoint(
        self, checkpoint_dir: str | Path, total_timesteps: int, total_comparisons: int, *,
        num_seeds: int | None = None, allow_changed: bool | Iterable[str] = False, teacher: Any = None,
    ) -> list[str]:
        """What ``train(..., checkpoint_dir=..., resume=True)`` would say about the checkpoint, without training.

        Returns:
          The differing fields (``[]``: none, or no checkpoint), allowed by ``allow_changed``.

        Raises:
          ValueError: differing settings not allowed by ``allow_changed`` (listed).
          jaxweight.StateFileError: a corrupted, truncated or foreign checkpoint file.
        """
        ckpt = Path(checkpoint_dir) / CHECKPOINT_NAME
        if not ckpt.exists():
            return []
        cfg = self.config_for(total_timesteps, total_comparisons)
        keys, _ = self._keys(0, num_seeds)
        target = jax.eval_shape(self._fn("init", num_seeds is not None), cfg, keys)
        _, _, note = self._load(ckpt, self.fingerprint(cfg.plan, num_seeds, teacher), target, allow_changed,
                                quiet=True)
        return [] if note is None else list(note["changed"])

    def _load(self, ckpt: Path, fingerprint: dict, target: Any, allow_changed: bool | Iterable[str],
              quiet: bool = False):
        try:
            state, meta = checkpoint.load_with_metadata(ckpt, target)
            failed = None
        except checkpoint.CheckpointError as e:  # may be a shape change: report the fingerprint first
            state, failed = None, e
            meta = checkpoint.load_metadata(ckpt)
        old = meta.get("fingerprint")
        if not isinstance(old, dict) or "version" not in old:
            raise StateFileError(
                f"checkpoint {str(ckpt)!r} has no preference-loop fingerprint (written by something else or by an "
                "older jaxweight); use another checkpoint_dir or resume=False"
            )
        diff = _fingerprint_diff(old, fingerprint)
        changed = [d.split(" (", 1)[0] for d in diff]
        if diff:
            allowed = set(changed) if allow_changed is True else set(allow_changed or ())
            refused = [d for d, c in zip(diff, changed) if c not in allowed]
            if refused or failed is not None:
                hint = ("these change the shapes of the saved state, so it cannot be resumed; "
                        if failed is not None and not refused else "")
                raise ValueError(
                    f"checkpoint {str(ckpt)!r} belongs to another run: settings differ: {'; '.join(refused or diff)}. "
                    + hint + "Use another checkpoint_dir, resume=False, or allow_changed=True (demo: "
                    "--resume-override) to continue with the new values"
                )
            note = {"round": int(meta.get("rounds_done", 0)), "changed": diff}
            if quiet:
                return None, meta, note
            logger.warning("resuming %s with changed settings: %s", ckpt, "; ".join(diff))
            return state, meta, note
        if failed is not None:
            raise failed
        return state, meta, None

    # -------------------------------------------------------------- host driver
    def train(
        self,
        key: Any,
        total_timesteps: int,
        total_comparisons: int,
        callback: Callable[[int], None] | None = None,
        *,
        num_seeds: int | None = None,
        checkpoint_dir: str | Path | None = None,
        resume: bool = False,
        allow_changed: bool | Iterable[str] = False,
        progress: bool | Callable[[int, int, dict], Any] | None = None,
        teacher: Any = None,
    ) -> dict[str, Any]:
        """Run the loop on the host, round by round (imitation's ``train``; four compiled programs per round).

        Args:
          key: key or int seed of the run (split into ``num_seeds`` run keys when given).
          total_timesteps: agent steps over the whole run.
          total_comparisons: comparisons over the whole run.
          callback: called as ``callback(round)`` after every round; ``self.state``
            and ``self.history`` hold the round's results.
          num_seeds: run this many independent seeds at once (one vmapped program).
          checkpoint_dir: save the loop state after every round to
            ``checkpoint_dir/loop_state.ckpt`` (atomic; history, fingerprint and
            overrides in its metadata).
          resume: continue from the checkpoint in ``checkpoint_dir`` if there is one.
          allow_changed: resume even though these fingerprint fields (``True``: any)
            differ; the change is logged and kept in ``self.overrides`` and the checkpoint.
          progress: ``progress(round, num_rounds, metrics)`` after every round
            (default: the constructor's; ``True``: a progress bar).
          teacher: None for the synthetic teacher (the config's), or a host
            teacher such as :class:`jaxweight.label.HumanTeacher`: each round,
            ``teacher.ask(round, obs f32[n, 2, L+1, D], predicted f32[n]) ->
            (prefs f32[n], valid bool[n])`` answers the round's ``n`` pairs
            between the compiled programs ``collect_pairs`` and ``push``
            (``predicted``: the reward model's probability that the first
            fragment is preferred; ``valid`` False: skipped, stored but kept out
            of training). One run only (``num_seeds`` None or 1). Its kind is in
            the fingerprint: a resume with another teacher is refused unless allowed.

        Returns:
          ``{"reward_loss", "reward_accuracy"}`` of the last round (floats, or
          ``f32[num_seeds]``); per-round metrics are in ``self.history``.

        Raises:
          ValueError: the errors of :meth:`plan`; terminal episodes of different
            lengths without ``allow_variable_horizon`` (the round is not committed);
            a checkpoint whose fingerprint differs (the differing fields are listed);
            a host teacher with ``num_seeds > 1``, or whose answers are not
            ``(f32[n] in [0, 1], bool[n])``.
          jaxweight.StateFileError: a corrupted, truncated or foreign checkpoint file.
        """
        check_teacher(teacher, num_seeds)
        cfg = self.config_for(total_timesteps, total_comparisons)
        plan = cfg.plan
        batched = num_seeds is not None
        keys, run_keys = self._keys(key, num_seeds)
        progress = self.progress if progress is None else progress
        if progress is True:
            progress = tqdm_progress()
        fingerprint = self.fingerprint(plan, num_seeds, teacher)
        ckpt = None if checkpoint_dir is None else Path(checkpoint_dir) / CHECKPOINT_NAME
        history: list[dict] = []
        overrides: list[dict] = []
        state = None
        if resume and ckpt is not None and ckpt.exists():
            target = jax.eval_shape(self._fn("init", batched), cfg, keys)
            state, meta, note = self._load(ckpt, fingerprint, target, allow_changed)
            history = list(meta.get("history", []))
            overrides = list(meta.get("overrides", [])) + ([note] if note else [])
        # after the checkpoint checks: a refused resume compiles nothing
        self.compile(total_timesteps, total_comparisons, num_seeds=num_seeds, wait=False,  # no-op once compiled
                     teacher=teacher)
        if state is None:
            state = self._call("init", batched, cfg, keys)
        self.overrides = overrides
        start = int(np.max(np.asarray(jax.device_get(state.round))))
        self._iteration = start
        for i in range(start, plan.num_rounds):
            new_state, out = self._round(batched, cfg, state, run_keys, i, teacher)
            host = {k: np.asarray(v) for k, v in jax.device_get(out).items()}
            if bool(np.any(host["variable_horizon"])) and not cfg.allow_variable_horizon:
                hs = sorted({int(v) for v in np.ravel(host["horizon_min"])} | {int(v) for v in np.ravel(host["horizon_max"])})
                raise ValueError(VARIABLE_HORIZON_MESSAGE.format(horizons=hs))
            state = new_state
            history.append({k: v.tolist() for k, v in host.items()})
            if ckpt is not None:
                checkpoint.save(ckpt, state, metadata={"fingerprint": fingerprint, "history": history,
                                                       "rounds_done": i + 1, "overrides": overrides})
            self.state, self.history = state, history
            self._iteration = i + 1
            if progress:
                progress(i, plan.num_rounds, host)
            if callback is not None:
                callback(i)
        self.state, self.history = state, history
        last = history[-1]  # every plan has >= 2 rounds, and a finished checkpoint holds their history
        pick = (lambda v: np.asarray(v, np.float32)) if batched else (lambda v: float(v))
        return {"reward_loss": pick(last["reward_loss"]), "reward_accuracy": pick(last["reward_accuracy"])}

    @property
    def sample_labels(self) -> bool:
        """Whether the teacher samples Bernoulli labels (``config.sample``)."""
        return self.config.sample

    @property
    def dataset(self) -> PreferenceBuffer | None:
        """The comparison buffer of the last run (imitation's ``dataset``)."""
        return None if self.state is None else self.state.buffer
