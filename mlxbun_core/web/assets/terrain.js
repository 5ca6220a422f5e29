// /curve-terrain: the HLG tone curve of engine/hlg.py drawn for a range of pivot offsets,
// recomputed as the knobs change (the same formula the server samples with). The axes are
// titled and ticked, and the legend under the picture names each line's pivot in its colour.
const NS = "http://www.w3.org/2000/svg";
const svg = document.getElementById("terrain");
const form = document.getElementById("terrain-form");
const legend = document.getElementById("terrain-legend");
const X = [-24, 0]; // a token's log-prob relative to the top token
const Y = [-30, 10]; // the logit it is drawn with
const PLOT = { left: 48, right: 470, top: 10, bottom: 256 }; // inside the 480 x 300 viewBox
const PIVOTS = [0, 2, 4, 6, 8, 10, 12];

export function hlg(logprob, { width, shoulder, toe, pivot, gain }) {
  const z = logprob + pivot; // the top token sits at 0, the pivot `pivot` nats below it
  const roll = (d, b) => (b <= 0 ? 0 : gain * b * Math.log1p(Math.max(d, 0) / b));
  if (z > width) return gain * width + roll(z - width, shoulder);
  if (z < -width) return -gain * width - roll(-z - width, toe);
  return gain * z;
}

const sx = (x) => PLOT.left + (x - X[0]) / (X[1] - X[0]) * (PLOT.right - PLOT.left);
const sy = (y) => PLOT.bottom - (y - Y[0]) / (Y[1] - Y[0]) * (PLOT.bottom - PLOT.top);
const colour = (pivot) => `hsl(${210 + pivot * 10} 80% ${35 + pivot * 3}%)`;

function node(name, attrs, text) {
  const el = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

// Grid, tick labels and the two axis titles; the curves are clipped to the plot.
function axes() {
  const g = node("g", { class: "terrain-axes" });
  for (let x = X[0]; x <= X[1]; x += 4) {
    g.append(node("line", { x1: sx(x), x2: sx(x), y1: PLOT.top, y2: PLOT.bottom }),
      node("text", { class: "tick-x", x: sx(x), y: PLOT.bottom + 14, "text-anchor": "middle" }, x));
  }
  for (let y = Y[0]; y <= Y[1]; y += 10) {
    g.append(node("line", { x1: PLOT.left, x2: PLOT.right, y1: sy(y), y2: sy(y) }),
      node("text", { class: "tick-y", x: PLOT.left - 6, y: sy(y) + 4, "text-anchor": "end" }, y));
  }
  const midX = (PLOT.left + PLOT.right) / 2;
  const midY = (PLOT.top + PLOT.bottom) / 2;
  g.append(node("text", { class: "axis-title", x: midX, y: PLOT.bottom + 34, "text-anchor": "middle" },
    "token log-prob, relative to the top token (nats)"),
  node("text", { class: "axis-title", x: 12, y: midY, "text-anchor": "middle",
    transform: `rotate(-90 12 ${midY})` }, "logit it is drawn with"));
  const clip = node("clipPath", { id: "terrain-plot" });
  clip.append(node("rect", { x: PLOT.left, y: PLOT.top, width: PLOT.right - PLOT.left,
    height: PLOT.bottom - PLOT.top }));
  g.append(node("defs", {}), clip);
  return g;
}

function line(points, attrs) {
  return node("polyline", { points: points.map(([x, y]) => `${x},${y}`).join(" "), fill: "none", ...attrs });
}

function draw() {
  const v = Object.fromEntries(new FormData(form).entries());
  const gain = 1 / Math.max(Number(v.temperature) || 1, 0.05);
  const curves = node("g", { "clip-path": "url(#terrain-plot)" });
  curves.append(line([[sx(X[0]), sy(X[0])], [sx(0), sy(0)]],
    { class: "diagonal", stroke: "gray", "stroke-width": 1, "stroke-dasharray": "4 4" }));
  for (const pivot of PIVOTS) {
    const knobs = { width: Number(v.width), shoulder: Number(v.shoulder), toe: Number(v.toe), pivot, gain };
    const pts = [];
    for (let x = X[0]; x <= X[1]; x += 0.25) pts.push([sx(x), sy(hlg(x, knobs) - pivot)]);
    curves.append(line(pts, { class: "pivot", stroke: colour(pivot), "stroke-width": 1.6 }));
  }
  svg.replaceChildren(axes(), curves);
}

function drawLegend() {
  const item = (label, colour) => {
    const swatch = Object.assign(document.createElement("span"), { className: "swatch" });
    if (colour) {
      swatch.dataset.color = colour;
      swatch.style.background = colour;
    } else swatch.classList.add("dashed");
    const li = document.createElement("li");
    li.append(swatch, label);
    return li;
  };
  legend.replaceChildren(...PIVOTS.map((p) => item(`pivot ${p} nats`, colour(p))),
    item("no change (y = x)", null));
}

form.addEventListener("input", draw);
drawLegend();
draw();
