// The labelling page: shows the open round's next pair, sends the person's answer, polls while waiting.
// Every request carries the page's token. window.labelStats records clip load times (ms) for tests.
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token") || "";
  const withToken = (path, extra) => path + "?token=" + encodeURIComponent(token) + (extra || "");
  const $ = (id) => document.getElementById(id);
  const KEYS = { ArrowLeft: "left", ArrowRight: "right", ArrowUp: "equal", "=": "equal",
                 ArrowDown: "skip", s: "skip", S: "skip" };

  let state = null;      // the last /api/state answer
  let shown = null;      // "round/pair" whose clips are on screen and loaded
  let busy = false;      // an answer is on its way
  let replays = 0;
  let pollTimer = null;
  window.labelStats = { loads: [], answered: 0, errors: [] };

  async function api(method, path, body) {
    const opts = { method, cache: "no-store", headers: {} };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    const res = await fetch(withToken(path), opts);
    let data = null;
    try { data = await res.json(); } catch (e) { /* not JSON */ }
    if (!res.ok) {
      const err = new Error((data && data.error) || ("HTTP " + res.status));
      err.status = res.status;
      throw err;
    }
    return data;
  }

  function clipUrl(round, pair, side, digest, extra) {
    return withToken(`clip/${round}/${pair}/${side}`, "&v=" + digest + (extra || ""));
  }

  function load(url) {
    return new Promise((resolve, reject) => {
      const img = new Image();
      img.onload = () => resolve(img);
      img.onerror = () => reject(new Error("a clip failed to load"));
      img.src = url;
    });
  }

  function showError(message) {
    window.labelStats.errors.push(message);
    $("error").textContent = message;
    $("error").hidden = false;
  }

  function setButtons(enabled) {
    document.querySelectorAll("#choices button").forEach((b) => { b.disabled = !enabled; });
  }

  function poll(ms) {
    clearTimeout(pollTimer);
    pollTimer = setTimeout(refresh, ms);
  }

  async function refresh() {
    try {
      render(await api("GET", "api/state"));
    } catch (e) {
      showError("Cannot reach the labelling server: " + e.message);
      poll(2000);
    }
  }

  function render(s) {
    state = s;
    $("goal").textContent = s.goal || "";
    const clips = $("clips");
    if (s.round === null) {
      $("progress-text").textContent = "Waiting for the first round\u2026";
      $("progress").value = 0;
    } else {
      $("progress-text").textContent = `Round ${s.round}: ${s.labelled} of ${s.requested} labelled`;
      $("progress").max = Math.max(1, s.requested);
      $("progress").value = s.labelled;
    }
    const acc = $("accuracy");
    if (s.accuracy) {
      const a = s.accuracy;
      acc.textContent = a.decided === 0
        ? "Reward model: no pair answered left or right yet this round"
        : `Reward model agrees with you on ${a.agree} of ${a.decided} pairs answered left or right ` +
          `(${Math.round((100 * a.agree) / a.decided)}%)`;
      acc.hidden = false;
    } else {
      acc.hidden = true;
    }
    const open = s.round !== null && !s.done && s.pair !== null;
    clips.hidden = $("choices").hidden = $("help").hidden = !open;
    if (!open) {
      if (s.done) {
        $("progress-text").textContent = `Round ${s.round} done (${s.labelled} of ${s.requested}). ` +
          "Waiting for the next round\u2026";
      }
      shown = null;
      clips.dataset.ready = "";
      poll(1000);
      return;
    }
    clearTimeout(pollTimer);
    showPair(s);
  }

  async function showPair(s) {
    const key = `${s.round}/${s.pair}`;
    if (key === shown || $("clips").dataset.loading === key) return;
    const clips = $("clips");
    clips.dataset.loading = key;
    clips.dataset.ready = "";
    clips.classList.add("loading");
    setButtons(false);
    const urls = [0, 1].map((side) => clipUrl(s.round, s.pair, side, s.digest));
    const t0 = performance.now();
    try {
      await Promise.all(urls.map(load));
    } catch (e) {
      clips.dataset.loading = "";
      showError(e.message);
      return;
    }
    if (clips.dataset.loading !== key) return;  // a newer pair took over
    const ms = performance.now() - t0;
    $("left").src = urls[0];
    $("right").src = urls[1];
    window.labelStats.loads.push({ round: s.round, pair: s.pair, ms });
    clips.classList.remove("loading");
    clips.dataset.loading = "";
    clips.dataset.round = String(s.round);
    clips.dataset.pair = String(s.pair);
    clips.dataset.ready = key;
    shown = key;
    setButtons(!busy);
    if (s.upcoming !== null) {  // fetch the next pair's clips while this one is watched
      [0, 1].forEach((side) => load(clipUrl(s.round, s.upcoming, side, s.upcoming_digest)).catch(() => {}));
    }
  }

  function replay() {
    if (!shown || !state) return;
    replays += 1;
    const extra = "&replay=" + replays;
    $("left").src = clipUrl(state.round, state.pair, 0, state.digest, extra);
    $("right").src = clipUrl(state.round, state.pair, 1, state.digest, extra);
  }

  async function choose(choice) {
    const s = state;
    if (busy || !s || s.done || s.pair === null || shown !== `${s.round}/${s.pair}`) return;
    busy = true;
    setButtons(false);
    try {
      const res = await api("POST", "api/label", { round: s.round, pair: s.pair, choice });
      window.labelStats.answered += 1;
      $("error").hidden = true;
      busy = false;
      render(res.state);
    } catch (e) {
      busy = false;
      showError(e.message);
      await refresh();
    }
  }

  document.addEventListener("keydown", (e) => {
    if (e.repeat || e.altKey || e.ctrlKey || e.metaKey) return;
    if (e.key === "r" || e.key === "R") { replay(); e.preventDefault(); return; }
    const choice = KEYS[e.key];
    if (choice) { e.preventDefault(); choose(choice); }
  });
  document.querySelectorAll("#choices button").forEach((b) => {
    b.addEventListener("click", () => choose(b.dataset.choice));
  });
  refresh();
})();
