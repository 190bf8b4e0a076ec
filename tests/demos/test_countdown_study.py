"""The Countdown arms study: its plan, the pairing check, the pre-registered answers and a tiny end-to-end study
(statsmodels and scipy: the ``stats`` extra)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from jaxweight.demos.lm import _countdown as D
from jaxweight.demos.lm import _countdown_pipeline as P
from jaxweight.demos.lm import _countdown_study as S

TINY = dataclasses.replace(P.QUICK, n_train=16, n_eval=8, sft_steps=2, sft_batch=8, d_model=16, d_ff=32, prompts=2,
                           generations=4, train_seeds=3, eval_seeds=1, eval_samples=8, steps=2, chunk=2)


def _fake(arms: dict, seeds: int, base_eval=0.1) -> dict:
    per = {"train": {"per_seed": {"pass_at_8": [0.2] * seeds}}, "eval": {"per_seed": {"pass_at_8": [base_eval] * seeds}}}
    return {"finished": True, "config": {"train_seeds": seeds, **{k: 0 for k in (
        "pool", "split_seed", "sft_steps", "sft_batch", "sft_lr", "d_model", "n_layers", "n_heads", "d_ff", "steps",
        "prompts", "generations", "lr", "eval_seeds", "eval_samples")}},
            "warm_start": {"base_policy": per},
            "arms": {a: {"per_seed": {k: list(v) for k in S.METRICS}} for a, v in arms.items()}}


@pytest.mark.fast
def test_plan_pairs_the_binary_parts_with_the_recorded_study_and_uses_known_arms():
    parts = S.plan()
    assert [p["part"] for p in parts] == [0, 1, 2, 3]
    assert tuple(parts[3]["arms"]) == S.REFERENCE_ARMS and parts[3]["train_seeds"] == 32
    assert all(a in P.ARMS for p in parts for a in p["arms"])
    assert {p["train_seeds"] for p in parts if p["pairs_with_reference"]} == {32}
    assert all(P.ARM_SETTINGS[a].graded for a in parts[2]["arms"]) and not parts[2]["pairs_with_reference"]
    assert {p["train_seeds"] for p in parts if p["part"] in S.BINARY_PARTS} == {32}
    for t, r, _ in S.COMPARISONS:
        assert t in P.ARMS and r in P.ARMS
    ref = json.loads(Path(S.REFERENCE).read_text())
    assert set(S.REFERENCE_ARMS) <= set(ref["arms"]) and ref["config"]["train_seeds"] == 32


@pytest.mark.fast
def test_answers_follow_the_registered_rules_and_a_failed_pairing_check_pairs_nothing():
    rng = np.random.default_rng(0)
    n = 12
    base = rng.uniform(0.2, 0.4, n)
    ref = _fake({"drgrpo": base, "xdr_tau0.05": base + 0.10 + rng.normal(0, 0.01, n),
                 "xdr_classmean_tau0.05": base + 0.15 + rng.normal(0, 0.01, n)}, n)
    p0 = _fake({"positive_class": base + 0.15 + rng.normal(0, 0.01, n),
                "maxent_step": base + 0.02 + rng.normal(0, 0.01, n)}, n)
    p1 = _fake({"drgrpo_lr2x": base + 0.05 + rng.normal(0, 0.01, n), "drgrpo_lr4x": base + rng.normal(0, 0.01, n)}, n)
    plan = S.plan()
    an = S.analyse([(plan[0], p0), (plan[1], p1)], ref)
    assert an["pairing_checks"] == {0: {"same_settings": True, "warm_starts_equal": True},
                                    1: {"same_settings": True, "warm_starts_equal": True}}
    c = an["comparisons"]["positive_class - xdr_classmean_tau0.05"]
    assert c["role"] == "mechanism check" and c["pass_at_8"]["runs"] == n
    # neither maxent_step nor xDr.GRPO beats the class-level arms; both larger steps fall short of them
    assert an["answers"] == {"question 1: a MaxEnt-specific term beats the class-level reweighting": "no",
                             "question 2: a larger Dr.GRPO step matches the class-level reweighting": "no"}
    assert not an["complete"] and an["finished_parts"] == [0, 1]
    # a larger step that closes the gap: question 2 is "yes"
    p1b = _fake({"drgrpo_lr2x": base + 0.15 + rng.normal(0, 0.01, n), "drgrpo_lr4x": base + rng.normal(0, 0.01, n)}, n)
    assert S.analyse([(plan[0], p0), (plan[1], p1b)], ref)["answers"][
        "question 2: a larger Dr.GRPO step matches the class-level reweighting"] == "yes"
    # other warm starts: nothing pairs with the recorded runs
    bad = _fake({"positive_class": base, "maxent_step": base}, n, base_eval=0.2)
    an = S.analyse([(plan[0], bad)], ref)
    assert an["pairing_checks"][0]["warm_starts_equal"] is False and an["comparisons"] == {}
    assert "maxent_step - drgrpo" in an["exploratory_vs_recorded"] and an["exploratory_note"]
    # part 3 re-runs the recorded arms on the study's warm starts: every binary comparison pairs within the study
    p3 = _fake({"drgrpo": base + 0.01, "xdr_tau0.05": base + 0.11, "xdr_classmean_tau0.05": base + 0.16}, n,
               base_eval=0.2)
    an = S.analyse([(plan[0], bad), (plan[3], p3)], ref)
    assert "part 3" in an["binary_pairs_from"] and an["exploratory_vs_recorded"] == {}
    c = an["comparisons"]["maxent_step - drgrpo"]
    assert c["pass_at_8"]["estimate"] == pytest.approx(-0.01)
    assert an["warm_starts_equal_to_part_3"] == {0: True, 3: True}
    # a binary part whose warm starts are not part 3's, exactly, pairs with nothing
    an = S.analyse([(plan[0], p0), (plan[3], p3)], ref)
    assert an["warm_starts_equal_to_part_3"] == {0: False, 3: True}
    assert "maxent_step - drgrpo" not in an["comparisons"] and "xdr_tau0.05 - drgrpo" not in an["comparisons"]
    # the forest plot: one panel per metric, one row per comparison
    import matplotlib.pyplot as plt

    an = S.analyse([(plan[0], p0), (plan[1], p1)], ref)
    fig = S.plot(plt, an)
    assert len(fig.axes) == len(S.METRICS) and len(fig.axes[0].get_yticks()) == len(an["comparisons"])
    plt.close(fig)


@pytest.mark.slow
def test_tiny_study_runs_its_parts_shares_the_warm_start_and_keeps_finished_parts(tmp_path, monkeypatch):
    ref_res = D.run(dataclasses.replace(TINY, arms=S.REFERENCE_ARMS))
    ref_res.pop("_state")
    ref_file = tmp_path / "ref.json"
    ref_file.write_text(json.dumps(ref_res))
    monkeypatch.setattr(S, "PLAN", tuple({**p, "train_seeds": 3} for p in S.PLAN if p["part"] != 2))
    lines = []
    # part 1 first: the order of the parts changes nothing in their results
    first = S.run_study(TINY, seed=0, out=tmp_path / "st", reference=ref_file, run=D.run, log=lines.append, parts=[1])
    assert first["analysis"]["finished_parts"] == [1] and not (tmp_path / "st" / "part-0").exists()
    study = S.run_study(TINY, seed=0, out=tmp_path / "st", reference=ref_file, run=D.run, log=lines.append)
    assert any("part 0: warm starts equal to part 1's: True" in ln for ln in lines)
    an = study["analysis"]
    assert an["complete"] and an["pairing_checks"] == {0: {"same_settings": True, "warm_starts_equal": True},
                                                        1: {"same_settings": True, "warm_starts_equal": True}}
    assert (tmp_path / "st" / "warm-start-3.jwc").exists()
    p0 = json.loads((tmp_path / "st" / "part-0" / "results.json").read_text())
    p1 = json.loads((tmp_path / "st" / "part-1" / "results.json").read_text())
    assert p0["warm_start"] == p1["warm_start"] == ref_res["warm_start"]
    assert "maxent_step - xdr_classmean_tau0.05" in an["comparisons"]
    assert (tmp_path / "st" / "study.json").exists()
    lines.clear()
    again = S.run_study(TINY, seed=0, out=tmp_path / "st", reference=ref_file, run=D.run, log=lines.append)
    assert [ln for ln in lines if "finished earlier" in ln] and again["analysis"]["comparisons"] == an["comparisons"]


@pytest.mark.fast
def test_study_flag_refuses_what_it_sets_itself(capsys):
    from jaxweight.demos import _args

    for extra in (["--quick"], ["--arms", "drgrpo"], ["--train-seeds", "4"], ["--sweep"]):
        with pytest.raises(SystemExit) as e:
            _args.parse("lm-countdown", ["--study", *extra])
        assert e.value.code == 2
        assert "--study sets its arms and seeds itself" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _args.parse("lm-countdown", ["--reference", "x.json"])
    assert "needs --study" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _args.parse("lm-countdown", ["--study-parts", "3"])
    assert "--study-parts is the study's: it needs --study" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _args.parse("lm-countdown", ["--study", "--study-parts", "3,7"])
    assert "unknown '7'" in capsys.readouterr().err
    assert _args.parse("lm-countdown", ["--study", "--study-parts", "3,2"]).study_parts == ["3", "2"]
    assert _args.STUDY_PARTS == tuple(str(p["part"]) for p in S.PLAN)
