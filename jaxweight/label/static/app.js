// The labelling page: shows the open round's next pair, sends the person's answer, says where the run is.
// Every request carries the page's token. window.labelStats records clip load times (ms), answers, presses
// ignored during a new pair's first look, and undos, for tests.
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token") || "";
  const withToken = (path, extra) => path + "?token=" + encodeURIComponent(token) + (extra || "");
  const $ = (id) => document.getElementById(id);
  const KEYS = { ArrowLeft: "left", ArrowRight: "right", ArrowUp: "equal", "=": "equal",
                 ArrowDown: "skip", s: "skip", S: "skip" };

  let state = null;      // the last /api/state answer
  let shown = null;      // "round/pair" whose clips are on screen and loaded
  let busy = false;      // an answer or an undo is on its way
  let armedAt = Infinity;  // performance.now() from which keys and clicks count (a new pair needs a look first)
  let armTimer = null;
  let replays = 0;
  let pollTimer = null;
  let stopped = false;   // the run ended or this page's address is out of date: no more requests
  let seenEnd = false;   // the run was evaluating: a server that goes away has finished
  window.labelStats = { loads: [], answered: 0, errors: [], ignored: 0, undone: 0, shown: [] };

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
      err.code = data && data.code;
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

  function armed() { return performance.now() >= armedAt; }

  function setButtons() {
    const ok = !busy && shown !== null && armed();
    document.querySelectorAll("#choices button").forEach((b) => { b.disabled = !ok; });
    $("btn-undo").disabled = busy || !armed();
  }

  function arm(ms) {  // keys and clicks count from now + ms
    armedAt = performance.now() + ms;
    clearTimeout(armTimer);
    setButtons();
    armTimer = setTimeout(setButtons, ms + 5);
  }

  function poll(ms) {
    clearTimeout(pollTimer);
    if (!stopped) pollTimer = setTimeout(refresh, ms);
  }

  function duration(s) {
    if (s === null || s === undefined) return null;
    if (s < 90) return `${Math.max(1, Math.round(s))} s`;
    if (s < 5400) return `${Math.round(s / 60)} min`;
    return `${(s / 3600).toFixed(1)} h`;
  }

  function hideAll() {
    ["clips", "choices", "help", "undo-line", "final", "notice", "where", "accuracy"].forEach((id) => { $(id).hidden = true; });
  }

  function stopWith(title, text, isError) {
    stopped = true;
    clearTimeout(pollTimer);
    hideAll();
    shown = null;
    $("clips").dataset.ready = "";
    $("final-title").textContent = title;
    $("final-text").textContent = text;
    $("final").hidden = false;
    $("final").classList.toggle("error", !!isError);
    $("progress-text").textContent = title;
    document.body.dataset.phase = isError ? "outdated" : "finished";
  }

  async function refresh() {
    if (stopped) return;
    try {
      render(await api("GET", "api/state"));
    } catch (e) {
      if (e.status === 403 && e.code === "token") {
        stopWith("The labelling server restarted",
                 "The labelling server restarted: open the new URL printed in the terminal. " +
                 "Every label given so far is kept.", true);
        return;
      }
      if (seenEnd && e.status === undefined) {
        stopWith("Run finished", "The run has ended and its labelling server has stopped; the results are " +
                 "where the terminal says.");
        return;
      }
      showError(e.status === undefined
        ? "Cannot reach the labelling server (the run may have stopped; every label given is kept). Retrying\u2026"
        : "The labelling server refused: " + e.message);
      poll(2000);
    }
  }

  function whereLine(s) {
    const parts = [];
    if (s.round !== null) parts.push(`Round ${s.round + 1}` + (s.rounds ? ` of ${s.rounds}` : ""));
    if (s.overall) parts.push(`${s.overall.done} of ${s.overall.total} comparisons of the run done`);
    const left = leftText(s.left_range_s);
    if (left) parts.push(left);
    return parts.join(" \u00b7 ");
  }

  // "about 2-5 min left" from [low, high] seconds (one figure when they round alike); null when unknown
  function leftText(range) {
    if (!range) return null;
    const lo = duration(range[0]), hi = duration(range[1]);
    return lo === hi ? `about ${lo} left` : `${lo} to ${hi} left`;
  }

  // the finished screen's line: the reward model against the person, over the pairs they judged
  function agreementText(a) {
    if (!a || a.decided === 0) return "";
    return ` Over the ${a.decided} pairs you answered left or right whose clips differed, the reward model ` +
      `agreed with you on ${a.agree} (${Math.round((100 * a.agree) / a.decided)}%).`;
  }

  function render(s) {
    state = s;
    $("error").hidden = true;
    $("goal").textContent = s.goal || "";
    document.body.dataset.phase = s.phase;
    if (s.phase === "finished" || s.phase === "stopped") {
      stopWith(s.phase === "finished" ? "Run finished" : "Run stopped",
               (s.message || (s.phase === "finished" ? "The run has finished." : "The run was stopped.")) +
               (s.phase === "finished" ? agreementText(s.run_agreement) : ""));
      return;
    }
    if (s.phase === "evaluating") seenEnd = true;
    const prog = $("progress");
    if (s.overall) {
      prog.max = Math.max(1, s.overall.total);
      prog.value = s.overall.done;
    } else {
      prog.max = Math.max(1, s.requested);
      prog.value = s.labelled;
    }
    const where = whereLine(s);
    $("where").textContent = where;
    $("where").hidden = !where;

    const acc = $("accuracy");
    if (s.accuracy && s.round !== null) {
      const a = s.accuracy;
      acc.textContent = a.decided === 0
        ? "Reward model: no pair answered left or right yet this round"
        : `Reward model agrees with you on ${a.agree} of ${a.decided} pairs answered left or right ` +
          `(${Math.round((100 * a.agree) / a.decided)}%)`;
      acc.hidden = false;
    } else {
      acc.hidden = true;
    }
    const notice = $("notice");
    if (s.round !== null && s.by_rule > 0 && s.phase === "labelling") {
      const rule = s.idle_rule === "skip" ? "skipped" : "answered equal";
      notice.textContent = `${s.by_rule} of ${s.requested} pairs of this round have nothing to judge (both ` +
        `clips stay up for as many steps, e.g. both fallen all along or both up all along): ${rule} ` +
        "without asking you.";
      notice.hidden = false;
    } else {
      notice.hidden = true;
    }
    const undoable = s.last && !s.closed;
    $("undo-line").hidden = !undoable;
    if (undoable) $("undo-text").textContent = `pair ${s.last.pair + 1}: ${s.last.choice}`;

    const open = s.round !== null && s.phase === "labelling" && !s.done && s.pair !== null;
    $("clips").hidden = $("choices").hidden = $("help").hidden = !open;
    if (!open) {
      shown = null;
      $("clips").dataset.ready = "";
      const text = $("progress-text");
      if (s.round === null) {
        const eta = s.phase_eta_s;
        text.textContent = "Preparing the run (compiling the loop)" +
          (eta === null || eta === undefined ? "\u2026"
            : eta > 0 ? `, about ${duration(eta)} left\u2026` : ", taking longer than expected\u2026");
      } else if (s.phase === "evaluating") {
        const eta = s.phase_eta_s;
        text.textContent = "Every round is labelled. Evaluating the agent" +
          (eta === null || eta === undefined ? " (its time was not measured before)\u2026"
            : eta > 0 ? `, about ${duration(eta)} left\u2026` : ", taking longer than last time\u2026");
      } else if (s.phase === "training" || s.closed) {
        const last = s.rounds !== null && s.round + 1 >= s.rounds;
        text.textContent = `Round ${s.round + 1} done. ` + (last ? "Finishing the run\u2026"
          : "Training the reward model and the agent; the next round comes by itself\u2026");
      } else {
        text.textContent = `Round ${s.round + 1} done: every pair answered` +
          (undoable ? " (undo now if you want to change the last one)\u2026" : "\u2026");
      }
      setButtons();
      poll(s.done && !s.closed ? 300 : 1000);
      return;
    }
    $("progress-text").textContent = `Pair ${s.answered + 1} of ${s.asked} to judge`;
    clearTimeout(pollTimer);
    showPair(s);
  }

  async function showPair(s) {
    const key = `${s.round}/${s.pair}`;
    const clips = $("clips");
    if (key === shown || clips.dataset.loading === key) { setButtons(); return; }
    clips.dataset.loading = key;
    clips.dataset.ready = "";
    clips.classList.add("loading");
    shown = null;
    setButtons();
    const urls = [0, 1].map((side) => clipUrl(s.round, s.pair, side, s.digest));
    const t0 = performance.now();
    try {
      await Promise.all(urls.map(load));
    } catch (e) {
      clips.dataset.loading = "";
      showError(e.message);
      poll(2000);
      return;
    }
    if (clips.dataset.loading !== key) return;  // a newer pair took over
    const ms = performance.now() - t0;
    $("left").src = urls[0];
    $("right").src = urls[1];
    window.labelStats.loads.push({ round: s.round, pair: s.pair, ms });
    window.labelStats.shown.push({ round: s.round, pair: s.pair, at: Date.now() });
    clips.classList.remove("loading");
    clips.dataset.loading = "";
    clips.dataset.round = String(s.round);
    clips.dataset.pair = String(s.pair);
    clips.dataset.ready = key;
    shown = key;
    arm(s.min_look_ms || 0);
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

  async function send(path, body) {
    busy = true;
    setButtons();
    try {
      const res = await api("POST", path, body);
      busy = false;
      render(res.state);
      return true;
    } catch (e) {
      busy = false;
      showError(e.status === 403 && e.code === "token"
        ? "The labelling server restarted: open the new URL printed in the terminal." : e.message);
      await refresh();
      return false;
    }
  }

  async function choose(choice) {
    const s = state;
    if (busy || stopped || !s || s.done || s.pair === null || shown !== `${s.round}/${s.pair}`) return;
    if (!armed()) { window.labelStats.ignored += 1; return; }  // pressed before the pair could be seen
    if (await send("api/label", { round: s.round, pair: s.pair, choice })) window.labelStats.answered += 1;
  }

  async function undo() {
    const s = state;
    if (busy || stopped || !s || !s.last || s.closed) return;
    if (!armed()) { window.labelStats.ignored += 1; return; }
    shown = null;  // the pair taken back comes on screen again, for a fresh look
    if (await send("api/undo", { round: s.round, pair: s.last.pair })) window.labelStats.undone += 1;
  }

  document.addEventListener("keydown", (e) => {
    if (e.repeat || e.altKey || e.ctrlKey || e.metaKey) return;
    if (e.key === "r" || e.key === "R") { replay(); e.preventDefault(); return; }
    if (e.key === "u" || e.key === "U") { undo(); e.preventDefault(); return; }
    const choice = KEYS[e.key];
    if (choice) { e.preventDefault(); choose(choice); }
  });
  document.querySelectorAll("#choices button").forEach((b) => {
    b.addEventListener("click", () => choose(b.dataset.choice));
  });
  $("btn-undo").addEventListener("click", undo);
  refresh();
})();
