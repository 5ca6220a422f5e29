// The curve designer (/curves): draw a log-prob transfer curve, see the prompt's
// next-token distribution under it (POST /signal), and compare samples drawn with the curve
// against the model's default recipe (POST /generate), save it in this browser and hand it
// to the chat ("use in chat": the chat session keeps it and samples its turns with it). Mouse, touch and keyboard all edit
// the same list of points; the server refuses a curve that goes down, and says why.
import { apiKey, askForKey } from "./api.js";
import { PRESETS, handOff, saveCurve } from "./curvestore.js";

const $ = (id) => document.getElementById(id);
const SVGNS = "http://www.w3.org/2000/svg";
const X = [-20, 0];
const Y = [-20, 0];
const PLOT = { left: 40, right: 390, top: 10, bottom: 270 };
const STEP = 0.5;

let points = PRESETS.identity.map((p) => [...p]);
let bins = null;
let focusIndex = -1;

const round = (v) => Math.round(v * 100) / 100;
const clamp = (v, [lo, hi]) => Math.min(hi, Math.max(lo, v));
const sx = (x) => PLOT.left + (clamp(x, X) - X[0]) / (X[1] - X[0]) * (PLOT.right - PLOT.left);
const sy = (y) => PLOT.bottom - (clamp(y, Y) - Y[0]) / (Y[1] - Y[0]) * (PLOT.bottom - PLOT.top);
const ux = (px) => X[0] + (px - PLOT.left) / (PLOT.right - PLOT.left) * (X[1] - X[0]);
const uy = (py) => Y[0] + (PLOT.bottom - py) / (PLOT.bottom - PLOT.top) * (Y[1] - Y[0]);

export function isMonotone(pts) {
  return pts.every((p, i) => i === 0 || (p[0] > pts[i - 1][0] && p[1] >= pts[i - 1][1]));
}

function el(name, attrs = {}) {
  const node = document.createElementNS(SVGNS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function drawGrid() {
  const grid = $("curve-grid");
  for (let v = -20; v <= 0; v += 5) {
    grid.append(el("line", { x1: sx(v), y1: PLOT.top, x2: sx(v), y2: PLOT.bottom }));
    grid.append(el("line", { x1: PLOT.left, y1: sy(v), x2: PLOT.right, y2: sy(v) }));
    const tx = el("text", { x: sx(v) - 6, y: PLOT.bottom + 16 });
    tx.textContent = v;
    const ty = el("text", { x: 8, y: sy(v) + 4 });
    ty.textContent = v;
    grid.append(tx, ty);
  }
}

function drawBins() {
  const g = $("curve-bins");
  g.replaceChildren();
  if (!bins) return;
  const top = Math.max(...bins.map((c) => Math.log1p(c)), 1);
  const width = (PLOT.right - PLOT.left) / bins.length;
  bins.forEach((count, i) => {
    const h = Math.log1p(count) / top * (PLOT.bottom - PLOT.top);
    g.append(el("rect", { x: PLOT.left + i * width, y: PLOT.bottom - h, width: width, height: h }));
  });
}

function render() {
  const bad = !isMonotone(points);
  const line = $("curve-line");
  line.setAttribute("points", points.map(([x, y]) => `${sx(x)},${sy(y)}`).join(" "));
  line.classList.toggle("bad", bad);
  const note = $("curve-monotone");
  note.textContent = bad ? "Not monotone: the server will refuse this curve." : "Monotone.";
  if (bad) note.dataset.bad = "1";
  else delete note.dataset.bad;
  drawPoints();
  drawRows();
}

function drawPoints() {
  const g = $("curve-points");
  g.replaceChildren();
  points.forEach(([x, y], i) => {
    const c = el("circle", { cx: sx(x), cy: sy(y), r: 7, tabindex: 0, role: "slider",
      "aria-label": `Point ${i + 1}`, "aria-valuetext": `x ${x}, y ${y}`, "data-index": i });
    c.addEventListener("keydown", (e) => onPointKey(e, i));
    c.addEventListener("pointerdown", (e) => startDrag(e, i));
    g.append(c);
  });
  if (focusIndex >= 0) g.children[Math.min(focusIndex, points.length - 1)]?.focus();
}

function drawRows() {
  const body = $("curve-rows");
  if (body.contains(document.activeElement)) return; // typing: keep the inputs as they are
  body.replaceChildren();
  points.forEach(([x, y], i) => {
    const tr = document.createElement("tr");
    for (const [axis, value] of [[0, x], [1, y]]) {
      const td = document.createElement("td");
      const input = Object.assign(document.createElement("input"), { type: "number", step: STEP, value });
      input.setAttribute("aria-label", `Point ${i + 1} ${axis ? "y" : "x"}`);
      input.addEventListener("change", () => {
        const v = Number(input.value);
        if (!Number.isFinite(v)) return;
        points[i][axis] = v;
        focusIndex = -1;
        render();
      });
      td.append(input);
      tr.append(td);
    }
    const td = document.createElement("td");
    const remove = Object.assign(document.createElement("button"), { type: "button", textContent: "✕" });
    remove.setAttribute("aria-label", `Remove point ${i + 1}`);
    remove.disabled = points.length <= 2;
    remove.addEventListener("click", () => removePoint(i));
    td.append(remove);
    tr.append(td);
    body.append(tr);
  });
}

function removePoint(i) {
  if (points.length <= 2) return;
  points.splice(i, 1);
  focusIndex = -1;
  render();
}

function addPoint(x, y) {
  const at = points.findIndex((p) => p[0] > x);
  const index = at < 0 ? points.length : at;
  points.splice(index, 0, [round(x), round(y)]);
  return index;
}

function onPointKey(event, i) {
  const big = event.shiftKey ? 4 : 1;
  const moves = { ArrowUp: [0, STEP], ArrowDown: [0, -STEP], ArrowLeft: [-STEP, 0], ArrowRight: [STEP, 0] };
  if (event.key in moves) {
    const [dx, dy] = moves[event.key];
    points[i] = [round(points[i][0] + dx * big), round(points[i][1] + dy * big)];
    focusIndex = i;
    render();
    event.preventDefault();
  } else if (event.key === "Delete" || event.key === "Backspace") {
    removePoint(i);
    event.preventDefault();
  }
}

function svgPoint(event) {
  const svg = $("curve-svg");
  const box = svg.getBoundingClientRect();
  return [(event.clientX - box.left) / box.width * 400, (event.clientY - box.top) / box.height * 300];
}

function startDrag(event, i) {
  event.preventDefault();
  event.stopPropagation();
  const svg = $("curve-svg");
  svg.setPointerCapture(event.pointerId);
  const move = (e) => {
    const [px, py] = svgPoint(e);
    points[i] = [round(clamp(ux(px), X)), round(clamp(uy(py), Y))];
    focusIndex = -1;
    render();
  };
  const stop = () => {
    svg.removeEventListener("pointermove", move);
    svg.removeEventListener("pointerup", stop);
  };
  svg.addEventListener("pointermove", move);
  svg.addEventListener("pointerup", stop);
}

function onCanvasClick(event) {
  if (event.target.tagName === "circle") return;
  const [px, py] = svgPoint(event);
  if (px < PLOT.left || px > PLOT.right || py < PLOT.top || py > PLOT.bottom) return;
  focusIndex = addPoint(clamp(ux(px), X), clamp(uy(py), Y));
  render();
}

// -- the server ---------------------------------------------------------------------
async function post(path, body) {
  const headers = { "content-type": "application/json" };
  if (apiKey()) headers.Authorization = `Bearer ${apiKey()}`;
  const response = await fetch(path, { method: "POST", headers, body: JSON.stringify(body) });
  if (response.status === 401) {
    await askForKey();
    return post(path, body);
  }
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const message = typeof data.error === "string" ? data.error : data.error?.message;
    throw new Error(message || `HTTP ${response.status}`);
  }
  return data;
}

function showError(message) {
  const box = $("curve-error");
  box.textContent = message || "";
  box.hidden = !message;
}

function addSample(list, sample) {
  const li = document.createElement("li");
  li.textContent = sample.text || "(empty)";
  if (sample.junk) li.classList.add("junk");
  $(list).append(li);
}

async function readSignal() {
  showError("");
  $("curve-note").textContent = "Reading the signal…";
  try {
    const data = await post("/signal", { prompt: $("curve-prompt").value });
    bins = data.bins;
    drawBins();
    $("curve-note").textContent = `Signal over ${data.vocab.toLocaleString()} tokens.`;
  } catch (err) {
    showError(err.message);
    $("curve-note").textContent = "";
  }
}

// Both columns, one sample at a time and in turns (curve 1, default 1, curve 2, ...): the
// server runs seeded requests one after another, so a column asked for after the whole of the
// other waited for all of it. Sample i is drawn with seed + i, as the server's own `n` does.
const COLUMNS = [["curve", (points) => ({ curve: { points } })], ["default", () => ({ default: true })]];

async function generate(event) {
  event.preventDefault();
  showError("");
  const n = Number($("curve-n").value) || 3;
  const base = { prompt: $("curve-prompt").value, n: 1,
    max_tokens: Number($("curve-max").value) || 40 };
  const seed = Number($("curve-seed").value) || 0;
  const drawn = points.map((p) => [...p]); // the curve as it was when asked
  for (const [name] of COLUMNS) {
    $(`samples-${name}`).replaceChildren();
    $(`status-${name}`).textContent = `Next: 1 of ${n}`;
  }
  $("recipe").textContent = "";
  $("curve-generate").disabled = true;
  const started = performance.now();
  let done = 0;
  try {
    for (let i = 0; i < n; i += 1) {
      for (const [name, mode] of COLUMNS) {
        $("curve-note").textContent = `Sampling ${done + 1} of ${2 * n}…`;
        $(`status-${name}`).textContent = `Sampling ${i + 1} of ${n}…`;
        const data = await post("/generate", { ...base, seed: (seed + i) % 2 ** 32, ...mode(drawn) });
        addSample(`samples-${name}`, data.samples[0]);
        done += 1;
        $(`status-${name}`).textContent = i + 1 < n ? `Next: ${i + 2} of ${n}` : "";
        const r = data.recipe;
        if (r) $("recipe").textContent = `temperature ${r.temperature}, top-p ${r.topP}, top-k ${r.topK}`;
      }
    }
    $("curve-note").textContent = `Done: ${done} samples in ${((performance.now() - started) / 1000).toFixed(1)} s.`;
  } catch (err) {
    showError(err.message);
    $("curve-note").textContent = "";
  } finally {
    for (const [name] of COLUMNS) $(`status-${name}`).textContent = "";
    $("curve-generate").disabled = false;
  }
}

drawGrid();
render();
$("curve-svg").addEventListener("click", onCanvasClick);
$("curve-add").addEventListener("click", () => { // halfway along the last segment
  const [a, b] = points.slice(-2);
  focusIndex = addPoint((a[0] + b[0]) / 2, (a[1] + b[1]) / 2);
  render();
});
document.querySelectorAll("[data-preset]").forEach((b) => b.addEventListener("click", () => {
  points = PRESETS[b.dataset.preset].map((p) => [...p]);
  focusIndex = -1;
  render();
}));
$("curve-signal").addEventListener("click", readSignal);
const named = () => ({ name: $("curve-name").value.trim() || "my curve", points: points.map((p) => [...p]) });
$("curve-save").addEventListener("click", () => {
  saveCurve(named());
  $("curve-note").textContent = `Saved “${named().name}” in this browser: the chat settings list it.`;
});
$("curve-use").addEventListener("click", () => { // the chat checks it (and says if it is refused)
  saveCurve(named());
  handOff(named());
  location.href = "/#chat";
});
$("curve-form").addEventListener("submit", generate);
$("key-form").addEventListener("submit", () => setTimeout(() => location.reload(), 0));
