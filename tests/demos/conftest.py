"""tests/demos: test_countdown_stats.py needs statsmodels (the ``stats`` extra, kept out of ``.[all]``). Without
it the file is not collected (the main suite); CI installs the extra in its own step and runs it there, where
nothing may skip: ``pytest_step stats tests/demos/test_countdown_stats.py`` in .ci/run."""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("statsmodels") is not None else ["test_countdown_stats.py", "test_lm_study.py", "test_countdown_study.py"]
