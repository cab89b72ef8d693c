// The dashboard and the models view: /health, /v1/models, /metrics/json and
// /metrics/history (charts of the last 15 minutes), polled while either is on screen.

import { AuthError, api } from "./api.js";
import { drawChart, legend } from "./charts.js";
import { initPulls, removeButton } from "./pulls.js";

const $ = (id) => document.getElementById(id);
const PERIOD_MS = 2000;
let timer = null;
let onAuth = () => {};

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function fixed(n, digits = 2) {
  return n === null || n === undefined ? "–" : Number(n).toFixed(digits);
}

/** Fill a <dl> with [label, value] pairs. */
function pairs(id, rows) {
  const list = $(id);
  list.replaceChildren();
  for (const [label, value] of rows) list.append(el("dt", label), el("dd", value));
}

/** Fill a <table> with a header row and data rows (cells: text or a Node). */
function table(id, head, rows, empty) {
  const node = $(id);
  node.replaceChildren();
  const thead = el("thead");
  const top = el("tr");
  for (const h of head) {
    const th = el("th", h);
    th.scope = "col";
    top.append(th);
  }
  thead.append(top);
  const tbody = el("tbody");
  for (const row of rows) {
    const tr = el("tr");
    for (const cell of row) {
      const td = el("td");
      if (cell instanceof Node) td.append(cell);
      else td.textContent = cell === null || cell === undefined ? "–" : String(cell);
      tr.append(td);
    }
    tbody.append(tr);
  }
  if (!rows.length) {
    const tr = el("tr");
    const td = el("td", empty);
    td.colSpan = head.length;
    tr.append(td);
    tbody.append(tr);
  }
  node.append(thead, tbody);
}

/** The value of a metric without labels (or summed over its labels). */
function value(metrics, name) {
  const samples = metrics[name];
  if (!samples) return null;
  return samples.reduce((sum, s) => sum + (s.value || 0), 0);
}

function modelAction(model, action, label) {
  const button = el("button", label, "small");
  button.type = "button";
  button.setAttribute("aria-label", `${label} ${model.id}`);
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      // a Hugging Face style owner/name keeps its slash: the route takes two segments
      const path = model.id.split("/").map(encodeURIComponent).join("/");
      await api(`/v1/models/${path}/${action}`, { method: "POST", body: {} });
    } catch (error) {
      $("models-status").textContent = `${label} ${model.id}: ${error.message}`;
      if (error instanceof AuthError) onAuth();
    }
    refresh();
  });
  return button;
}

// Loading, pinning, pulling and removing models are an admin key's (403 for another):
// their controls are shown to an admin key only (or on a server without keys).
function renderModels(models, admin) {
  $("pull-form").hidden = !admin;
  const rows = models.map((m) => {
    const actions = el("span", null, "actions");
    if (admin && !m.parent) {
      if (m.state === "loaded") actions.append(modelAction(m, "unload", "Unload"));
      else if (m.state !== "loading") actions.append(modelAction(m, "load", "Load"));
      actions.append(modelAction(m, m.pinned ? "unpin" : "pin", m.pinned ? "Unpin" : "Pin"));
      if (m.added && m.state !== "loaded") actions.append(removeButton(m, refresh, onAuth));
    }
    return [
      m.id,
      m.parent ? `adapter of ${m.parent}` : m.task || "generate",
      (m.state || "").replace("_", " "),
      m.pinned ? "yes" : "no",
      m.parent ? "shared with its base" : bytes(m.memory_bytes),
      m.context_length,
      actions,
    ];
  });
  table("models", ["Model", "Kind", "State", "Pinned", "Weights", "Context", "Actions"], rows, "no models");
}

function renderMetrics(health, json) {
  const m = json.metrics;
  pairs("engine", [
    ["State", health.engine],
    ["Running", health.running],
    ["Waiting", health.waiting],
    ["Restarts", health.restarts],
    ["Embedding jobs", `${health.jobs.running} running, ${health.jobs.waiting} waiting`],
    ["Reason", health.reason || "–"],
  ]);
  const mem = health.memory;
  pairs("memory", [
    ["Weights", bytes(mem.weights_bytes)],
    ["KV reserved", bytes(mem.kv_reserved_bytes)],
    ["Prefix cache", `${bytes(mem.prefix_cache_bytes)} of ${bytes(mem.prefix_cache_budget_bytes)}`],
    ["Disk cache", bytes(value(m, "mlxcore_prefix_cache_disk_bytes"))],
    ["MLX active", bytes(mem.mlx_active_bytes)],
    ["MLX buffer cache", bytes(mem.mlx_cache_bytes)],
    ["Limit", bytes(value(m, "mlxcore_memory_limit_bytes"))],
  ]);
  const hits = value(m, "mlxcore_prefix_cache_hits") || 0;
  const misses = value(m, "mlxcore_prefix_cache_misses") || 0;
  const prompt = value(m, "mlxcore_prompt_tokens_total") || 0;
  const cached = value(m, "mlxcore_cached_prompt_tokens_total") || 0;
  const reasons = Object.keys(m)
    .filter((k) => k.startsWith("mlxcore_prefix_cache_lookups_") && value(m, k))
    .map((k) => `${k.slice("mlxcore_prefix_cache_lookups_".length).replace(/_/g, " ")}: ${value(m, k)}`);
  pairs("cache", [
    ["Hit rate", hits + misses ? `${((100 * hits) / (hits + misses)).toFixed(1)} % (${hits} of ${hits + misses})` : "no lookups yet"],
    ["Prompt tokens reused", prompt ? `${cached} of ${prompt} (${((100 * cached) / prompt).toFixed(1)} %)` : "–"],
    ["Entries", value(m, "mlxcore_prefix_cache_entries") ?? "–"],
    ["Lookups by outcome", reasons.length ? reasons.join(", ") : "–"],
  ]);
  const spec = Object.keys(m).filter((k) => k.startsWith("mlxcore_speculative_"));
  pairs(
    "speculative",
    spec.length
      ? [
          ["Acceptance", `${fixed(100 * (value(m, "mlxcore_speculative_acceptance") || 0), 1)} %`],
          ["Tokens per step", fixed(value(m, "mlxcore_speculative_tokens_per_step"))],
          ["Rounds", value(m, "mlxcore_speculative_rounds") ?? "–"],
          ["Drafted / accepted", `${value(m, "mlxcore_speculative_drafted") ?? "–"} / ${value(m, "mlxcore_speculative_accepted") ?? "–"}`],
        ]
      : [["Decoder", "none (plain decoding)"]],
  );
  const byRoute = new Map();
  for (const s of m.mlxcore_http_responses_total || []) {
    const key = `${s.labels.method} ${s.labels.route}`;
    const row = byRoute.get(key) || { count: 0, errors: 0 };
    row.count += s.value;
    if (Number(s.labels.status) >= 400) row.errors += s.value;
    byRoute.set(key, row);
  }
  table(
    "routes",
    ["Route", "Responses", "Errors (4xx, 5xx)"],
    [...byRoute.entries()].sort((a, b) => b[1].count - a[1].count).map(([k, r]) => [k, r.count, r.errors]),
    "no requests yet",
  );
  table(
    "recent",
    ["Finished", "Model", "Finish", "Prompt", "Cached", "Completion", "TTFT (s)", "Tokens/s", "Total (s)"],
    json.recent_requests.map((r) => [
      new Date(r.finished_at * 1000).toLocaleTimeString(),
      r.model,
      r.finish_reason,
      r.prompt_tokens,
      r.prompt_tokens ? `${r.cached_tokens} (${Math.round((100 * r.cached_tokens) / r.prompt_tokens)} %)` : r.cached_tokens,
      r.completion_tokens,
      fixed(r.ttft_seconds),
      fixed(r.tokens_per_second, 1),
      fixed(r.seconds),
    ]),
    "no finished requests yet",
  );
}

const seconds = (v) => (v >= 1 ? `${v.toFixed(1)} s` : `${Math.round(v * 1000)} ms`);
const CHARTS = [
  { id: "tokens", title: "Tokens/s (all requests)", format: (v) => v.toFixed(0),
    series: [{ key: "tokens_per_second", label: "tokens/s" }] },
  { id: "latency", title: "Latency", format: seconds,
    series: [{ key: "ttft_p50", label: "TTFT p50" }, { key: "ttft_p95", label: "TTFT p95" },
             { key: "itl_p95", label: "inter-token p95" }] },
  { id: "requests", title: "Requests", format: (v) => v.toFixed(0),
    series: [{ key: "running", label: "running" }, { key: "waiting", label: "waiting" }] },
  { id: "memory", title: "Memory", format: bytes,
    series: [{ key: "memory_active_bytes", label: "MLX active" }, { key: "kv_bytes", label: "KV reserved" },
             { key: "prefix_cache_bytes", label: "prefix cache" }, { key: "expert_cache_bytes", label: "expert cache" }] },
  { id: "hits", title: "Prefix-cache hit rate (prompt tokens reused)", format: (v) => `${Math.round(v * 100)} %`, max: 1,
    series: [{ key: "prefix_hit_rate", label: "hit rate" }] },
];

const WINDOW = 900;
let points = [];
let fetchedAt = 0;

/** The history's points: the whole window once, then only what came since (merged). */
async function history() {
  const since = points.length ? Math.ceil((Date.now() - fetchedAt) / 1000) + 3 : null;
  const answer = await api(since ? `/metrics/history?seconds=${since}` : "/metrics/history");
  fetchedAt = Date.now();
  const newest = points.length ? points[points.length - 1].t : -Infinity;
  points = points.concat(answer.points.filter((p) => p.t > newest)).slice(-WINDOW);
  return { points };
}

function renderHistory(history) {
  const box = $("charts");
  if (!box.children.length) {
    for (const c of CHARTS) {
      const figure = el("figure", null, "chart");
      figure.append(el("h3", c.title));
      const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
      svg.id = `chart-${c.id}`;
      svg.setAttribute("role", "img");
      const list = el("ul", null, "legend");
      legend(list, c.series);
      figure.append(svg, list);
      box.append(figure);
    }
  }
  for (const c of CHARTS) drawChart($(`chart-${c.id}`), history.points, c.series, c.format, c.max);
}

async function health() {
  // 503 still carries the body (an engine restarting or failed): read it either way
  const response = await fetch("/health");
  return response.json();
}

export async function refresh() {
  try {
    const [h, models, json, recent, me] = await Promise.all([
      health(),
      api("/v1/models"),
      api("/metrics/json"),
      history(),
      api("/v1/me"),
    ]);
    renderModels(models.data, me.role === "admin");
    renderMetrics(h, json);
    renderHistory(recent);
    $("dash-status").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    $("dash-status").textContent = error.message;
    if (error instanceof AuthError) {
      stopDashboard();
      onAuth();
    }
  }
}

export function startDashboard() {
  if (timer) return;
  refresh();
  timer = setInterval(() => document.visibilityState === "visible" && refresh(), PERIOD_MS);
}

export function stopDashboard() {
  clearInterval(timer);
  timer = null;
}

export function initDashboard(authNeeded) {
  onAuth = authNeeded;
  initPulls(() => refresh(), () => onAuth());
}
