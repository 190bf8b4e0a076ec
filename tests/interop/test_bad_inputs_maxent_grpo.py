"""Bad inputs for jaxweight.interop.maxent_grpo: malformed controller files, lenient meta payloads."""

import json
import math

import jax
import jax.numpy as jnp
import pytest

from jaxweight import maxent as M
from jaxweight._util import StateFileError
from jaxweight.interop import maxent_grpo as MG

S0 = M.init(M.config(0.5, 0.04))


# ---------------------------------------------------------------- malformed files
FILES = [
    ("missing_tau", '{"beta": 0.1}', "missing field 'tau'"),
    ("missing_beta", '{"tau": 0.5}', "missing field 'beta'"),
    ("tau_string", '{"beta": 0.1, "tau": "0.5"}', "field 'tau' must be a finite number"),
    ("beta_bool", '{"beta": true, "tau": 0.5}', "field 'beta' must be a finite number"),
    ("tau_negative", '{"beta": 0.1, "tau": -0.5}', "field 'tau' must be a finite number >= 0"),
    ("beta_nan", '{"beta": NaN, "tau": 0.5}', "field 'beta' must be a finite number"),
    ("top_level_list", "[1, 2]", "expected a JSON object"),
    ("meta_not_object", '{"beta": 0.1, "tau": 0.5, "meta": 3}', "field 'meta' must be an object"),
    ("truncated", '{"beta": 0.1, "tau": 0.', "not valid JSON"),
    ("empty", "", "empty file"),
    ("binary", b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not a text"),
]


@pytest.mark.parametrize("name, content, fragment", FILES, ids=[x[0] for x in FILES])
def test_malformed_controller_file(tmp_path, name, content, fragment):
    p = tmp_path / f"{name}.json"
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content)
    with pytest.raises(StateFileError, match=fragment) as e:
        MG.load_controller_state(p)
    assert str(p) in str(e.value)
    assert isinstance(e.value, ValueError)


def test_missing_controller_file_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        MG.load_controller_state(tmp_path / "nope.json")
    with pytest.raises(StateFileError, match="directory"):
        MG.load_controller_state(tmp_path)


def test_lenient_meta_payload_keeps_valid_config(tmp_path):
    """Unparsable or out-of-range meta fields keep their defaults (maxent_grpo's lenient rule)."""
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"beta": 0.1, "tau": 0.5, "meta": {"controller": {
        "learning_rate": -3, "tau_min": 2.0, "tau_max": 1.0, "update_interval": "x", "method": 7}}}))
    meta = MG.load_controller_file(p).meta
    assert float(meta.learning_rate) == 0.0 and float(meta.tau_max) == 0.0 and meta.update_interval == 1
    M.config(meta=meta)  # accepted


def test_batched_state_dict_refused():
    states = jax.vmap(lambda t: M.init(M.config(t)))(jnp.array([0.2, 0.5]))
    with pytest.raises(ValueError, match="not a batch"):
        MG.controller_state_dict(states)
    assert math.isfinite(MG.controller_state_dict(S0)["tau"])
