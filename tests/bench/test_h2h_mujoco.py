"""The MuJoCo head-to-head's measures and options (bench/bench_preference_h2h_mujoco.py), without running
either side: the time to a target fraction of a baseline, baselines read from an earlier results file, the
argument checks, and the bench command line passing a script's own options to its ``run``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import _common  # noqa: E402
import bench_preference_h2h_mujoco as h2h  # noqa: E402

pytestmark = pytest.mark.fast


def test_time_to_target_is_the_first_round_at_the_target_fraction_of_the_baseline():
    marks, returns = [10.0, 20.0, 30.0, 40.0], [5.0, 500.0, 805.0, 1000.0]
    # (805 - 5) / (1005 - 5) = 0.8: the third round is the first to reach it
    assert h2h.time_to_target(marks, returns, baseline=1005.0, random=5.0) == 30.0
    assert h2h.time_to_target(marks, returns, baseline=1005.0, random=5.0, target=0.4) == 20.0
    assert h2h.time_to_target(marks, [5.0, 6.0, 7.0, 8.0], baseline=1005.0, random=5.0) is None
    # a baseline no better than random defines no target
    assert h2h.time_to_target(marks, returns, baseline=5.0, random=5.0) is None


def test_side_normalises_against_a_given_baseline_instead_of_its_own():
    r = dict(round_return=[[5.0, 900.0], [5.0, 900.0]], round_s=[1.0, 2.0], baseline_returns=[None, None],
             random_returns=[0.0, 0.0], final_returns=[500.0, 500.0])
    side = h2h._side(r, 0, baseline=1000.0)
    assert side["final_normalised"] == pytest.approx(0.5) and side["time_to_target_s"] == 2.0
    assert side["baseline"] == 1000.0 and side["round_reward_gap"] is None
    # the per-round diagnostic: one list per seed for jaxweight's vmapped seeds, one list for imitation's
    assert h2h._side(dict(r, round_reward_gap=[[0.1, 0.2], [0.3, 0.4]]), 1, 1000.0)["round_reward_gap"] == [0.3, 0.4]
    assert h2h._side(dict(r, round_reward_gap=[0.1, 0.2]), 0, 1000.0)["round_reward_gap"] == [0.1, 0.2]


def test_recorded_baselines_reads_both_sides_per_seed(tmp_path):
    rows = [{"name": f"time to {h2h.TARGET} of the true-reward baseline, seed {i}",
             "imitation": {"baseline": 900.0 + i}, "jaxweight": {"baseline": 950.0 + i}} for i in range(2)]
    rows.append({"name": "whole loop (11 rounds), per seed"})
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(rows))
    assert h2h.recorded_baselines(path, 2) == {"imitation": [900.0, 901.0], "jaxweight": [950.0, 951.0]}
    with pytest.raises(ValueError, match="baselines_from.*seed 2"):
        h2h.recorded_baselines(path, 3)


def test_run_names_a_bad_input_norm_before_starting_anything():
    with pytest.raises(ValueError, match="input_norm"):
        h2h.run(input_norm="batch")


def test_bench_main_passes_a_scripts_own_options_to_run(monkeypatch, tmp_path, capsys):
    seen = {}

    def run(quick=False, seeds=1, input_norm="none", reward_norm=False, baselines_from=None,
            baseline_ceiling=False, parts=None):
        seen.update(quick=quick, seeds=seeds, input_norm=input_norm, reward_norm=reward_norm,
                    baselines_from=baselines_from, baseline_ceiling=baseline_ceiling, parts=parts)
        return []

    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", ["bench", "--quick", "--seeds", "3", "--input-norm", "tanh", "--reward-norm",
                                      "--baselines-from", "b.json", "--parts", "p", "--json", str(out)])
    _common.main(run, h2h._arguments)
    assert seen == dict(quick=True, seeds=3, input_norm="tanh", reward_norm=True, baselines_from="b.json",
                        baseline_ceiling=False, parts="p")
    assert json.loads(out.read_text()) == []
    monkeypatch.setattr(sys, "argv", ["bench", "--input-norm", "batch"])
    with pytest.raises(SystemExit):
        _common.main(run, h2h._arguments)
    assert "invalid choice" in capsys.readouterr().err


def test_jobs_start_each_seeds_two_sides_next_to_each_other():
    assert h2h._jobs(2) == [("imitation", 0), ("jaxweight", 0), ("imitation", 1), ("jaxweight", 1)]


class _Done:
    """A started worker that has finished (what ``finish`` reads), recording the core it ran on."""

    def __init__(self, job, core, log):
        log.append((job, core))
        self.args = ["python", "script", "--worker", job[0]]
        self.returncode = 0
        self.job = job

    def communicate(self, timeout=None):
        return json.dumps({"job": list(self.job)}) + "\n", None


def test_schedule_runs_every_job_once_at_most_one_per_core():
    started, finished = [], []
    jobs = h2h._jobs(3)
    h2h._schedule(jobs, [4, 7], lambda job, core: _Done(job, core, started),
                  lambda job, result: finished.append((job, tuple(result["job"]))))
    assert sorted(j for j, _ in started) == sorted(jobs)
    assert {c for _, c in started} <= {4, 7}
    assert [j for j, _ in started][:2] == jobs[:2]  # the first two start first, one per core
    assert sorted(finished) == sorted((j, j) for j in jobs)  # each result goes with its own job


def test_schedule_names_the_worker_that_failed():
    class Failed(_Done):
        def communicate(self, timeout=None):
            self.returncode = 1
            return "", "boom"

    with pytest.raises(RuntimeError, match="imitation seed 0"):
        h2h._schedule([("imitation", 0)], [None], lambda job, core: Failed(job, core, []), lambda j, r: None)


def test_run_names_bad_seeds_and_two_baseline_sources_before_starting_anything():
    with pytest.raises(ValueError, match="seeds"):
        h2h.run(seeds=0)
    with pytest.raises(ValueError, match="baseline_ceiling and baselines_from"):
        h2h.run(baseline_ceiling=True, baselines_from="b.json")
