"""jaxweight.interop.tunix without tunix: importing works, using tunix raises one line naming the extra.

Runs in the main suite (no tunix installed) and beside tunix (tunix hidden from the import system).
"""

import subprocess
import sys

import numpy as np
import pytest


def test_import_does_not_import_tunix_and_registry_free_parts_work():
    code = (
        "import sys, numpy as np\n"
        "from jaxweight import interop\n"
        "t = interop.tunix\n"
        "assert 'tunix' not in sys.modules, 'tunix imported at import time'\n"
        "a = t.GroupAdvantageEstimator()(np.array([1.0, 0.0, 2.0, 2.0]), 2)\n"
        "assert a.shape == (4,)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_missing_tunix_is_one_import_error_naming_the_extra(monkeypatch):
    from jaxweight.interop import tunix as jt

    for name in ("tunix", "tunix.rl", "tunix.rl.grpo"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r'pip install "jaxweight\[tunix\]"'):
        jt.register()
    with pytest.raises(ImportError, match=r"jaxweight\[tunix\]"):
        jt.maxent_policy_loss(None, None, algo_config=None, pad_id=0, eos_id=1)
    # the math needs no tunix
    assert np.asarray(jt.MaxEntAdvantageEstimator()(np.array([1.0, 0.0]), 2)).shape == (2,)
