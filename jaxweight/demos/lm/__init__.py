"""A small language model learns integer arithmetic or Countdown with GRPO: the whole jaxweight stack at once.

``python -m jaxweight demo lm`` runs the arithmetic task, ``python -m jaxweight demo lm --task countdown``
ModeBench Countdown (Dr.GRPO against xDr.GRPO). The package's names (:func:`run`, :func:`main`,
:class:`LMConfig`, :data:`QUICK`, :func:`make_task`, :func:`make_pipeline`, :class:`Parts`, ...) are the
arithmetic demo's, loaded on first use, so that importing one module of the package (a study's
analysis, the Countdown task) does not build the demo. The modules:

- ``_demo``               ``demo lm``: the arithmetic runs (one seed or ``--compare``), their results,
                          table and plot; ``main`` hands ``--task countdown`` to ``_countdown``
- ``_model``              the tiny causal transformer and its KV-cache sampler (both tasks)
- ``_task``               the arithmetic task: vocabulary, problem pool, held-out sets, rendering
- ``_pipeline``           the arithmetic settings, warm start and ONE jitted GRPO step
- ``_study``              the arithmetic study (``demo lm --train-seeds N``) and its pre-registered analysis
- ``_countdown``          ``demo lm --task countdown``: the runs, their evaluation, tables, plot and goals
- ``_countdown_task``     the Countdown task: problems and their modes, splits, tokens, the host and device verifiers
- ``_countdown_pipeline`` the Countdown arms, warm start and ONE jitted Dr.GRPO-family step
- ``_countdown_study``    the Countdown arms study (``demo lm --task countdown --study``) and its analysis
- ``_stats``              the statistics both studies use: the run-level paired analysis, summaries,
                          the paper's effect regression (statsmodels and scipy: the ``stats`` extra)

The two studies' analyses run over part files on record without the demo:
``python -m jaxweight.demos.lm._study FILE...`` and ``python -m jaxweight.demos.lm._countdown_study FILE...``.
"""

__all__ = ["LMConfig", "QUICK", "ARMS", "ARM_FLAGS", "Parts", "Task", "make_task", "warm_start", "Pipeline",
           "make_pipeline", "run", "main", "device_rewards", "device_cluster_ids", "pass_at_k", "COMPARE_SEEDS"]


def __getattr__(name):
    if name in __all__:
        from . import _demo

        return getattr(_demo, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
