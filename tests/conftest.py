"""Shared fixtures. 8 fake CPU devices are set up before JAX is imported, so
multi-device tests can shard over them; single-device code is unaffected
(arrays land on device 0)."""

import os

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MPLBACKEND", "Agg")

# One persistent compilation cache for the whole run, shared by the xdist workers and the subprocesses
# tests start: a program that two workers, two tests or a test's fresh process build alike is compiled
# once (two compile-heavy files: 269 s -> 177 s on 2 cores). JAX's own cache, so every hit is the
# binary a compile would give. Made by the first process that loads this file (the xdist controller,
# before it starts the workers, which inherit the variable) and removed by it at the end; a folder the
# user chose ($JAX_COMPILATION_CACHE_DIR) is used as it is and kept.
_OWN_CACHE = None
if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    import tempfile

    _OWN_CACHE = tempfile.mkdtemp(prefix="jaxweight-test-compile-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402
import pytest  # noqa: E402


def _rss_bytes() -> int:
    """This process's resident memory (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


#: a worker above this many bytes after a test module drops JAX's compiled programs (see below)
RSS_LIMIT = int(os.environ.get("JAXWEIGHT_TEST_RSS_LIMIT", 2 << 30))


@pytest.fixture(scope="module", autouse=True)
def _drop_compiled_programs():
    """Every jitted program a test compiles stays cached in the worker for its lifetime: a worker of
    ``pytest -n 2`` held 4.4 GB a tenth of the way through the suite, and CI lost a worker near the end
    (tests/random_weighting + tests/sync in one process: 1.4 GB growing, 0.7 GB flat with the clearing).
    Above :data:`RSS_LIMIT` after a module, the caches are cleared (the next module compiles what it needs)."""
    yield
    if _rss_bytes() > RSS_LIMIT:
        import gc

        jax.clear_caches()
        gc.collect()


@pytest.fixture
def key():
    """A fresh typed PRNG key."""
    return jax.random.key(0)


@pytest.fixture(params=["eager", "jit"])
def jit_or_eager(request):
    """``lambda f: f`` or ``jax.jit``: run a test body both ways."""
    return (lambda f, **kw: f) if request.param == "eager" else jax.jit


@pytest.fixture
def devices8():
    """The 8 fake CPU devices (skips if the platform was initialised with fewer)."""
    devs = jax.devices()
    if len(devs) < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts")
    return devs[:8]


# The fast tier (``-m "not slow"``, <= 5 minutes on 2 cores): per package its contract and bad-input
# tests, one end-to-end smoke run per demo and the repository's own checks. These files are fast
# whole; elsewhere a test joins the tier with ``@pytest.mark.fast``. Every other test is also
# marked ``slow`` here and runs with the whole suite (what CI runs).
FAST_FILES = ("test_contract.py", "test_bad_inputs*.py", "test_layers.py", "test_readme.py",
              "test_results_registry.py", "test_packaging.py", "test_device_suite.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Marks ``slow`` every test outside the fast tier (above), and the eager twin of each
    ``jit_or_eager`` pair everywhere: it runs op by op (every primitive compiled on its own,
    several times the CPU time), while its jit twin stays in the tier."""
    import fnmatch

    for item in items:
        callspec = getattr(item, "callspec", None)
        eager = callspec is not None and callspec.params.get("jit_or_eager") == "eager"
        fast = item.get_closest_marker("fast") is not None or any(
            fnmatch.fnmatch(item.path.name, pat) for pat in FAST_FILES)
        if eager or not fast:
            item.add_marker(pytest.mark.slow)


# Where the suite's time goes, per test file (setup, call and teardown summed, over every xdist
# worker): printed at the very end of the run, after pytest's own summary, so that the tail of a CI
# log (all one sees of it) holds it. pytest's --durations lists single tests only.
_FILE_SECONDS: dict[str, float] = {}
PROFILE_FILES = 25


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + float(getattr(report, "duration", 0.0) or 0.0)


def pytest_unconfigure(config):
    if _OWN_CACHE is not None:  # set only in the process that made it (workers find the variable set)
        import shutil

        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
    if hasattr(config, "workerinput") or not _FILE_SECONDS:   # an xdist worker: the controller prints
        return
    total = sum(_FILE_SECONDS.values())
    top = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:PROFILE_FILES]
    lines = [f"test time per file (all phases, summed over workers): {total:.0f} s in {len(_FILE_SECONDS)} files;"
             f" the {len(top)} largest:"]
    lines += [f"  {s:7.1f} s  {100 * s / total:4.1f}%  {p}" for p, s in top]
    print("\n" + "\n".join(lines), flush=True)
