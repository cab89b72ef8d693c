// Line charts of /metrics/history (one point a second, the last 15 minutes), drawn as
// SVG elements: no library, no inline style (the page's Content-Security-Policy holds);
// the colours are the CSS classes s0..s3.

const NS = "http://www.w3.org/2000/svg";
const W = 320;
const H = 110;
const PAD = { left: 46, right: 6, top: 8, bottom: 18 };

function node(tag, attrs, text) {
  const n = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, String(v));
  if (text !== undefined) n.textContent = text;
  return n;
}

/** Each series as polylines over the time axis; a gap (null) starts a new line. */
function lines(points, key, x, y) {
  const runs = [];
  let run = [];
  for (const p of points) {
    const v = p[key];
    if (v === null || v === undefined) {
      if (run.length) runs.push(run);
      run = [];
      continue;
    }
    run.push(`${x(p.t).toFixed(1)},${y(v).toFixed(1)}`);
  }
  if (run.length) runs.push(run);
  return runs;
}

/**
 * Draw one chart into the <svg> `svg`: `series` is [{key, label}], values read from each
 * point; `format` writes an axis value. The y axis starts at 0 and ends at the largest
 * value shown (or `max`).
 */
export function drawChart(svg, points, series, format, max) {
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.replaceChildren();
  const shown = series.filter((s) => points.some((p) => p[s.key] !== null && p[s.key] !== undefined));
  const values = shown.flatMap((s) => points.map((p) => p[s.key]).filter((v) => v !== null && v !== undefined));
  const top = max ?? (Math.max(...values, 0) * 1.1 || 1);
  const t1 = points.length ? points[points.length - 1].t : Date.now() / 1000;
  const t0 = Math.min(points.length ? points[0].t : t1, t1 - 60);
  const x = (t) => PAD.left + ((t - t0) / Math.max(t1 - t0, 1)) * (W - PAD.left - PAD.right);
  const y = (v) => H - PAD.bottom - (v / top) * (H - PAD.top - PAD.bottom);
  svg.append(node("line", { x1: PAD.left, y1: y(0), x2: W - PAD.right, y2: y(0), class: "axis" }));
  svg.append(node("line", { x1: PAD.left, y1: y(top), x2: W - PAD.right, y2: y(top), class: "grid-line" }));
  svg.append(node("text", { x: PAD.left - 4, y: y(top) + 4, class: "tick", "text-anchor": "end" }, format(top)));
  svg.append(node("text", { x: PAD.left - 4, y: y(0), class: "tick", "text-anchor": "end" }, format(0)));
  const span = Math.round((t1 - t0) / 60);
  svg.append(node("text", { x: PAD.left, y: H - 4, class: "tick" }, `${span} min ago`));
  svg.append(node("text", { x: W - PAD.right, y: H - 4, class: "tick", "text-anchor": "end" }, "now"));
  series.forEach((s, i) => {
    for (const run of lines(points, s.key, x, y)) {
      const attrs = { points: run.join(" "), class: `series s${i}`, "data-series": s.key };
      svg.append(node("polyline", attrs));
    }
  });
  const label = series.map((s, i) => `${s.label}${shown.includes(s) ? "" : " (none)"}`);
  svg.setAttribute("aria-label", label.join(", "));
  return shown.length;
}

/** The legend of a chart: one coloured entry per series. */
export function legend(list, series) {
  list.replaceChildren();
  series.forEach((s, i) => {
    const item = document.createElement("li");
    item.className = `s${i}`;
    item.textContent = s.label;
    list.append(item);
  });
}
