// course lab: controls -> POST /api/run/<experiment> -> the figures drawn from the student's outputs.
// The newest change wins: an older request still in flight is aborted here and replaced on the server.
"use strict";

const $ = (id) => document.getElementById(id);
// The page's words in the run's language: the server writes their translations into window.LAB_TEXT (English
// when it has none). Every text of this script goes through t("English {field}", {field: value}), which
// `python -m grader.i18n update` extracts into the lab's catalog.
const TEXT = window.LAB_TEXT || {};
function t(text, fields = {}) {
  return (TEXT[text] || text).replace(/\{(\w+)\}/g, (m, k) => (k in fields ? String(fields[k]) : m));
}
const DEBOUNCE_MS = 120;
// The lab answers only its owner's browser: the cookie it gave for the token printed in the terminal goes with
// every request by itself (same origin); this script never sees it.
const STATUS = {
  passed: t("✓ your outputs match the expected ones"),
  unchecked: t("Drawn from your outputs: the chapter's rules that need no answer hold, but no answer " +
    "to this instance ships with the release, so the values are not compared and nothing is marked"),
  failed: t("✗ your outputs differ from the expected ones (wrong cells are marked in the figure)"),
  error: t("✗ your code raised an error"),
  todo: t("not implemented yet"),
  timeout: t("✗ your code did not finish in time (the page stays usable: change the instance or fix the code)"),
  invalid: t("this instance cannot be drawn"),
  blocked: t("cannot run on this machine"),
  refused: t("✗ course lab refused this page (below)"),
};
// A failure found by a rule that needs no answer (no answer to this instance ships with the release).
const FAILED_BY_RULE = t("✗ your outputs break a rule of the chapter (below); no answer to this " +
  "instance ships with the release, so the figure marks nothing");
const RUNNING = t("running your code…");

const lab = { experiments: new Map(), current: null, seq: 0, inflight: null, timer: null, changedAt: null };
window.labLatencies = [];   // ms from a control change to its figures on the page (read by the browser tests)

async function start() {
  const res = await fetch("/api/experiments");
  const info = await res.json();
  if (!res.ok) {  // a lab started again at this port: this page's cookie is not its own
    show(info, null);
    return;
  }
  $("target").textContent = info.mode === "solutions"
    ? t("running the reference solutions · time limit {limit} s per change", { limit: info.time_limit })
    : t("running {target} · time limit {limit} s per change", { target: info.target, limit: info.time_limit });
  const mode = $("mode");
  if (info.checked) {
    mode.textContent = t("Every change runs your functions in a " +
      "separate process (the limits of course check) and compares them with the reference solutions; wrong cells " +
      "are marked with the expected value.");
  } else {
    mode.classList.add("release");
    mode.textContent = t("Student release: the reference solutions do not ship, only the answers recorded " +
      "with the release: an instance that has one (each experiment's starting instance, and those of the public " +
      "checks) is compared with it and wrong cells are marked. Any other instance is checked against the rules " +
      "that need no answer (a mask hides the future, cu_seqlens are running sums, a sample wins the race) and " +
      "drawn unmarked, under a line saying so.");
  }
  const nav = $("nav");
  for (const ch of info.chapters) {
    const h = document.createElement("h3");
    h.textContent = `${ch.id} · ${ch.title}`;
    nav.append(h);
    for (const exp of ch.experiments) {
      exp.file = ch.file;
      lab.experiments.set(exp.id, exp);
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = exp.title;
      b.dataset.experiment = exp.id;
      b.addEventListener("click", () => { location.hash = exp.id; });
      nav.append(b);
    }
  }
  await startEngine(nav);
  window.addEventListener("hashchange", () => select(location.hash.slice(1)));
  select(location.hash.slice(1));
}

function select(id) {
  const onEngine = id === ENGINE && engine.info !== null;
  $("experiment").hidden = onEngine;
  $("engine").hidden = !onEngine;
  for (const b of document.querySelectorAll("nav button")) {
    b.setAttribute("aria-current", String(b.dataset.experiment === id));
  }
  if (onEngine) return;
  const exp = lab.experiments.get(id) || lab.experiments.values().next().value;
  if (!exp) return;
  lab.current = exp;
  for (const b of document.querySelectorAll("nav button")) {
    b.setAttribute("aria-current", String(b.dataset.experiment === exp.id));
  }
  $("title").textContent = exp.title;
  $("about").textContent = exp.about;
  $("calls").textContent = t("calls your {calls} ({file}) · draws {figures}",
    { calls: exp.calls.join(", "), file: exp.file, figures: exp.figures.join(", ") });
  $("varies").hidden = !exp.varies;
  $("varies").textContent = exp.varies;
  buildControls(exp);
  $("figures").replaceChildren();
  show({ status: "running", message: "" }, null);
  change();
}

function buildControls(exp) {
  const form = $("controls");
  form.replaceChildren();
  form.onsubmit = (e) => { e.preventDefault(); change(0); };
  for (const p of exp.params) {
    const box = document.createElement("div");
    box.className = "control";
    const label = document.createElement("label");
    label.textContent = p.label;
    label.htmlFor = `param-${p.name}`;
    const input = document.createElement("input");
    input.id = `param-${p.name}`;
    input.name = p.name;
    if (p.kind === "int" || p.kind === "float") {
      input.type = "number";
      input.min = p.min; input.max = p.max; input.step = p.kind === "int" ? 1 : p.step;
      input.value = p.default;
    } else {
      input.type = "text";
      input.value = p.default;
      input.spellcheck = false;
    }
    const hint = document.createElement("span");
    hint.className = "hint";
    hint.textContent = p.kind === "list"
      ? t("{low}–{high} numbers in {min} … {max}", { low: p.min_len, high: p.max_len, min: p.min, max: p.max })
      : `${p.min} … ${p.max}`;
    const error = document.createElement("span");
    error.className = "error";
    error.id = `error-${p.name}`;
    input.addEventListener("input", () => change());
    box.append(label, input, hint, error);
    form.append(box);
  }
  const reset = document.createElement("button");
  reset.type = "button";
  reset.textContent = t("reset");
  reset.addEventListener("click", () => { buildControls(exp); change(0); });
  form.append(reset);
}

function values() {
  const out = {};
  for (const input of $("controls").querySelectorAll("input")) {
    out[input.name] = input.value;
  }
  return out;
}

function change(delay = DEBOUNCE_MS) {
  if (lab.changedAt === null) lab.changedAt = performance.now();
  clearTimeout(lab.timer);
  lab.timer = setTimeout(run, delay);
}

async function run() {
  const exp = lab.current;
  const seq = ++lab.seq;
  const changedAt = lab.changedAt;
  lab.changedAt = null;
  if (lab.inflight) lab.inflight.abort();
  const ctrl = new AbortController();
  lab.inflight = ctrl;
  $("figures").classList.add("stale");
  $("status").dataset.state = "running";
  $("status").textContent = RUNNING;
  let data;
  try {
    const res = await fetch(`/api/run/${encodeURIComponent(exp.id)}`, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ params: values() }), signal: ctrl.signal,
    });
    data = await res.json();
  } catch (e) {
    if (ctrl.signal.aborted) return;
    data = { status: "error", message: t("the lab server did not answer ({error}); is course lab still running?", { error: e }) };
  }
  if (seq !== lab.seq || exp !== lab.current || data.status === "superseded") return;
  lab.inflight = null;
  show(data, seq);
  if (changedAt !== null) window.labLatencies.push(performance.now() - changedAt);
}

function show(data, seq) {
  const status = $("status");
  status.dataset.state = data.status;
  status.textContent = data.status === "running" ? RUNNING
    : data.status === "failed" && data.compared === false ? FAILED_BY_RULE : (STATUS[data.status] || data.status);
  if (data.elapsed !== undefined) {
    const t = document.createElement("span");
    t.className = "time";
    t.textContent = `${Math.round(data.elapsed * 1000)} ms`;
    status.append(t);
  }
  const message = $("message");
  message.hidden = !data.message;
  message.textContent = data.message || "";
  for (const input of $("controls").querySelectorAll("input")) {
    const err = (data.errors || {})[input.name] || "";
    input.setAttribute("aria-invalid", String(Boolean(err)));
    $(`error-${input.name}`).textContent = err;
  }
  const notes = $("notes");
  notes.replaceChildren(...(data.notes || []).map((n) => { const li = document.createElement("li"); li.textContent = n; return li; }));
  const printed = $("printed");
  printed.hidden = !data.printed;
  printed.querySelector("pre").textContent = data.printed || "";
  if (seq === null) return;
  const figures = $("figures");
  if (data.figures) {       // a new drawing (a failed check keeps its figure, with the wrong cells marked)
    figures.replaceChildren(...data.figures.map((f) => {
      const box = document.createElement("div");
      box.className = "figure";
      box.dataset.figure = f.id;
      box.innerHTML = f.svg;  // SVG drawn by the course's figures module; values are escaped there
      return box;
    }));
  } else if (data.status !== "invalid") {
    figures.replaceChildren();
  }
  figures.classList.toggle("stale", data.status === "invalid");
  figures.dataset.seq = String(seq);
  figures.dataset.status = data.status;
}

// -- the engine panel: `course engine run` on a prompt (POST /api/engine), its text and its course map ----------
// It runs when asked (a button), not on every change: a run takes seconds, the first one checks your chapters.
const ENGINE = "engine";
const engine = { info: null, seq: 0, inflight: null };
const ENGINE_STATUS = {
  passed: t("✓ the engine ran your prompt"),
  error: t("✗ the engine did not run (below)"),
  timeout: t("✗ the engine did not finish in time (below)"),
  invalid: t("the engine cannot run this"),
  refused: t("✗ course lab refused this page (below)"),
};
const ENGINE_RUNNING = t("running the engine… (a first run checks your chapters first: up to a minute)");

async function startEngine(nav) {
  const res = await fetch("/api/engine");
  if (!res.ok) return;
  engine.info = await res.json();
  const h = document.createElement("h3");
  h.textContent = t("the engine · every chapter in one run");
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = "course engine run";  // the command, as typed
  b.dataset.experiment = ENGINE;
  b.addEventListener("click", () => { location.hash = ENGINE; });
  nav.append(h, b);
  const info = engine.info;
  $("engine-prompt").value = info.prompt;
  $("engine-prompt").maxLength = info.max_prompt;
  const tokens = $("engine-max_tokens");
  tokens.min = info.max_tokens.min; tokens.max = info.max_tokens.max; tokens.value = info.max_tokens.default;
  $("engine-hint").textContent = `${info.max_tokens.min} … ${info.max_tokens.max}`;
  $("engine-command").textContent = info.command;
  $("engine-controls").onsubmit = (e) => { e.preventDefault(); runEngine(); };
}

async function runEngine() {
  const seq = ++engine.seq;
  if (engine.inflight) engine.inflight.abort();  // the server stops the running engine for the newer request
  const ctrl = new AbortController();
  engine.inflight = ctrl;
  const status = $("engine-status");
  status.dataset.state = "running";
  status.textContent = ENGINE_RUNNING;
  $("engine-result").classList.add("stale");
  let data;
  try {
    const res = await fetch("/api/engine", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ params: { prompt: $("engine-prompt").value, max_tokens: $("engine-max_tokens").value } }),
      signal: ctrl.signal,
    });
    data = await res.json();
  } catch (e) {
    if (ctrl.signal.aborted) return;
    data = { status: "error", message: t("the lab server did not answer ({error}); is course lab still running?", { error: e }) };
  }
  if (seq !== engine.seq || data.status === "superseded") return;
  engine.inflight = null;
  showEngine(data, seq);
}

function showEngine(data, seq) {
  const status = $("engine-status");
  status.dataset.state = data.status;
  status.textContent = ENGINE_STATUS[data.status] || data.status;
  if (data.elapsed !== undefined) {
    const time = document.createElement("span");
    time.className = "time";
    time.textContent = `${(data.elapsed).toFixed(1)} s`;
    status.append(time);
  }
  const message = $("engine-message");
  message.hidden = !data.message;
  message.textContent = data.message || "";
  for (const name of ["prompt", "max_tokens"]) {
    const err = (data.errors || {})[name] || "";
    $(`engine-${name}`).setAttribute("aria-invalid", String(Boolean(err)));
    $(`engine-error-${name}`).textContent = err;
  }
  if (data.command) $("engine-command").textContent = data.command;
  const result = $("engine-result");
  result.classList.toggle("stale", data.status !== "passed");
  result.dataset.seq = String(seq);
  result.dataset.status = data.status;
  if (data.status !== "passed") {
    result.hidden = data.status !== "invalid" || result.hidden;  // a refused instance keeps the last run, faded
    return;
  }
  result.hidden = false;
  // The text the model wrote (and the student's code computed) is text, never markup.
  $("engine-prompt-shown").textContent = data.prompt;
  $("engine-completion").textContent = data.completion;
  $("engine-numbers").textContent = data.numbers;
  $("engine-notes").replaceChildren(...(data.notes || []).map((n) => { const li = document.createElement("li"); li.textContent = n; return li; }));
  const figure = $("engine-figure");
  if (data.figure) {
    // An <img>: the figure was drawn by the process that ran your code, and an SVG in an <img> runs no script.
    const img = document.createElement("img");
    img.src = data.figure.src;
    img.alt = t("the course map of this run: the chapters each stage of the request ran, with the shapes they saw");
    figure.replaceChildren(img);
  } else {
    figure.replaceChildren();
    figure.textContent = t("the run drew no course map");
  }
}

start();
