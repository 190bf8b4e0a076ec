"""The arithmetic study (``demo lm --train-seeds``): parts, resume and the pre-registered analysis."""

from __future__ import annotations

import json

import numpy as np
import pytest
import statsmodels.api  # noqa: F401  (the extra the analysis needs; no skip: CI fails on a missing extra)

from jaxweight.demos import lm


def test_study_parts_resume_and_paired_analysis(tmp_path, capsys):
    """``--train-seeds``: parts of vmapped runs, a finished part never reruns, the analysis pairs by seed."""
    from jaxweight.demos.lm import _study

    prim, abl = ["full", "grpo_uniform"], ["full_no_maxent", "full_no_curriculum"]
    assert _study.plan(5, 2, 2) == [
        {"part": 0, "seed_offset": 0, "seeds": 2, "arms": prim}, {"part": 1, "seed_offset": 2, "seeds": 2, "arms": prim},
        {"part": 2, "seed_offset": 4, "seeds": 1, "arms": prim}, {"part": 3, "seed_offset": 0, "seeds": 2, "arms": abl}]
    argv = ["--quick", "--steps", "2", "--sft-steps", "1", "--eval-every", "2", "--out", str(tmp_path),
            "--no-progress", "--train-seeds", "4", "--part-seeds", "2", "--ablation-seeds", "2"]
    assert lm.main(argv) == 0
    st = json.loads((tmp_path / "study.json").read_text())
    an = st["analysis"]
    assert an["complete"] and an["pairs"] == 4 and an["ablations"]["full_no_maxent"]["runs"] == 2
    parts = [json.loads((tmp_path / f"part-{i}" / "results.json").read_text()) for i in (0, 1, 2)]
    d = [p["arms"]["full"]["per_seed"]["heldout_hard_accuracy_final"][i] - p["arms"]["grpo_uniform"]
         ["per_seed"]["heldout_hard_accuracy_final"][i] for p in parts[:2] for i in range(2)]
    assert an["primary"]["per_run"] == pytest.approx(d) and an["primary"]["estimate"] == pytest.approx(np.mean(d))
    assert set(parts[2]["arms"]) == {"full_no_maxent", "full_no_curriculum"}
    # the ablation part starts from part 0's warm starts: the same start accuracy, seed by seed
    k = "heldout_hard_accuracy_start"
    assert parts[2]["arms"]["full_no_maxent"]["per_seed"][k] == parts[0]["arms"]["full"]["per_seed"][k]
    e = an["ablations"]["full_no_maxent"]
    assert e["per_run"] == pytest.approx(np.subtract(parts[0]["arms"]["full"]["per_seed"]["heldout_hard_accuracy_final"],
                                                     parts[2]["arms"]["full_no_maxent"]["per_seed"]["heldout_hard_accuracy_final"]))
    capsys.readouterr()
    mtime = (tmp_path / "part-0" / "results.json").stat().st_mtime_ns
    assert lm.main(argv + ["--resume"]) == 0
    assert (tmp_path / "part-0" / "results.json").stat().st_mtime_ns == mtime
    assert json.loads((tmp_path / "study.json").read_text())["analysis"]["primary"] == an["primary"]
    # the analysis of the part files on record is the study's own (the first part alone: not complete, no claim)
    files = [tmp_path / f"part-{i}" / "results.json" for i in (0, 1, 2)]
    again = _study.analyse_files(files, train_seeds=4, part_seeds=2, ablation_seeds=2)
    assert again == an
    early = _study.analyse_files(files[:1], train_seeds=4, part_seeds=2, ablation_seeds=2)
    assert early["pairs"] == 2 and not early["complete"] and early["primary_claim"] is None
    with pytest.raises(ValueError, match="the plan has 3 parts, got 4 files"):
        _study.analyse_files(files + files[:1], train_seeds=4, part_seeds=2, ablation_seeds=2)
