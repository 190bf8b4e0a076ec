"""Helpers of the labelling-page tests: an HTTP client for the real server and headless Chromium.

The web stack (starlette, uvicorn) and the browser stack (selenium, chromium,
chromedriver) are the ``label`` extra and Debian packages; tests that need them
skip with the reason when they are absent (the main CI step), and the label CI
step installs them and refuses any skip.
"""

from __future__ import annotations

import http.client
import io
import json
import shutil
import threading
from typing import Any
from urllib.parse import quote, urlsplit

import numpy as np
import pytest


def gif_frames(gif: bytes) -> list[np.ndarray]:
    """The RGB frames of a GIF clip (PIL, imported here: the ``label`` extra)."""
    from PIL import Image

    im = Image.open(io.BytesIO(gif))
    out = []
    for i in range(im.n_frames):
        im.seek(i)
        out.append(np.asarray(im.convert("RGB")))
    return out


class Api:
    """Raw HTTP to a running teacher's server (http.client: every byte and header under the test's control)."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port
        self.token = parts.query.split("token=", 1)[1]

    def request(self, method: str, path: str, body: Any = None, *, token: str | None | bool = True,
                headers: dict | None = None) -> tuple[int, Any]:
        """``(status, JSON or bytes)``. ``body``: JSON-able (sent as JSON), bytes (raw) or an iterator
        of bytes (chunked, no Content-Length). ``token``: True the right one, a string that one, None none."""
        if token is True:
            token = self.token
        if token is not None:
            path += ("&" if "?" in path else "?") + "token=" + quote(token, safe="")
        if isinstance(body, (dict, list, int, float, str)):  # JSON; bytes go raw, an iterator chunked
            body = json.dumps(body).encode()
        chunked = body is not None and not isinstance(body, (bytes, bytearray))
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            hdrs = {"Content-Type": "application/json"} if body is not None else {}
            hdrs.update(headers or {})
            conn.request(method, path, body=body, headers=hdrs, encode_chunked=chunked)
            res = conn.getresponse()
            data = res.read()
            kind = res.getheader("content-type", "")
            return res.status, (json.loads(data) if kind.startswith("application/json") else data)
        finally:
            conn.close()

    def label(self, round_index: int, pair: int, choice: str, **kw) -> tuple[int, Any]:
        return self.request("POST", "/api/label", {"round": round_index, "pair": pair, "choice": choice}, **kw)

    def state(self) -> dict:
        status, data = self.request("GET", "/api/state")
        assert status == 200, data
        return data


class Asker:
    """``teacher.ask(...)`` on a thread; ``result()`` joins it and returns (or re-raises) what it gave."""

    def __init__(self, teacher, *args, **kwargs):
        self.out: dict[str, Any] = {}

        def run():
            try:
                self.out["value"] = teacher.ask(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - handed back to the test
                self.out["error"] = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, timeout: float = 60.0):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "ask() is still waiting"
        if "error" in self.out:
            raise self.out["error"]
        return self.out["value"]


def wait_for_round(api: Api, round_index: int, timeout: float = 30.0) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = api.state()
        if s["round"] == round_index:
            return s
        time.sleep(0.02)
    raise AssertionError(f"round {round_index} was not published within {timeout} s")


def random_obs(p: int, dim: int = 4, frames: int = 6, seed: int = 0) -> np.ndarray:
    """Random pairs a person would be asked about: small values, so CartPole's cart and pole stay in play, except
    that each pair's right pole falls at a random step (CartPole, ``dim=4``): the two clips differ in live steps."""
    rng = np.random.default_rng(seed)
    obs = (0.05 * rng.normal(size=(p, 2, frames, dim))).astype(np.float32)
    if dim == 4 and frames > 1:
        fall = rng.integers(1, frames, size=p)
        obs[:, 1, :, 2] += np.where(np.arange(frames)[None] >= fall[:, None], 1.0, 0.0).astype(np.float32)
    return obs


def pytest_collection_modifyitems(config, items):
    """Marks ``web`` every test here that needs the web stack (the ``web`` or ``browser`` fixture, or
    ``@pytest.mark.web`` where it skips inline): CI's label step runs only these (``-m web``), the rest
    having run with the whole suite."""
    here = __import__("pathlib").Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here) and {"web", "browser"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.web)


@pytest.fixture
def web():
    """Skip without the web stack (the label extra)."""
    pytest.importorskip("starlette", reason="needs the label extra (pip install -e '.[label]')")
    pytest.importorskip("uvicorn", reason="needs the label extra (pip install -e '.[label]')")


@pytest.fixture
def teacher(web, tmp_path):
    """A started cartpole :class:`HumanTeacher` on a fresh log, closed after the test."""
    from jaxweight.label import HumanTeacher

    t = HumanTeacher(tmp_path / "labels.jsonl", "cartpole", announce=None, poll_s=0.05, undo_s=0)
    t.start()
    yield t
    t.close()


@pytest.fixture
def api(teacher) -> Api:
    return Api(teacher.url)


def _browser_paths() -> tuple[str | None, str | None]:
    binary = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    return binary, shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium driven by Selenium with the system chromedriver (skips when absent)."""
    pytest.importorskip("starlette", reason="needs the label extra (pip install -e '.[label]')")
    pytest.importorskip("uvicorn", reason="needs the label extra (pip install -e '.[label]')")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the test extra)")
    from selenium.webdriver.chrome.service import Service

    binary, driver = _browser_paths()
    if binary is None or driver is None:
        pytest.skip("needs Chromium and chromedriver (apt-get install -y chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1100,820", "--disable-extensions", "--no-first-run"):
        opts.add_argument(arg)
    drv = webdriver.Chrome(service=Service(driver), options=opts)
    drv.set_page_load_timeout(30)
    yield drv
    drv.quit()
