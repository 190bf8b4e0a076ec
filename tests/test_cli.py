import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jaxweight import cli
from jaxweight._install import install_hint
from jaxweight.demos import _common as C

REPO = Path(__file__).resolve().parents[1]


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def test_usage_and_unknown_command(capsys):
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0
    assert "python -m jaxweight demo" in capsys.readouterr().out
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert _lines(err) == ["unknown command 'frobnicate': use 'demo' or 'bench' (python -m jaxweight --help)"]


def test_unknown_demo_is_one_line(capsys):
    assert cli.demo(["nope"]) == 2
    err = capsys.readouterr().err
    assert len(_lines(err)) == 1 and "unknown demo 'nope'" in err


def test_demo_help_lists_every_demo_with_its_description(capsys):
    assert cli.demo(["--help"]) == 0
    out = capsys.readouterr().out
    available = cli._available_demos()
    assert {"awr", "curriculum", "grpo", "preferences"} <= set(available)
    for name in available:
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(name + " "))
        assert cli.describe(name) in line and len(cli.describe(name)) > 10
    assert "demo NAME --help" in out
    assert cli.main(["demo", "--help"]) == 0


def test_describe_reads_the_docstring_without_importing(monkeypatch):
    monkeypatch.delitem(sys.modules, "jaxweight.demos.awr", raising=False)
    assert cli.describe("awr").startswith("Learn loss-component weights")
    assert "jaxweight.demos.awr" not in sys.modules


def _cpu_of_child(argv: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``python -m jaxweight ARGV`` and return it with the CPU seconds (user + system) it took."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run([sys.executable, "-m", "jaxweight", *argv], capture_output=True, text=True, timeout=60,
                         cwd=REPO, env={**os.environ, "JAXWEIGHT_CACHE_DIR": os.devnull})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return res, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@pytest.mark.parametrize("argv, fragment", [
    (["--seeds", "0"], "argument --seeds: must be an integer >= 1, got '0'"),
    (["--env", "mars"], "argument --env: must be 'cartpole', 'pendulum', 'gymnax:<id>' or 'brax:<name>', got 'mars'"),
    (["--port", "5"], "--port is the labelling page's: it needs --teacher human"),
])
def test_a_mistyped_preferences_flag_is_refused_within_a_second_of_cpu(argv, fragment):
    """The command line is checked before jax is imported: exit 2, one error line, < 1 s of CPU."""
    res, cpu = _cpu_of_child(["demo", "preferences", *argv])
    assert res.returncode == 2, res.stderr
    assert fragment in res.stderr and res.stderr.count("error:") == 1
    assert cpu < 1.0, f"{cpu:.2f} s of CPU before the refusal"


@pytest.mark.parametrize("name", ["awr", "curriculum", "grpo", "lm", "lm-countdown", "preferences"])
def test_every_demo_parser_is_built_without_jax(name):
    code = ("import sys; from jaxweight.demos import _args; "
            f"_args.parser({name!r}).format_help(); print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_lm_refusals_come_before_the_demo_runs(capsys):
    with pytest.raises(SystemExit) as e:
        cli.demo(["lm", "--train-seeds", "2", "--ablation-seeds", "3"])
    assert e.value.code == 2
    assert _lines(capsys.readouterr().err) == [
        "python -m jaxweight demo lm: error: --ablation-seeds must be at most --train-seeds (2), got 3"]
    with pytest.raises(SystemExit) as e:
        cli.demo(["lm", "--task", "countdown", "--arms", "nope"])
    assert e.value.code == 2 and "unknown 'nope'" in capsys.readouterr().err


def test_a_full_disk_ends_a_demo_with_one_line_and_the_last_checkpoint_whole(tmp_path, capsys, monkeypatch):
    """A demo whose second checkpoint write fails for want of space (the temp file written, the flush
    refused): one line naming the folder and what to do, exit 1, no temp file left, the first checkpoint
    whole. The demo is grpo's command line with a body that writes two checkpoints."""
    import errno
    import types

    import numpy as np

    from jaxweight import _util, checkpoint

    real_fsync = os.fsync

    def fsync(fd):
        if ".checkpoint.jwc." in os.readlink(f"/proc/self/fd/{fd}") and (tmp_path / "checkpoint.jwc").exists():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    def main(argv):
        for step in (1, 2):
            checkpoint.save(tmp_path / "checkpoint.jwc", {"w": np.full(1000, step)}, metadata={"step": step})
        return 0

    monkeypatch.setattr(_util.os, "fsync", fsync)
    monkeypatch.setitem(sys.modules, "jaxweight_test_disk_demo", types.SimpleNamespace(main=main))
    monkeypatch.setitem(cli.DEMOS, "grpo", "jaxweight_test_disk_demo")
    monkeypatch.setattr(cli, "_available_demos", lambda: list(cli.DEMOS))
    assert cli.demo(["grpo", "--out", str(tmp_path)]) == 1
    assert _lines(capsys.readouterr().err) == [
        f"python -m jaxweight demo grpo: error: no space left writing under {tmp_path}: free space or fix its "
        "permissions (or choose another --out), then run again"]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.jwc"]  # no temp file beside it
    assert checkpoint.load_metadata(tmp_path / "checkpoint.jwc")["step"] == 1


def test_os_error_line_of_a_demo_that_resumes_and_of_another_error():
    import errno

    e = OSError(errno.EROFS, "Read-only file system", "/x/out/checkpoint.jwc")
    assert cli.os_error_line("lm", e, "/x/out", resumes=True) == (
        "python -m jaxweight demo lm: error: read-only file system writing under /x/out (/x/out/checkpoint.jwc): "
        "free space or fix its permissions (or choose another --out), then run again with --resume: it goes on "
        "from the last good checkpoint")
    e = OSError(errno.EADDRINUSE, "Address already in use")
    assert cli.os_error_line("preferences", e, "o", resumes=True) == (
        "python -m jaxweight demo preferences: error: Address already in use (output folder o); run again with "
        "--resume: it goes on from the last good checkpoint")


def test_the_command_line_tables_match_the_demos():
    """What ``_args`` states of a demo's defaults is what the demo runs."""
    from jaxweight.demos import _args, grpo

    assert _args.GRPO_STEPS == (grpo.DemoConfig().steps, grpo.QUICK.steps)


def test_missing_demo_module_is_tolerated(monkeypatch, capsys):
    monkeypatch.setitem(cli.DEMOS, "ghost", "jaxweight.demos.no_such_demo")
    assert "ghost" not in cli._available_demos()
    assert cli.demo(["--help"]) == 0 and "ghost" not in capsys.readouterr().out
    assert cli.demo(["ghost"]) == 2
    assert "not available" in capsys.readouterr().err


def test_default_demo_is_the_preference_loop(monkeypatch):
    """`python -m jaxweight demo` with no name runs the preference-comparisons demo (the main job)."""
    assert cli.DEFAULT_DEMO == "preferences" and cli.DEFAULT_DEMO in cli.DEMOS
    seen = []

    class Fake:
        @staticmethod
        def main(argv):
            seen.append(argv)
            return 0

    monkeypatch.setattr(cli, "missing_extra", lambda name: None)
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: Fake if name == cli.DEMOS["preferences"] else None)
    assert cli.demo(["--quick"]) == 0 and seen == [["--quick"]]


def test_missing_extra_is_one_line_before_import(monkeypatch, capsys):
    monkeypatch.setitem(cli.DEMO_REQUIRES, "awr", {"no_such_pkg_xyz": "rl"})
    imported = []
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: imported.append(name))
    assert cli.demo(["awr", "--quick"]) == 1
    err = capsys.readouterr().err
    assert _lines(err) == [f"the awr demo needs no_such_pkg_xyz: {install_hint('rl')}"]
    assert imported == []


def test_install_hint_fits_where_jaxweight_came_from(monkeypatch, tmp_path):
    """A checkout gets an editable line (``.`` at its root, its path elsewhere), a wheel the index's."""
    import jaxweight._install as U

    root = Path(U.__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    assert install_hint("rl") == 'pip install -e ".[rl]"'
    monkeypatch.chdir(tmp_path)
    assert install_hint("rl") == f'pip install -e "{root}[rl]"'
    wheel = tmp_path / "site-packages" / "jaxweight"        # an installed wheel: no pyproject.toml beside it
    wheel.mkdir(parents=True)
    monkeypatch.setattr(U, "__file__", str(wheel / "_install.py"))
    assert install_hint("brax") == 'pip install "jaxweight[brax]"'


def test_preferences_demo_declares_gymnax():
    assert cli.DEMO_REQUIRES["preferences"] == {"gymnax": "rl"}


@pytest.mark.parametrize("name", ["awr", "curriculum", "grpo"])
def test_demo_name_help_shows_the_demo_options(name, capsys):
    if name not in cli._available_demos():
        pytest.skip(f"no {name} demo")
    with pytest.raises(SystemExit) as e:
        cli.demo([name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert f"python -m jaxweight demo {name}" in out and "--out" in out


@pytest.mark.parametrize("argv,fragment", [
    (["--steps", "0"], "argument --steps: must be an integer >= 1, got '0'"),
    (["--steps", "-1"], "argument --steps: must be an integer >= 1, got '-1'"),
    (["--seed", "-1"], "argument --seed: must be an integer >= 0, got '-1'"),
])
def test_grpo_demo_bad_flags_exit_2_with_one_line(argv, fragment, capsys, tmp_path):
    from jaxweight.demos import grpo

    with pytest.raises(SystemExit) as e:
        grpo.main(argv + ["--out", str(tmp_path / "o"), "--no-progress"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err
    assert len([ln for ln in _lines(err) if "error:" in ln]) == 1
    assert not (tmp_path / "o").exists()  # rejected before anything ran or was written


def test_grpo_demo_has_the_common_flags(capsys):
    from jaxweight.demos import grpo

    with pytest.raises(SystemExit) as e:
        grpo.main(["--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "(default jaxweight-out/grpo/)" in out
    for flag in ("--strict", "--tensorboard DIR", "--seed", "--quick", "--no-progress", "--steps"):
        assert flag in out


def test_compile_cache_dir_respects_xdg_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv("JAXWEIGHT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cli.compile_cache_dir() == tmp_path / "xdg" / "jaxweight" / "jax-compile"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cli.compile_cache_dir() == Path.home() / ".cache" / "jaxweight" / "jax-compile"
    monkeypatch.setenv("JAXWEIGHT_CACHE_DIR", str(tmp_path / "mine"))
    assert cli.compile_cache_dir() == tmp_path / "mine"


_CACHE_PROBE = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp
    from jaxweight import cli
    folder = None if sys.argv[1] == "off" else cli.enable_compile_cache()
    print(folder)
    jax.jit(lambda x: jnp.sin(x) * 3.0 + x.sum())(jnp.arange(7.0)).block_until_ready()
""")


@pytest.mark.slow
def test_persistent_compile_cache_second_run_compiles_nothing(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "XLA_FLAGS": ""}
    env.pop("JAXWEIGHT_CACHE_DIR", None)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    folder = tmp_path / "jaxweight" / "jax-compile"

    def run(mode):
        r = subprocess.run([sys.executable, "-c", _CACHE_PROBE, mode], env=env, capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert run("on") == str(folder)
    first = sorted(p.name for p in folder.iterdir())
    assert any("cache" in n for n in first)
    run("on")
    assert sorted(p.name for p in folder.iterdir()) == first   # nothing new compiled
    run("off")
    assert sorted(p.name for p in folder.iterdir()) == first


def test_no_compile_cache_flag_is_stripped(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "demo", lambda argv, compile_cache: seen.append((argv, compile_cache)) or 0)
    assert cli.main(["demo", "grpo", "--no-compile-cache", "--quick"]) == 0
    assert seen == [(["grpo", "--quick"], False)]
    assert cli.main(["demo", "grpo"]) == 0 and seen[-1] == (["grpo"], True)


def test_the_compile_cache_is_turned_on_only_after_the_arguments_pass(monkeypatch):
    import importlib

    enabled, ran = [], []
    monkeypatch.setattr(cli, "enable_compile_cache", lambda: enabled.append(1))
    real = importlib.import_module
    monkeypatch.setattr(cli.importlib, "import_module",
                        lambda m: type("M", (), {"main": staticmethod(lambda argv: ran.append(argv) or 0)})
                        if m == cli.DEMOS["grpo"] else real(m))
    with pytest.raises(SystemExit):
        cli.demo(["grpo", "--steps", "0"], compile_cache=True)
    assert enabled == [] and ran == []
    assert cli.demo(["grpo", "--steps", "3"], compile_cache=True) == 0
    assert enabled == [1] and ran == [["--steps", "3"]]


def test_bench_without_checkout_is_one_line(monkeypatch, capsys, tmp_path):
    def nope():
        raise cli.BenchNotFound(cli.BENCH_HINT)

    monkeypatch.setattr(cli, "find_bench_dir", nope)
    assert cli.bench(["--quick"]) == 2
    err = _lines(capsys.readouterr().err)
    assert len(err) == 1 and "JAXWEIGHT_BENCH_DIR" in err[0]


def test_find_bench_dir_env_and_checkout(monkeypatch, tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "_common.py").write_text("")
    monkeypatch.setenv("JAXWEIGHT_BENCH_DIR", str(tmp_path / "b"))
    assert cli.find_bench_dir() == (tmp_path / "b").resolve()
    monkeypatch.delenv("JAXWEIGHT_BENCH_DIR")
    monkeypatch.chdir(tmp_path)
    assert cli.find_bench_dir() == (REPO / "bench").resolve()


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    assert "python -m jaxweight demo" in readme
    out = subprocess.run(
        ["awk", '/<!-- ci:test-command -->/{f=1; next} f && /^```/{if (n++) exit; next} f{print}',
         str(REPO / "README.md")], capture_output=True, text=True, check=True).stdout.strip()
    assert out.startswith("python3 -m venv") and "pytest" in out
    assert "ci:test-command" in (REPO / ".ci" / "run").read_text()


@pytest.mark.slow
@pytest.mark.smoke
def test_bench_runner_quick_json(tmp_path):
    """Smoke: the bench runner runs one module's quick benchmark and writes the JSON records."""
    if not (REPO / "bench" / "bench_random_weighting.py").exists():
        pytest.skip("no random_weighting benchmark yet")
    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, "-m", "jaxweight", "bench", "--only", "random_weighting", "--quick",
                        "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "XLA_FLAGS": ""})
    assert r.returncode == 0, r.stderr
    recs = json.loads(out.read_text())
    assert recs and {"module", "name", "size", "jaxweight_s", "baseline", "baseline_s", "ratio", "device",
                     "jax_version"} <= set(recs[0])
    assert all(rec["module"] == "random_weighting" for rec in recs)


# ----------------------------------------------------------------------------- demos/_common.py

def _parser():
    p = argparse.ArgumentParser(prog="python -m jaxweight demo x")
    C.add_common_args(p, "x")
    p.add_argument("--steps", type=C.positive_int)
    p.add_argument("--n", type=C.nonneg_int)
    p.add_argument("--lr", type=C.positive_float)
    p.add_argument("--coef", type=C.nonneg_float)
    p.add_argument("--p", type=C.prob)
    p.add_argument("--q", type=C.open_prob)
    p.add_argument("--names", type=C.comma_list(["a", "b"]))
    return p


def test_common_args_defaults():
    a = _parser().parse_args([])
    assert a.out == "jaxweight-out/x/" and a.strict is False and a.tensorboard is None
    assert a.seed == 0 and a.quick is False and a.no_progress is False
    a = _parser().parse_args(["--steps", "3", "--lr", "1e-3", "--p", "1", "--q", "0.5", "--names", "a,b", "--n", "0"])
    assert (a.steps, a.lr, a.p, a.q, a.names, a.n) == (3, 1e-3, 1.0, 0.5, ["a", "b"], 0)


@pytest.mark.parametrize("argv,fragment", [
    (["--steps", "0"], "argument --steps: must be an integer >= 1, got '0'"),
    (["--steps", "2.5"], "argument --steps: must be an integer, got '2.5'"),
    (["--n", "-1"], "argument --n: must be an integer >= 0, got '-1'"),
    (["--seed", "-3"], "argument --seed: must be an integer >= 0, got '-3'"),
    (["--lr", "0"], "argument --lr: must be a number > 0.0, got '0'"),
    (["--lr", "nan"], "argument --lr: must be a finite number, got 'nan'"),
    (["--lr", "inf"], "argument --lr: must be a finite number, got 'inf'"),
    (["--coef", "-0.1"], "argument --coef: must be a number >= 0.0, got '-0.1'"),
    (["--p", "1.5"], "argument --p: must be a number in [0.0, 1.0], got '1.5'"),
    (["--q", "1"], "argument --q: must be a number in (0.0, 1.0), got '1'"),
    (["--names", "a,c"], "argument --names: unknown 'c'; choose from a, b"),
    (["--names", ","], "argument --names: needs at least 1 comma-separated entry"),
])
def test_bad_flag_values_exit_2_with_one_line(argv, fragment, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err
    assert len([ln for ln in _lines(err) if "error:" in ln]) == 1


def test_finish_exit_code(capsys):
    assert C.finish([("a", True), ("b", True)], strict=True) == 0
    assert C.finish([("a", True), ("b", False)], strict=False) == 0
    out = capsys.readouterr().out
    assert "[met] a" in out and "[NOT met] b" in out and "--strict" in out
    assert C.finish([("b", False)], strict=True) == 1


def test_require_extra(capsys):
    C.require_extra(["json", "os"], "rl")
    with pytest.raises(SystemExit) as e:
        C.require_extra(["json", "no_such_pkg_xyz"], "rl", "the preferences demo")
    assert e.value.code == f"the preferences demo needs no_such_pkg_xyz: {install_hint('rl')}"
    assert C.missing_modules("no.such.pkg") == ["no.such.pkg"]


def test_results_then_plot(tmp_path, monkeypatch):
    a = argparse.Namespace(out=str(tmp_path / "o"))
    import numpy as np

    p = C.write_results(a, {"x": np.arange(3), "y": np.float32(float("nan")), "z": [np.int64(4)]})
    saved = json.loads(p.read_text())
    assert {k: saved.pop(k) for k in ("x", "y", "z")} == {"x": [0, 1, 2], "y": None, "z": [4]}
    assert set(saved) == {"command", "commit", "machine", "date", "jax_version", "device"}  # C.provenance()
    pytest.importorskip("matplotlib")

    def fig(plt):
        f, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        return f

    png = C.save_plot(fig, tmp_path / "o" / "p.png")
    assert png is not None and png.read_bytes()[:4] == b"\x89PNG"


def test_save_plot_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    notes = []
    assert C.save_plot(lambda plt: 1 / 0, tmp_path / "p.png", log=notes.append) is None
    assert len(notes) == 1 and install_hint("plots") in notes[0]
    assert not (tmp_path / "p.png").exists()


def test_metrics_writer_jsonl_and_tensorboard(tmp_path):
    a = argparse.Namespace(out=str(tmp_path / "o"), tensorboard=None)
    with C.metrics_writer(a) as w:
        w.write(0, {"m/x": 1.0})
    assert json.loads((tmp_path / "o" / "metrics.jsonl").read_text()) == {"step": 0, "m/x": 1.0}
    pytest.importorskip("tensorboardX")
    a.tensorboard = str(tmp_path / "tb")
    with C.metrics_writer(a, append=True) as w:
        w.write(1, {"m/x": 2.0})
    assert len(_lines((tmp_path / "o" / "metrics.jsonl").read_text())) == 2
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir())


def test_timer_separates_compile_and_run():
    import jax
    import jax.numpy as jnp

    t = C.Timer()
    f = t.compile(jax.jit(lambda x: x * 2.0), jnp.ones(3))
    with t.section("run"):
        jax.block_until_ready(f(jnp.ones(3)))
    assert t["compile"] > 0 and t["run"] > 0
    assert set(t.as_dict()) == {"time/compile_s", "time/run_s"}
    assert t.summary().startswith("compile ") and ", run " in t.summary()


@pytest.mark.parametrize("name", sorted(cli.DEMOS))
@pytest.mark.parametrize("flag,where", [("--out", "file"), ("--out", "below_file"), ("--tensorboard", "file")])
def test_output_folder_that_is_a_file_exits_2_with_one_line_and_writes_nothing(name, flag, where, tmp_path, capsys):
    if name not in cli._available_demos() or cli.missing_extra(name):
        pytest.skip(f"the {name} demo is not available here")
    f = tmp_path / "results.json"
    f.write_text("keep me")
    path = f if where == "file" else f / "sub"
    argv = [name, flag, str(path), "--quick"] + (["--out", str(tmp_path / "o")] if flag != "--out" else [])
    with pytest.raises(SystemExit) as e:
        cli.demo(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = [ln for ln in _lines(err) if "error:" in ln]
    assert len(lines) == 1 and f"argument {flag}: must be a folder" in lines[0] and "Traceback" not in err
    assert f.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_bench_json_path_that_is_a_folder_exits_2_before_running(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.bench(["--json", str(tmp_path), "--only", "random_weighting"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --json: must be a file path, but" in err and "is an existing folder" in err
    assert list(tmp_path.iterdir()) == []
