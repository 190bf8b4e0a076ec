"""The page in headless Chromium: a round labelled by keyboard, one by clicks, clip load times measured.

Skipped (with the reason) without selenium, Chromium or chromedriver; the label CI
step installs them and refuses skips.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow

from tests.label.conftest import Api, Asker, wait_for_round

WAIT_S = 30


def _obs(p: int, seed: int) -> np.ndarray:
    """CartPole-like fragments of 20 steps (21 frames): carts drifting, poles leaning."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, 21, dtype=np.float32)
    out = np.zeros((p, 2, 21, 4), np.float32)
    out[..., 0] = rng.uniform(-1.5, 1.5, (p, 2, 1)) * t
    out[..., 2] = rng.uniform(-1.0, 1.0, (p, 2, 1)) * t**2
    return out


def _ready(browser, key: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_element("id", "clips").get_attribute("data-ready") == key,
        message=f"pair {key} never became ready")


def _text(browser, element_id: str) -> str:
    return browser.find_element("id", element_id).text


def _wait_text(browser, element_id: str, needle: str) -> str:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, WAIT_S).until(lambda d: needle in _text(d, element_id),
                                         message=f"#{element_id} never said {needle!r}")
    return _text(browser, element_id)


def _clips_shown(browser) -> None:
    """Both visible images hold decoded 320 x 200 GIFs."""
    sizes = browser.execute_script(
        "return ['left', 'right'].map(id => { const i = document.getElementById(id);"
        " return [i.complete, i.naturalWidth, i.naturalHeight]; });")
    assert sizes == [[True, 320, 200], [True, 320, 200]]


def test_label_a_round_by_keyboard_then_one_by_clicks(browser, teacher, api):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    # round 0 by keyboard: every shortcut once
    keys = [Keys.ARROW_LEFT, Keys.ARROW_RIGHT, Keys.ARROW_UP, "s", "=", Keys.ARROW_DOWN]
    asker = Asker(teacher, 0, _obs(6, 0), np.array([0.8, 0.9, 0.5, 0.5, 0.5, 0.5], np.float32))
    wait_for_round(api, 0)
    browser.get(teacher.url)
    assert "pole upright" in _wait_text(browser, "goal", "pole")
    for i, key in enumerate(keys):
        _ready(browser, f"0/{i}")
        _clips_shown(browser)
        assert _text(browser, "progress-text") == f"Round 0: {i} of 6 labelled"
        ActionChains(browser).send_keys(key).perform()
    prefs, valid = asker.result()
    assert prefs.tolist() == [1.0, 0.0, 0.5, 0.5, 0.5, 0.5]
    assert valid.tolist() == [True, True, True, False, True, False]
    assert "Round 0 done (6 of 6)" in _wait_text(browser, "progress-text", "done")
    # pair 0: model 0.8 (left), person left; pair 1: model 0.9 (left), person right
    assert _text(browser, "accuracy") == "Reward model agrees with you on 1 of 2 pairs answered left or right (50%)"

    # round 1 by clicks: the page picks it up by itself
    buttons = ["btn-right", "btn-left", "btn-equal", "btn-skip"]
    asker = Asker(teacher, 1, _obs(4, 1), np.array([0.1, 0.2, 0.3, 0.4], np.float32))
    for i, button in enumerate(buttons):
        _ready(browser, f"1/{i}")
        _clips_shown(browser)
        browser.find_element("id", button).click()
    prefs, valid = asker.result()
    assert prefs.tolist() == [0.0, 1.0, 0.5, 0.5] and valid.tolist() == [True, True, True, False]
    _wait_text(browser, "progress-text", "Round 1 done (4 of 4)")
    assert _text(browser, "accuracy") == "Reward model agrees with you on 1 of 2 pairs answered left or right (50%)"

    stats = browser.execute_script("return window.labelStats")
    assert stats["answered"] == 10 and stats["errors"] == []
    lines = [json.loads(x) for x in teacher.log.path.read_text().splitlines()]
    assert [(x["round"], x["pair"], x["choice"]) for x in lines] == (
        [(0, i, c) for i, c in enumerate(["left", "right", "equal", "skip", "equal", "skip"])]
        + [(1, i, c) for i, c in enumerate(["right", "left", "equal", "skip"])])


def test_clip_load_times_are_measured(browser, teacher, api, record_property):
    """Measured, not asserted: the wait from asking for a pair's clips to both decoded (page-side timer),
    and each clip's request in the browser's Resource Timing (server render + transfer)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    p = 8
    asker = Asker(teacher, 3, _obs(p, 2))
    wait_for_round(api, 3)
    browser.get(teacher.url)
    for i in range(p):
        _ready(browser, f"3/{i}")
        _clips_shown(browser)
        ActionChains(browser).send_keys(Keys.ARROW_LEFT).perform()
    asker.result()
    loads = browser.execute_script("return window.labelStats.loads")
    entries = browser.execute_script(
        "return performance.getEntriesByType('resource').filter(e => e.name.includes('/clip/'))"
        ".map(e => ({name: e.name, duration: e.duration, size: e.encodedBodySize}));")
    assert [x["pair"] for x in loads] == list(range(p))
    assert len(entries) >= 2 * p and all(e["duration"] > 0 for e in entries)
    waits = np.array([x["ms"] for x in loads])
    clip_ms = np.array([e["duration"] for e in entries])
    record_property("pair_wait_ms_first", float(waits[0]))
    record_property("pair_wait_ms_median_rest", float(np.median(waits[1:])))
    record_property("clip_request_ms_median", float(np.median(clip_ms)))
    print(f"\n[label] clip load in Chromium: first pair {waits[0]:.1f} ms (rendered on request), next pairs "
          f"median {np.median(waits[1:]):.1f} ms / max {waits[1:].max():.1f} ms (prefetched); each clip request "
          f"median {np.median(clip_ms):.1f} ms / max {clip_ms.max():.1f} ms over {len(clip_ms)} requests, "
          f"{int(np.median([e['size'] for e in entries]))} bytes")


@pytest.mark.smoke
def test_screenshot_of_the_page_shows_both_clips(browser, teacher, api, tmp_path):
    """Smoke test: the page as a person sees it renders to a screenshot with both clips on it."""
    from PIL import Image

    asker = Asker(teacher, 0, _obs(2, 3), np.array([0.7, 0.3], np.float32))
    wait_for_round(api, 0)
    browser.get(teacher.url)
    _ready(browser, "0/0")
    path = tmp_path / "page.png"
    assert browser.save_screenshot(str(path))
    img = np.asarray(Image.open(path).convert("RGB"))
    assert img.shape[0] >= 600 and img.shape[1] >= 1000 and img.std() > 10
    for p in range(2):
        Api(teacher.url).label(0, p, "skip")
    asker.result()
