"""Every demo's command line, built without importing jax, so that a mistyped flag is refused at once.

``python -m jaxweight demo NAME ...`` parses its arguments here before the demo (and jax) is
imported: a bad value ends with argparse's one line and exit status 2, a refused combination of
flags with one line ``python -m jaxweight demo NAME: error: ...`` and status 2, both within a
fraction of a second. The demo's ``main`` parses with the same parser and refuses the same
combinations, so calling it directly behaves the same.

The names a command line chooses from (agents, teachers, strategies, arms, pools) are defined
here, and the demos import them from here: one table, and no jax to load to read it.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import sys
from collections.abc import Callable
from typing import NamedTuple
from pathlib import Path

from jaxweight._install import install_hint

from . import _common as C

__all__ = ["AGENTS", "TEACHERS", "LABEL_MODULES", "ENV_BUILTINS", "ENV_FAMILIES", "STRATEGY_ORDER", "TASKS",
           "LM_ARM_FLAGS", "COUNTDOWN_SWEEP_TAUS", "CountdownArm", "COUNTDOWN_ARM_SETTINGS", "COUNTDOWN_DEFAULT_ARMS",
           "COUNTDOWN_POOLS", "COUNTDOWN_ARMS", "COUNTDOWN_SWEEP_ARMS", "GRPO_STEPS", "LM_ARMS", "LM_COMPARE_SEEDS", "doc_line", "parser",
           "split_task", "refusal", "parse"]

# ----------------------------------------------------------------------------- the names

#: preferences: the agents of ``--agent``: the loop's PPO, or SAC (``SACGenerator``, continuous actions only;
#: PEBBLE's agent, whose replay buffer is relabelled with every new reward model)
AGENTS = ("ppo", "sac")
#: preferences: who compares the fragments
TEACHERS = ("synthetic", "human")
#: preferences: the modules of the ``label`` extra that ``--teacher human`` needs
LABEL_MODULES = ("starlette", "uvicorn", "PIL")
#: preferences: the environment ids the demo resolves itself, and the families ``"<family>:<name>"``
ENV_BUILTINS = ("cartpole", "pendulum")
ENV_FAMILIES = ("gymnax", "brax")
#: curriculum: the strategies compared, in the table's order
STRATEGY_ORDER = ("uniform", "easy_first", "competence_based", "competence_sqrt", "prioritized")
#: lm: the tasks of ``--task``
TASKS = ("arithmetic", "countdown")
#: lm (arithmetic): what each arm turns on: (curriculum over buckets, MaxEnt weights, dynamic
#: sampling, SEED-GRPO, KL controller steering the loss's KL coefficient)
LM_ARM_FLAGS = {
    "full": (True, True, True, True, False),
    "grpo_uniform": (False, False, False, False, False),
    "grpo_curriculum": (True, False, False, False, False),
    "grpo_dynamic": (False, False, True, False, False),
    "maxent_uniform": (False, True, False, False, False),
    "full_kl_controller": (True, True, True, True, True),
    "full_no_maxent": (True, False, True, True, False),
    "full_no_curriculum": (False, True, True, True, False),
}
#: lm --task countdown: the taus of the sweep
COUNTDOWN_SWEEP_TAUS = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0)
class CountdownArm(NamedTuple):
    """lm --task countdown: one arm's settings (Dr.GRPO with each field at its default)."""

    xdr: bool = False            # xDr.GRPO aggregation weights (candidate_weights of U = A T / T_max)
    tau: float = 0.0             # their temperature
    seed: bool = False           # SEED-GRPO advantage scale
    entropy: bool = False        # token-entropy bonus (coefficient entropy_coef)
    classmean: bool = False      # xDr weights averaged within each reward class (the class-mean control)
    positive: bool = False       # positive_class_weights: the best class uniformly, 0 on the rest
    maxent: bool = False         # maxent.step's MaxEnt-GRPO sequence weights (signal G w - 1), tau controller on
    lr_scale: float = 1.0        # the Adam step times this (2: twice the learning rate)
    graded: bool = False         # the graded reward (partial credit by distance to the target)


#: lm --task countdown: arm -> its settings
COUNTDOWN_ARM_SETTINGS = {"drgrpo": CountdownArm(),
                          **{f"xdr_tau{t:g}": CountdownArm(xdr=True, tau=t) for t in COUNTDOWN_SWEEP_TAUS},
                          "seed_drgrpo": CountdownArm(seed=True),
                          "entropy_bonus": CountdownArm(entropy=True),
                          "xdr_classmean_tau0.05": CountdownArm(xdr=True, tau=0.05, classmean=True),
                          "positive_class": CountdownArm(positive=True),
                          "maxent_step": CountdownArm(maxent=True),
                          "drgrpo_lr2x": CountdownArm(lr_scale=2.0),
                          "drgrpo_lr4x": CountdownArm(lr_scale=4.0),
                          "drgrpo_graded": CountdownArm(graded=True),
                          "xdr_tau0.05_graded": CountdownArm(xdr=True, tau=0.05, graded=True),
                          "xdr_classmean_tau0.05_graded": CountdownArm(xdr=True, tau=0.05, classmean=True, graded=True)}
#: lm --task countdown: the study's arms: the baseline, xDr.GRPO at the paper's tau and its class-mean control
COUNTDOWN_DEFAULT_ARMS = ("drgrpo", "xdr_tau0.05", "xdr_classmean_tau0.05")
#: lm --task countdown: the problem pools: the paper's generator's filters, or targets up to 99
COUNTDOWN_POOLS = {"paper": {"target_max": 36, "number_targets": False},
                   "full": {"target_max": 99, "number_targets": True}}
#: grpo: training steps, default and quick (``DemoConfig().steps``, ``QUICK.steps``; a test checks them)
GRPO_STEPS = (300, 80)


# ----------------------------------------------------------------------------- the parsers

def doc_line(module: str, *, paragraph: bool = False) -> str:
    """The first line (or first paragraph) of the docstring of ``jaxweight.demos.<module>`` (``"lm._demo"``:
    a module of a package; ``"lm"``: the package's ``__init__``), read without importing it ("" when it
    cannot be read)."""
    path = Path(__file__).parent.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_name(path.name + ".py")
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError, ValueError):
        return ""
    return doc.split("\n\n")[0] if paragraph else doc.strip().split("\n")[0].strip()


def _prog(name: str) -> str:
    return f"python -m jaxweight demo {name}"


def _preferences() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=_prog("preferences"), description=doc_line("preferences"))
    C.add_common_args(ap, "preferences", quick_help="small version (about a minute of running)")
    ap.add_argument("--resume", action="store_true", help="continue a killed run from its last finished round")
    ap.add_argument("--resume-override", action="store_true",
                    help="with --resume: continue even if settings differ from the checkpoint's (changes are logged)")
    ap.add_argument("--env", default="cartpole", metavar="ENV",
                    help="cartpole (default), pendulum, gymnax:<id> (any gymnax environment, e.g. gymnax:Acrobot-v1) "
                         f"or brax:<name> (e.g. brax:inverted_pendulum; needs {install_hint('brax')})")
    ap.add_argument("--agent", default=None, choices=AGENTS,
                    help="the agent trained on the learned reward (and on the true one for the baseline): ppo or "
                         "sac (gymnax:/brax: ids with continuous actions). Default: per env, the one measured best "
                         "(sac on brax:inverted_pendulum, inverted_double_pendulum, halfcheetah, hopper, walker2d, "
                         "ant; ppo elsewhere)")
    ap.add_argument("--teacher", default="synthetic", choices=TEACHERS,
                    help="who compares the fragments: the synthetic teacher (default) or a person on a labelling "
                         f"page whose URL is printed (needs {install_hint('label')}; one seed, 16 rounds, "
                         "300 comparisons: 30, then 26 down to 13 a round; quick: 80)")
    ap.add_argument("--port", type=C.int_range(0, 65535), default=None, metavar="P",
                    help="with --teacher human: the labelling page's port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--idle", choices=("equal", "skip", "ask"), default=None,
                    help="with --teacher human: pairs with nothing to judge (both clips up for as many steps, e.g. "
                         "both fallen all along, or identical) are answered equal without asking (default), "
                         "skipped, or asked")
    ap.add_argument("--seeds", type=C.positive_int, default=None,
                    help="seeds run at once with jax.vmap (default 4, quick 2; --teacher human: 1)")
    ap.add_argument("--rounds", type=C.positive_int, default=None, metavar="K",
                    help="rounds after the initial one (num_iterations; default 10, quick 6; --teacher human: 15)")
    ap.add_argument("--comparisons", type=C.positive_int, default=None, metavar="N",
                    help="comparisons over the whole run (default 2000, quick 1000; --teacher human: 300, quick 80)")
    ap.add_argument("--timesteps", type=C.positive_int, default=None, metavar="N",
                    help="agent steps over the whole run (default 1e6, quick 6e5)")
    ap.add_argument("--fragment-length", type=C.positive_int, default=None, metavar="L",
                    help="steps per compared fragment (default 20)")
    ap.add_argument("--members", type=C.int_range(2), default=None, metavar="M",
                    help="reward ensemble size, >= 2 (default 3)")
    ap.add_argument("--reward-lr", type=C.positive_float, default=None, metavar="X",
                    help="reward-model learning rate (default 1e-3)")
    ap.add_argument("--agent-lr", type=C.positive_float, default=None, metavar="X",
                    help="the agent's learning rate, PPO's or SAC's (default 1e-3; brax ids and SAC 3e-4)")
    ap.add_argument("--baseline", dest="baseline", action="store_true", default=None,
                    help="train the agent on the true reward with the same steps (default: on, off with --quick)")
    ap.add_argument("--no-baseline", dest="baseline", action="store_false",
                    help="skip the agent on the true reward")
    return ap


def _awr() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=_prog("awr"), description=doc_line("awr"))
    C.add_common_args(ap, "awr", quick_help="small version (< 30 s)")
    ap.add_argument("--seeds", type=C.positive_int, default=None,
                    help="number of independent seeds, from --seed on (default 3, quick 1)")
    return ap


def _curriculum() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=_prog("curriculum"), description=doc_line("curriculum"))
    C.add_common_args(ap, "curriculum", quick_help="small pool and few steps (< 30 s)")
    ap.add_argument("--seeds", type=C.positive_int, default=None, help="runs per strategy (vmapped)")
    ap.add_argument("--strategies", type=C.comma_list(STRATEGY_ORDER), default=list(STRATEGY_ORDER),
                    help="comma-separated subset of " + ", ".join(STRATEGY_ORDER))
    return ap


def _grpo() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=_prog("grpo"), description=doc_line("grpo"))
    C.add_common_args(ap, "grpo", quick_help="small task and few steps (< 30 s)")
    ap.add_argument("--steps", type=C.positive_int, default=None,
                    help=f"training steps (default {GRPO_STEPS[0]}, quick {GRPO_STEPS[1]})")
    return ap


#: lm --compare: seeds per arm
LM_COMPARE_SEEDS = 3
#: lm --task countdown --study: the arms study's parts (``lm._countdown_study.PLAN``'s, by number)
STUDY_PARTS = ("0", "1", "2", "3")
#: lm: the quick run's and --compare's arms; the study adds the two full_no_* ablations
LM_ARMS = tuple(a for a in LM_ARM_FLAGS if not a.startswith("full_no_"))


def _lm() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=_prog("lm"), description=doc_line("lm._demo", paragraph=True))
    p.add_argument("--task", choices=TASKS, default="arithmetic",
                   help="arithmetic (default, this page's options) or countdown (ModeBench Countdown: "
                        "Dr.GRPO vs xDr.GRPO; `--task countdown --help` lists its options)")
    C.add_common_args(p, "lm", quick_help="tiny model and task, a few steps (a smoke run, < 1 min)")
    g = p.add_argument_group("lm demo options")
    g.add_argument("--compare", action="store_true",
                   help=f"the ablation: every arm x {LM_COMPARE_SEEDS} seeds (about "
                        f"{len(LM_ARMS) * LM_COMPARE_SEEDS // 2}x the default run's time), mean and 95%% interval")
    g.add_argument("--steps", type=C.positive_int, default=None, help="RL steps (default 1200)")
    g.add_argument("--seeds", type=C.positive_int, default=None, help="seeds per arm (default 1)")
    g.add_argument("--arms", type=C.comma_list(LM_ARM_FLAGS), default=None,
                   help=f"comma-separated arms (default full,grpo_uniform; all: {','.join(LM_ARM_FLAGS)})")
    g.add_argument("--prompts", type=C.positive_int, default=None, help="groups per update B (default 32)")
    g.add_argument("--sample-prompts", type=C.positive_int, default=None,
                   help="groups sampled per step P >= B; dynamic sampling keeps B (default 48)")
    g.add_argument("--generations", type=C.int_range(2, None), default=None,
                   help="completions per prompt G (default 8)")
    g.add_argument("--lr", type=C.positive_float, default=None, help="learner Adam learning rate")
    g.add_argument("--kl-coef", type=C.float_range(0.0, None), default=None,
                   help="the loss's KL coefficient (every arm but full_kl_controller; default 0.04)")
    g.add_argument("--temperature", type=C.positive_float, default=None, help="sampling temperature")
    g.add_argument("--sync-interval", type=C.positive_int, default=None,
                   help="learner -> actor sync every k steps (default 2)")
    g.add_argument("--replay", type=C.prob, default=None,
                   help="fraction of the curriculum arms' prompts from curriculum-chosen buckets (default 0.5)")
    g.add_argument("--eval-every", type=C.positive_int, default=None, help="evaluation period (default 100)")
    g.add_argument("--sft-steps", type=C.nonneg_int, default=None, help="warm-start steps (default 400)")
    g.add_argument("--train-seeds", type=C.positive_int, default=None,
                   help="the study: this many paired training runs of full vs grpo_uniform, in resumable parts "
                        "under --out/part-*/ and the pre-registered paired analysis in --out/study.json")
    g.add_argument("--part-seeds", type=C.int_range(2, None), default=4,
                   help="training seeds per part of the study (one vmapped run each; default 4)")
    g.add_argument("--ablation-seeds", type=C.nonneg_int, default=0,
                   help="the study's first N training seeds also train full_no_maxent and full_no_curriculum")
    g.add_argument("--resume", action="store_true", help="continue from --out/checkpoint.jwc if present")
    g.add_argument("--no-checkpoint", action="store_true", help="do not write checkpoint.jwc")
    return p


COUNTDOWN_ARMS = tuple(COUNTDOWN_ARM_SETTINGS)
#: lm --task countdown --sweep: xDr.GRPO at every tau, SEED, the entropy bonus and the control, beside Dr.GRPO
COUNTDOWN_SWEEP_ARMS = ("drgrpo", *(f"xdr_tau{t:g}" for t in COUNTDOWN_SWEEP_TAUS), "seed_drgrpo", "entropy_bonus",
                        "xdr_classmean_tau0.05")


def _countdown() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=_prog("lm --task countdown"),
                                description=doc_line("lm._countdown", paragraph=True))
    C.add_common_args(p, "lm-countdown", quick_help="tiny model and task, a few steps (a smoke run)")
    g = p.add_argument_group("countdown options")
    g.add_argument("--pool", choices=tuple(COUNTDOWN_POOLS), default=None,
                   help="the problem pool: paper (targets 1..36, none equal to a number; default) or full (1..99)")
    g.add_argument("--sweep", action="store_true",
                   help=f"the sweep's arms ({', '.join(COUNTDOWN_SWEEP_ARMS)}) instead of {', '.join(COUNTDOWN_DEFAULT_ARMS)}")
    g.add_argument("--arms", type=C.comma_list(COUNTDOWN_ARMS), default=None, help="comma-separated arms")
    g.add_argument("--steps", type=C.positive_int, default=None, help="RL steps (default 200)")
    g.add_argument("--train-seeds", type=C.positive_int, default=None, help="training seeds (default 3)")
    g.add_argument("--eval-seeds", type=C.positive_int, default=None, help="evaluation seeds (default 3)")
    g.add_argument("--prompts", type=C.positive_int, default=None, help="prompts per update B (default 32)")
    g.add_argument("--generations", type=C.int_range(2, None), default=None,
                   help="completions per prompt G (default 8)")
    g.add_argument("--lr", type=C.positive_float, default=None, help="Adam learning rate (default 3e-4)")
    g.add_argument("--sft-steps", type=C.nonneg_int, default=None, help="warm-start steps (default 400)")
    g.add_argument("--entropy-coef", type=C.float_range(0.0, None), default=None,
                   help="the entropy_bonus arm's coefficient (default 0.01)")
    g.add_argument("--study", action="store_true",
                   help="the arms study: its parts in order under --out (a finished part is kept, the rest run), "
                        "then study.json with the pre-registered analysis against the recorded 32-run study")
    g.add_argument("--study-parts", type=C.comma_list(STUDY_PARTS), default=None,
                   help="--study: the unfinished parts to run now, in this order, e.g. 3,2 (default: all, in order)")
    g.add_argument("--reference", default=None,
                   help="--study: the recorded 32-run study's results "
                        "(default bench/results/demo-lm-countdown-32seeds-cpu-2core.json)")
    return p


_PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "awr": _awr, "curriculum": _curriculum, "grpo": _grpo, "lm": _lm, "lm-countdown": _countdown,
    "preferences": _preferences}


def parser(name: str) -> argparse.ArgumentParser:
    """The command line of demo ``name`` (``"lm-countdown"``: ``demo lm --task countdown``)."""
    return _PARSERS[name]()


def split_task(argv: list[str] | None) -> tuple[str, list[str] | None]:
    """``demo lm``'s ``(--task, the other arguments)``: countdown has a command line of its own.

    A mistyped task is left in the arguments, for the arithmetic parser to refuse by name."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--task", default="arithmetic")
    known, rest = pre.parse_known_args(argv)
    if known.task == "countdown":
        return "countdown", rest
    return "arithmetic", argv


# ----------------------------------------------------------------------------- the refusals

def _env_refusal(env: str) -> str | None:
    """A ``--env`` of none of the accepted forms (the names inside a family are checked by the demo, which
    needs the family's package to list them)."""
    prefix, sep, _ = env.partition(":")
    if env in ENV_BUILTINS or (sep and prefix in ENV_FAMILIES):
        return None
    close = difflib.get_close_matches(env.lower(), ENV_BUILTINS, n=2, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"argument --env: must be 'cartpole', 'pendulum', 'gymnax:<id>' or 'brax:<name>', got {env!r}{hint}"


def refusal(name: str, args: argparse.Namespace) -> str | None:
    """The one line refusing a combination of demo ``name``'s flags, or None when they go together."""
    if name == "preferences":
        if args.resume_override and not args.resume:
            return "--resume-override needs --resume"
        bad_env = _env_refusal(args.env)
        if bad_env:
            return bad_env
        if args.port is not None and args.teacher != "human":
            return "--port is the labelling page's: it needs --teacher human"
        if args.idle is not None and args.teacher != "human":
            return "--idle is the labelling page's: it needs --teacher human"
        if args.teacher == "human":
            if args.seeds is not None and args.seeds > 1:
                return f"a person labels one run: --teacher human takes one seed, got --seeds {args.seeds}"
            missing = C.missing_modules(LABEL_MODULES)
            if missing:
                return C.extra_message("--teacher human", missing, "label")
    if name == "lm":
        if args.train_seeds is not None and (args.compare or args.seeds is not None or args.arms is not None):
            return "--train-seeds sets the seeds and arms itself; drop --compare/--seeds/--arms"
        if args.train_seeds is not None and args.ablation_seeds > args.train_seeds:
            return f"--ablation-seeds must be at most --train-seeds ({args.train_seeds}), got {args.ablation_seeds}"
    if name == "lm-countdown":
        if args.reference is not None and not args.study:
            return "--reference is the study's: it needs --study"
        if args.study_parts is not None and not args.study:
            return "--study-parts is the study's: it needs --study"
        if args.study:
            set_ = [f for f, v in (("--quick", args.quick), ("--sweep", args.sweep), ("--arms", args.arms),
                                   ("--train-seeds", args.train_seeds)) if v]
            if set_:
                return f"--study sets its arms and seeds itself (the defaults elsewhere); drop {'/'.join(set_)}"
    return None


def parse(name: str, argv: list[str] | None) -> argparse.Namespace:
    """``argv`` parsed by demo ``name``'s parser and checked by :func:`refusal`.

    A bad value exits with argparse's message (status 2); a refused combination exits with one line
    ``python -m jaxweight demo NAME: error: ...`` on stderr (status 2). jax is not imported.
    """
    ap = parser(name)
    args = ap.parse_args(argv)
    msg = refusal(name, args)
    if msg:
        print(f"{ap.prog}: error: {msg}", file=sys.stderr)
        raise SystemExit(2)
    return args
