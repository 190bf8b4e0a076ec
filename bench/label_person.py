"""A scripted person labels a whole ``demo preferences --teacher human`` run on the real page, in Chromium.

Starts ``python -m jaxweight demo preferences --teacher human [--quick] --out DIR``, opens the printed URL in
headless Chromium (selenium, Debian's ``chromium`` and ``chromedriver``) and labels every pair the page asks,
as a person would: it waits for both clips, looks at them for ``--look-s`` seconds (default 3), judges them by
what they show (the clip with more live frames, i.e. frames not dimmed as fallen, is better; the same number:
equal) and presses the arrow key. On purpose it also presses twice within 60 ms every ``--double-every`` pairs
(the second press must be ignored) and, once, answers a pair wrongly and undoes it with ``u``. It stays until the
page shows the finished screen.

Measured and written to a results JSON (with command, commit, machine and date): labels lost (answers the page
confirmed that are not the pair's latest answer in the log), pairs answered by a press meant for another pair
(log lines beyond the deliberate answers), the pairs asked and answered by the rule per round, the share of asked
pairs that were informative (at least one clip shows a live step: something to judge) and the share the
noiseless teacher decides (the two clips' live steps differ), whether the finished screen came, and times.

``--mode api`` answers over HTTP without a browser and without looking (a fast person), to measure the rule's
shares on the default run's real pairs.

Run ``python bench/label_person.py [--quick] [--look-s 3] [--mode browser|api] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxweight.checkpoint import save_json  # noqa: E402
from jaxweight.demos import provenance  # noqa: E402
from jaxweight.label import render  # noqa: E402
from jaxweight.label.log import LabelLog  # noqa: E402

KEYS = {"left": "\ue012", "right": "\ue014", "equal": "\ue013"}  # selenium's ARROW_LEFT / ARROW_RIGHT / ARROW_UP
OPPOSITE = {"left": "right", "right": "left", "equal": "left"}


def live_steps(gif: bytes) -> int:
    """Frames 1.. of a clip that are live: no "fell" banner along the top (what a person sees as still in play)."""
    im = Image.open(io.BytesIO(gif))
    banner = np.asarray(render._PALETTE[render.BANNER], np.uint8)
    n = 0
    for i in range(1, im.n_frames):
        im.seek(i)
        n += not bool(np.all(np.asarray(im.convert("RGB"))[2, :40] == banner))
    return n


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


class Demo:
    """The demo in a subprocess; its stdout collected on a thread."""

    def __init__(self, out: Path, quick: bool):
        args = [sys.executable, "-m", "jaxweight", "demo", "preferences", "--teacher", "human", "--out", str(out),
                "--no-progress"] + (["--quick"] if quick else [])
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("XLA_FLAGS", None)
        self.command = " ".join(["python", *args[1:]])
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[str] = []
        self.url: str | None = None
        self._got_url = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._got_url.wait(600):
            raise RuntimeError("the demo printed no URL:\n" + "".join(self.lines))

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            print("  demo |", line.rstrip(), flush=True)
            if line.startswith("[label] compare clips at "):
                self.url = line.split(" at ", 1)[1].strip()
                self._got_url.set()
        self._got_url.set()


def judge(base: str, token: str, state: dict) -> tuple[str, tuple[int, int]]:
    """The answer a person gives by looking at the pair's clips (more live steps is better)."""
    r, p, d = state["round"], state["pair"], state["digest"]
    live = tuple(live_steps(fetch(f"{base}/clip/{r}/{p}/{s}?token={token}&v={d}")) for s in (0, 1))
    return ("left" if live[0] > live[1] else "right" if live[1] > live[0] else "equal"), live


def browser_person(url: str, look_s: float, double_every: int, undo_at: int, deadline: float,
                   screenshot: str | None = None) -> dict:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1100,940"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    parts = urlsplit(url)
    base, token = f"{parts.scheme}://{parts.netloc}", parts.query.split("token=", 1)[1]
    answers: list[dict] = []
    doubles = undos = 0
    finished_text = None
    shot_taken = False
    try:
        drv.get(url)
        last_key = None
        while time.monotonic() < deadline:
            view = drv.execute_script(
                "const c = document.getElementById('clips'); const f = document.getElementById('final');"
                "return {ready: c.dataset.ready, phase: document.body.dataset.phase, final: !f.hidden,"
                " text: f.textContent};")
            if view["final"]:
                finished_text = " ".join(view["text"].split())
                break
            if not view["ready"] or view["ready"] == last_key:
                time.sleep(0.05)
                continue
            shown_at = time.monotonic()
            last_key = view["ready"]
            r, p = map(int, last_key.split("/"))
            state = json.loads(fetch(f"{base}/api/state?token={token}"))
            if (state["round"], state["pair"]) != (r, p):
                last_key = None
                continue
            choice, live = judge(base, token, state)
            n = len(answers)
            # the docs' picture: a real pair, best one clip live long and one that fell (frozen, dimmed) mid-way;
            # until such a pair comes, the first pair with a live clip
            good = max(live) >= 16 and 3 <= min(live) <= 11
            if screenshot and (good or not shot_taken and max(live) > 0):
                time.sleep(max(0.0, 1.7 - (time.monotonic() - shown_at)))
                drv.save_screenshot(screenshot)
                print("  screenshot", screenshot, "of pair", last_key, "live steps", live, flush=True)
                shot_taken = True
                screenshot = None if good else screenshot
            time.sleep(max(0.0, look_s - (time.monotonic() - shown_at)))     # a person's look
            act = ActionChains(drv)
            if n == undo_at:  # a slip, taken back with u and answered again after a new look
                act.send_keys(KEYS[OPPOSITE[choice]]).perform()
                time.sleep(1.0)
                ActionChains(drv).send_keys("u").perform()
                undos += 1
                deadline_pair = time.monotonic() + 30
                while drv.execute_script("return document.getElementById('clips').dataset.ready") != last_key:
                    if time.monotonic() > deadline_pair:
                        raise RuntimeError("the undone pair did not come back")
                    time.sleep(0.05)
                time.sleep(look_s)
                act = ActionChains(drv)
            if double_every and n % double_every == double_every - 1:  # a double press: 60 ms apart
                act.send_keys(KEYS[choice]).pause(0.06).send_keys(KEYS[choice]).perform()
                doubles += 1
            else:
                act.send_keys(KEYS[choice]).perform()
            answers.append({"round": r, "pair": p, "choice": choice, "live": list(live), "digest": state["digest"],
                            "shown_s": round(time.monotonic() - shown_at, 3)})
        stats = drv.execute_script("return window.labelStats")
        shot = drv.get_screenshot_as_png()
    finally:
        drv.quit()
    return {"answers": answers, "doubles": doubles, "undos": undos, "finished_text": finished_text,
            "page_stats": {k: stats[k] for k in ("answered", "ignored", "undone")} | {"errors": stats["errors"][:5]},
            "clip_wait_ms_median": float(np.median([x["ms"] for x in stats["loads"]])) if stats["loads"] else None,
            "final_screenshot_bytes": len(shot)}


def api_person(url: str, deadline: float) -> dict:
    parts = urlsplit(url)
    base, token = f"{parts.scheme}://{parts.netloc}", parts.query.split("token=", 1)[1]
    answers = []
    finished_text = None
    while time.monotonic() < deadline:
        try:
            s = json.loads(fetch(f"{base}/api/state?token={token}"))
        except (urllib.error.URLError, ConnectionError):
            break
        if s["phase"] == "finished":
            finished_text = s["message"]
            break
        if s["round"] is None or s["done"] or s["phase"] != "labelling":
            time.sleep(0.2)
            continue
        choice, live = judge(base, token, s)
        body = json.dumps({"round": s["round"], "pair": s["pair"], "choice": choice}).encode()
        req = urllib.request.Request(f"{base}/api/label?token={token}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        fetch_ok = urllib.request.urlopen(req, timeout=30).status == 200
        if fetch_ok:
            answers.append({"round": s["round"], "pair": s["pair"], "choice": choice, "live": list(live),
                            "digest": s["digest"]})
    return {"answers": answers, "doubles": 0, "undos": 0, "finished_text": finished_text}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the quick run (80 comparisons)")
    ap.add_argument("--mode", choices=("browser", "api"), default="browser")
    ap.add_argument("--look-s", type=float, default=3.0, help="seconds a pair is looked at before the key press")
    ap.add_argument("--double-every", type=int, default=7, help="press twice within 60 ms every N pairs (0: never)")
    ap.add_argument("--undo-at", type=int, default=4, help="answer pair N wrongly and undo it (-1: never)")
    ap.add_argument("--out", default=None, help="the demo's --out (default: a temporary folder)")
    ap.add_argument("--json", default=None, help="where to write the results (default: print only)")
    ap.add_argument("--timeout-s", type=float, default=7200)
    ap.add_argument("--screenshot", default=None, help="save a PNG of the page showing a real pair (browser mode)")
    args = ap.parse_args(argv)

    out = Path(args.out or tempfile.mkdtemp(prefix="label-person-"))
    t0 = time.monotonic()
    demo = Demo(out, args.quick)
    deadline = t0 + args.timeout_s
    if args.mode == "browser":
        person = browser_person(demo.url, args.look_s, args.double_every, args.undo_at, deadline, args.screenshot)
    else:
        person = api_person(demo.url, deadline)
    code = demo.proc.wait(timeout=max(60.0, deadline - time.monotonic()))
    wall = time.monotonic() - t0
    tag = "cartpole_quick" if args.quick else "cartpole"
    res = json.loads((out / f"{tag}.json").read_text())
    log = LabelLog(out / "checkpoints" / tag / "labels.jsonl")

    # labels lost: a confirmed answer that is not its pair's latest answer in the log
    latest = {}
    for rec in log.records:
        latest[(rec.round, rec.pair)] = rec.choice
    answers = person["answers"]
    lost = [a for a in answers if latest.get((a["round"], a["pair"])) != a["choice"]]
    deliberate = len(answers) + 2 * person["undos"]  # an undone slip is two lines (the slip, "undone")
    extra_lines = len(log.records) - deliberate     # lines from a press meant for another pair
    rounds = res["label_rounds"]
    asked = sum(r["asked"] for r in rounds.values())
    by_rule = sum(r["by_rule"] for r in rounds.values())
    informative = [max(a["live"]) > 0 for a in answers]
    decided = [a["live"][0] != a["live"][1] for a in answers]
    result = {
        "what": "a scripted person labels a demo preferences --teacher human run on the labelling page",
        "run": {"quick": args.quick, "mode": args.mode, "look_s": args.look_s if args.mode == "browser" else 0.0,
                "demo_command": demo.command, "demo_exit_code": code},
        "pairs_sampled": asked + by_rule, "pairs_asked": asked, "pairs_answered_by_rule": by_rule,
        "answers_by_person": len(answers), "labels_lost": len(lost), "lost": lost[:5],
        "pairs_answered_by_a_press_meant_for_another": max(extra_lines, 0), "log_lines": len(log.records),
        "double_presses": person["doubles"], "undos": person["undos"],
        "informative_share_of_asked": float(np.mean(informative)) if answers else None,
        "decided_share_of_asked": float(np.mean(decided)) if answers else None,
        "informative_share_of_sampled_without_the_rule": (sum(informative) / (asked + by_rule)) if answers else None,
        "per_round": rounds,
        "finished_screen": person["finished_text"],
        "page": {k: person[k] for k in ("page_stats", "clip_wait_ms_median") if k in person},
        "wall_s": wall, "demo_compile_s": res.get("compile_s"), "demo_run_s": res.get("run_s"),
        "final_return": res["final"]["return"],
        **provenance(),
        "jax_version": res.get("jax_version"), "device": res.get("device"),  # the demo's (this process runs no JAX)
    }
    print(json.dumps({k: v for k, v in result.items() if k != "per_round"}, indent=1))
    if args.json:
        save_json(args.json, result)
        print("written", args.json)
    ok = (code == 0 and not lost and extra_lines == 0 and person["finished_text"]
          and "results in" in person["finished_text"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
