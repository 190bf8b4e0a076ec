"""tests/rl: test_brax.py needs brax (the ``brax`` extra, kept out of ``.[all]``). Without brax it is
not collected (the main suite); CI installs the extra in its own step and runs it there, where nothing may skip:
``pytest_step brax tests/rl/test_brax.py`` in .ci/run."""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("brax") is not None else ["test_brax.py"]
