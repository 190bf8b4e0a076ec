"""The page in headless Chromium: rounds labelled by keyboard and clicks, a double press, undo, where the run
is (preparing, finished, restarted), narrow windows; clip load times measured.

Skipped (with the reason) without selenium, Chromium or chromedriver; the label CI
step installs them and refuses skips.
"""

from __future__ import annotations

import re

import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow

from tests.label.conftest import Api, Asker, wait_for_round

WAIT_S = 30


def _obs(p: int, seed: int) -> np.ndarray:
    """CartPole-like fragments of 20 steps (21 frames): carts drifting, the left pole up, the right one falling
    (so the two differ in live steps: every pair is asked)."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, 21, dtype=np.float32)
    out = np.zeros((p, 2, 21, 4), np.float32)
    out[..., 0] = rng.uniform(-1.5, 1.5, (p, 2, 1)) * t
    out[:, 0, :, 2] = rng.uniform(-0.15, 0.15, (p, 1)) * t**2          # the left pole stays up ...
    out[:, 1, :, 2] = rng.choice([-1, 1], (p, 1)) * rng.uniform(0.5, 1.0, (p, 1)) * t**2   # ... the right one falls
    return out


def _ready(browser, key: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_element("id", "clips").get_attribute("data-ready") == key,
        message=f"pair {key} never became ready")


def _armed(browser) -> None:
    """The pair on screen takes answers: its first look (``min_look_ms``) is over."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element("id", "btn-left").is_enabled(),
                                         message="the buttons never became enabled")


def _shown(browser, element_id: str) -> bool:
    return browser.find_element("id", element_id).is_displayed()


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
        assert _text(browser, "progress-text") == f"Pair {i + 1} of 6 to judge"
        assert _text(browser, "where").startswith("Round 1")
        _armed(browser)
        ActionChains(browser).send_keys(key).perform()
    prefs, valid = asker.result()
    assert prefs.tolist() == [1.0, 0.0, 0.5, 0.5, 0.5, 0.5]
    assert valid.tolist() == [True, True, True, False, True, False]
    assert "Round 1 done" in _wait_text(browser, "progress-text", "done")
    # pair 0: model 0.8 (left), person left; pair 1: model 0.9 (left), person right
    assert _text(browser, "accuracy") == "Reward model agrees with you on 1 of 2 pairs answered left or right (50%)"

    # round 1 by clicks: the page picks it up by itself
    buttons = ["btn-right", "btn-left", "btn-equal", "btn-skip"]
    asker = Asker(teacher, 1, _obs(4, 1), np.array([0.1, 0.2, 0.3, 0.4], np.float32))
    for i, button in enumerate(buttons):
        _ready(browser, f"1/{i}")
        _clips_shown(browser)
        _armed(browser)
        browser.find_element("id", button).click()
    prefs, valid = asker.result()
    assert prefs.tolist() == [0.0, 1.0, 0.5, 0.5] and valid.tolist() == [True, True, True, False]
    _wait_text(browser, "progress-text", "Round 2 done")
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
        _armed(browser)
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


def _log(teacher) -> list[tuple[int, int, str]]:
    return [(x["round"], x["pair"], x["choice"]) for x in map(json.loads, teacher.log.path.read_text().splitlines())]


def test_a_double_press_within_100_ms_stores_one_label(browser, teacher, api):
    """The second press lands on the next pair's first look (min_look_ms = 400 by default): ignored."""
    import time

    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    asker = Asker(teacher, 0, _obs(4, 4))
    wait_for_round(api, 0)
    browser.get(teacher.url)
    for first, gap in ((0, 0.05), (1, 0.09), (2, 0.25)):
        _ready(browser, f"0/{first}")
        _armed(browser)
        ActionChains(browser).send_keys(Keys.ARROW_LEFT).pause(gap).send_keys(Keys.ARROW_RIGHT).perform()
        _ready(browser, f"0/{first + 1}")
        time.sleep(0.6)                                                 # long after the second press
        assert _log(teacher) == [(0, p, "left") for p in range(first + 1)], gap
    stats = browser.execute_script("return window.labelStats")
    assert stats["answered"] == 3 and stats["ignored"] >= 3 and stats["errors"] == []
    assert api.state()["answered"] == 3
    _armed(browser)
    ActionChains(browser).send_keys(Keys.ARROW_DOWN).perform()
    asker.result()


def test_the_last_answer_is_undone_by_key_and_by_button(browser, teacher, api):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    asker = Asker(teacher, 0, _obs(3, 5))
    wait_for_round(api, 0)
    browser.get(teacher.url)
    _ready(browser, "0/0")
    assert not _shown(browser, "undo-line")                             # nothing to undo yet
    _armed(browser)
    ActionChains(browser).send_keys(Keys.ARROW_LEFT).perform()
    _ready(browser, "0/1")
    assert _shown(browser, "undo-line") and "pair 1: left" in _text(browser, "undo-text")
    _armed(browser)
    ActionChains(browser).send_keys("u").perform()                     # by key: pair 0 comes back
    _ready(browser, "0/0")
    _armed(browser)
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform()
    _ready(browser, "0/1")
    _armed(browser)
    ActionChains(browser).send_keys(Keys.ARROW_UP).perform()
    _ready(browser, "0/2")
    _armed(browser)
    browser.find_element("id", "btn-undo").click()                     # by button: pair 1 comes back
    _ready(browser, "0/1")
    _armed(browser)
    browser.find_element("id", "btn-left").click()
    _ready(browser, "0/2")
    _armed(browser)
    browser.find_element("id", "btn-right").click()
    prefs, valid = asker.result()
    assert prefs.tolist() == [0.0, 1.0, 0.0] and valid.all()
    assert _log(teacher) == [(0, 0, "left"), (0, 0, "undone"), (0, 0, "right"), (0, 1, "equal"), (0, 1, "undone"),
                             (0, 1, "left"), (0, 2, "right")]
    assert browser.execute_script("return window.labelStats.undone") == 2


def test_preparing_then_between_rounds_then_finished_and_polling_stops(browser, teacher, api):
    """Before round 0 clips and buttons are truly hidden; a done round stops showing its last pair; the end is a
    screen with the results' path, after which the page asks the server nothing more."""
    import time

    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    teacher.set_plan([2, 2])
    teacher.board.set_phase("preparing", eta_s=40)
    browser.get(teacher.url)
    text = _wait_text(browser, "progress-text", "Preparing")
    assert "compiling" in text and "about" in text and " s left" in text
    for element in ("clips", "choices", "btn-left", "btn-right", "left", "right", "help", "undo-line", "final"):
        assert not _shown(browser, element), element
    assert browser.execute_script("return getComputedStyle(document.getElementById('clips')).display") == "none"
    assert "0 of 4 comparisons" in _text(browser, "where")

    asker = Asker(teacher, 0, _obs(2, 6))
    for i in range(2):
        _ready(browser, f"0/{i}")
        _armed(browser)
        ActionChains(browser).send_keys(Keys.ARROW_LEFT).perform()
    asker.result()
    text = _wait_text(browser, "progress-text", "Training")
    assert text.startswith("Round 1 done") and not _shown(browser, "clips") and not _shown(browser, "choices")
    assert "Round 1 of 2" in _text(browser, "where") and "2 of 4 comparisons" in _text(browser, "where")

    teacher.board.close_round()
    teacher.board.set_phase("evaluating", eta_s=80)                   # as measured by the run before
    text = _wait_text(browser, "progress-text", "Evaluating")
    assert re.search(r"Evaluating the agent, about (79|80) s left", text) and " 1 s left" not in _text(browser, "where")
    teacher.finish("run finished: results in /tmp/out/cartpole.json")
    _wait_text(browser, "final", "results in /tmp/out/cartpole.json")
    assert _text(browser, "progress-text") == "Run finished" and not _shown(browser, "clips")
    assert not _shown(browser, "accuracy")                            # the round's line goes with the round
    count = "return performance.getEntriesByType('resource').filter(e => e.name.includes('api/state')).length"
    before = browser.execute_script(count)
    time.sleep(2.5)
    assert browser.execute_script(count) == before                    # no more polling


def test_an_outdated_tab_says_the_server_restarted(browser, web, tmp_path):
    """A fresh run (new token) on the same port: the open tab says to open the new URL; a reload says so too."""
    from jaxweight.label import HumanTeacher

    old = HumanTeacher(tmp_path / "a.jsonl", "cartpole", announce=None)
    url = old.start()
    browser.get(url)
    _wait_text(browser, "progress-text", "Preparing")
    port = old.server.port
    old.close()
    new = HumanTeacher(tmp_path / "b.jsonl", "cartpole", announce=None, port=port)
    try:
        new.start()
        assert new.token != old.token
        text = _wait_text(browser, "final", "restarted")
        assert "open the new URL printed in the terminal" in text
        assert browser.execute_script("return document.body.dataset.phase") == "outdated"
        browser.refresh()
        assert "open the new url printed in the terminal" in browser.find_element("tag name", "body").text.lower()
    finally:
        new.close()


def test_a_resumed_run_keeps_the_token_so_the_open_tab_goes_on(browser, web, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    from jaxweight.label import HumanTeacher

    obs = _obs(3, 7)
    first = HumanTeacher(tmp_path / "labels.jsonl", "cartpole", announce=None, keep_address=True, undo_s=0)
    url = first.start()
    asker = Asker(first, 0, obs)
    browser.get(url)
    _ready(browser, "0/0")
    _armed(browser)
    ActionChains(browser).send_keys(Keys.ARROW_LEFT).perform()
    _ready(browser, "0/1")
    first.close()                                                       # the run stops mid-round
    with pytest.raises(RuntimeError, match="server stopped"):
        asker.result()
    again = HumanTeacher(tmp_path / "labels.jsonl", "cartpole", announce=None, keep_address=True, undo_s=0)
    try:
        assert again.start() == url
        asker = Asker(again, 0, obs)
        for p in (1, 2):
            _ready(browser, f"0/{p}")                                   # the same tab, no reload
            _armed(browser)
            ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform()
        prefs, _valid = asker.result()
        assert prefs.tolist() == [1.0, 0.0, 0.0]
    finally:
        again.close()


def test_a_narrow_window_keeps_the_clips_side_by_side(browser, teacher, api):
    asker = Asker(teacher, 0, _obs(1, 8))
    wait_for_round(api, 0)
    size = browser.get_window_size()
    try:
        for width in (640, 420):
            browser.set_window_size(width, 800)
            browser.get(teacher.url)
            _ready(browser, "0/0")
            left, right = (browser.find_element("id", i).rect for i in ("left", "right"))
            assert left["x"] + left["width"] <= right["x"] and abs(left["y"] - right["y"]) < 2, (width, left, right)
            assert left["width"] >= 120
            captions = [e.text for e in browser.find_elements("css selector", ".clip figcaption")]
            assert "Left clip" in captions[0] and "Right clip" in captions[1]
    finally:
        browser.set_window_size(size["width"], size["height"])
    api.label(0, 0, "skip")
    asker.result()
