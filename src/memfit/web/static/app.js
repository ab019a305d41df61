// memfit calculator page: the form is built from /api/schema (the one flags table), the state
// lives in the URL's query, answers come from /api/estimate|plan|fit|upgrade (the CLI's --json).
// Hand-written, no libraries, nothing fetched from elsewhere.
"use strict";

const COLORS = {
  parameters: "#4e79a7", gradients: "#f28e2b", optimizer_states: "#e15759",
  activations: "#76b7b2", kv_cache: "#59a14f", temporary: "#edc948",
};
const $ = (id) => document.getElementById(id);
const SVGNS = "http://www.w3.org/2000/svg";
let schema = null;
let lastEstimate = null;
let generation = 0;

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  for (const [u, s] of units) if (Math.abs(n) >= s) return (n / s).toFixed(2) + " " + u;
  return n + " B";
}

function el(tag, attrs = {}, text = null) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== null) e.textContent = text;
  return e;
}

function svgEl(tag, attrs = {}, text = null) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== null) e.textContent = text;
  return e;
}

// -- the form ---------------------------------------------------------------------------------
function field(f) {
  const id = "f-" + f.key;
  const label = el("label", { title: f.help || "" }, f.key + " ");
  let input;
  if (f.kind === "choice") {
    input = el("select", { id, name: f.key });
    if (f.default === null) input.appendChild(el("option", { value: "" }, "(default)"));
    for (const c of f.choices) input.appendChild(el("option", { value: c }, c));
    if (f.default !== null) input.value = String(f.default);
  } else if (f.kind === "switch") {
    input = el("input", { id, name: f.key, type: "checkbox" });
  } else {
    input = el("input", { id, name: f.key, type: f.kind === "int" ? "number" : "text" });
    if (f.default !== null && f.default !== undefined) input.placeholder = String(f.default);
  }
  input.dataset.default = f.default === null || f.default === undefined ? "" : String(f.default);
  if (f.always) input.dataset.always = "1";  // the shape and the precision: always in the URL
  label.appendChild(input);
  return label;
}

function buildForm() {
  for (const m of schema.models) $("models").appendChild(el("option", { value: m.name }));
  for (const g of schema.gpus) $("f-gpu").appendChild(el("option", { value: g.name }, g.name));
  for (const e of schema.engines) $("f-engine").appendChild(el("option", { value: e }, e));
  $("f-engine").value = "analytic";
  for (const f of schema.workload) $("workload").appendChild(field(f));
  $("version").textContent = "memfit " + schema.version;
}

function inputs() {
  return Array.from(document.querySelectorAll("#job [name]"));
}

// The page's state: every field that differs from its default (the URL holds exactly this).
function state() {
  const q = new URLSearchParams();
  for (const i of inputs()) {
    if (i.type === "checkbox") { if (i.checked) q.set(i.name, "1"); continue; }
    const v = i.value.trim() || (i.dataset.always ? i.dataset.default : "");
    if (v === "" || (!i.dataset.always && i.dataset.default !== undefined && v === i.dataset.default)) continue;
    q.set(i.name, i.name === "config" ? JSON.stringify(JSON.parse(v)) : v);
  }
  if (!q.has("engine")) q.set("engine", $("f-engine").value);
  return q;
}

function loadState() {
  const q = new URLSearchParams(location.search);
  for (const i of inputs()) {
    if (!q.has(i.name)) continue;
    if (i.type === "checkbox") i.checked = q.get(i.name) === "1";
    else i.value = q.get(i.name);
  }
  if (q.get("config")) $("paste").open = true;
  if (!q.get("model") && !q.get("config")) $("f-model").value = "llama-3.2-1b";
  return q.get("view");
}

function query(extra = {}) {
  let q;
  try { q = state(); } catch (e) { throw new Error("memfit: error: the pasted config is not valid JSON: " + e.message); }
  for (const [k, v] of Object.entries(extra)) { if (v === null) q.delete(k); else q.set(k, v); }
  return q;
}

// Keys each command takes (the CLI's own options), so one page state serves them all. plan and
// upgrade get every job field too: the server carries the techniques they search (quant,
// checkpointing ...) as what they take where they can, and names the rest (X-Memfit-Not-Taken).
function queryFor(command, extra = {}) {
  const keys = new Set(schema.options[command].map((o) => o.key));
  if (command === "plan" || command === "upgrade") for (const o of schema.options.estimate) keys.add(o.key);
  const q = query(extra), out = new URLSearchParams();
  for (const [k, v] of q) if (k === "model" || k === "config" || keys.has(k)) out.append(k, v);
  return out;
}

async function api(command, q) {
  const r = await fetch("/api/" + command + "?" + q.toString());
  const body = await r.json();
  if (!r.ok && body.error) throw new Error(body.error);
  return { body, exit: r.headers.get("X-Memfit-Exit"), command: r.headers.get("X-Memfit-Command"), notTaken: r.headers.get("X-Memfit-Not-Taken") };
}

// -- rendering ---------------------------------------------------------------------------------
function setBytes(id, n) { const e = $(id); e.textContent = fmtBytes(n); e.dataset.bytes = String(n); }

function stackedBars(rows, width = 720) {
  const left = 110, barH = 24, gap = 12, pw = width - left - 90;
  const total = Math.max(1, ...rows.map(([, parts]) => parts.reduce((s, [, v]) => s + v, 0)));
  const h = rows.length * (barH + gap) + 10;
  const svg = svgEl("svg", { viewBox: `0 0 ${width} ${h}`, class: "chart", role: "img" });
  rows.forEach(([label, parts], i) => {
    const y = 6 + i * (barH + gap);
    svg.appendChild(svgEl("text", { x: left - 8, y: y + 16, class: "ytick" }, label));
    let x = left;
    for (const [name, v] of parts) {
      const w = (v / total) * pw;
      if (w <= 0) continue;
      const r = svgEl("rect", { x, y, width: w, height: barH, fill: COLORS[name] || "#999", "data-component": name, "data-bytes": v });
      r.appendChild(svgEl("title", {}, name + ": " + fmtBytes(v)));
      svg.appendChild(r);
      if (w > 80) svg.appendChild(svgEl("text", { x: x + 4, y: y + 16, class: "inbar" }, name));
      x += w;
    }
    svg.appendChild(svgEl("text", { x: x + 6, y: y + 16 }, fmtBytes(parts.reduce((s, [, v]) => s + v, 0))));
  });
  return svg;
}

function legend() {
  const d = el("div", { class: "legend" });
  for (const [k, c] of Object.entries(COLORS)) {
    const s = el("span", {}, " " + k);
    s.prepend(el("i", { class: "sw sw-" + k }));
    d.appendChild(s);
  }
  return d;
}

// THE verdict (memfit.estimate.verdict): the CLI's --json gives it (fits.verdict, need_bytes,
// limit_bytes, margin_bytes); the banner, the table and the plan's "as asked" only word it, as
// Verdict.text does, and never decide it again.
function verdictClass(verdict) { return verdict === "fits" ? "ok" : verdict === "tight" ? "warn" : "bad"; }
function verdictText(f, gpu) {
  const head = f.verdict + " on " + gpu;
  if (f.verdict === "fits") return head + ": needs " + fmtBytes(f.need_bytes) + " (upper end) of " + fmtBytes(f.limit_bytes) + ", margin " + fmtBytes(f.margin_bytes);
  const point = f.point_bytes ?? f.capacity_bytes - f.free_bytes;  // a Verdict, or an estimate's fits
  if (f.verdict === "tight") return head + ": the estimate (" + fmtBytes(point) + ") fits " + fmtBytes(f.capacity_bytes) + ", but its upper end (" + fmtBytes(f.need_bytes) + ") exceeds the limit " + fmtBytes(f.limit_bytes) + " (" + fmtBytes(f.headroom_bytes) + " headroom): it may run out of memory";
  // one "needs" figure on the page: the upper end (the table's margin is limit - this figure)
  return head + ": needs " + fmtBytes(f.need_bytes) + " (upper end) of its " + fmtBytes(f.limit_bytes) + " limit; even the estimate, " + fmtBytes(point) + ", is " + fmtBytes(point - f.capacity_bytes) + " over its " + fmtBytes(f.capacity_bytes);
}

function renderEstimate(est, command) {
  lastEstimate = { est, command };
  $("answer").hidden = false;
  setBytes("peak-allocated", est.peak_allocated_bytes);
  setBytes("peak-reserved", est.peak_reserved_bytes);
  setBytes("device-used", est.device_used_bytes);
  for (const [id, key] of [["peak-allocated-range", "peak_allocated_bytes"], ["peak-reserved-range", "peak_reserved_bytes"], ["device-used-range", "device_used_bytes"]])
    $(id).textContent = fmtBytes(est[key + "_low"]) + " – " + fmtBytes(est[key + "_high"]);
  $("engine").textContent = est.engine;
  $("params").textContent = (est.model.n_params / 1e6).toFixed(1) + " M params";
  $("peak-phase").textContent = "(" + est.peak_phase + ")";
  const v = $("verdict");
  if (est.fits) {
    v.className = "verdict " + verdictClass(est.fits.verdict);
    v.dataset.verdict = est.fits.verdict;
    v.dataset.needBytes = String(est.fits.need_bytes);
    v.textContent = verdictText(est.fits, est.fits.gpu);
  } else { v.className = "verdict"; delete v.dataset.verdict; delete v.dataset.needBytes; v.textContent = "no GPU chosen: pick one for a verdict"; }
  const comps = Object.entries(est.components);
  $("chart-components").replaceChildren(stackedBars([["at the peak", comps]]), legend());
  $("chart-phases").replaceChildren(stackedBars(Object.entries(est.phases).map(([p, x]) => [p, Object.entries(x.components)])));
  $("notes").replaceChildren(...(est.notes || []).map((n) => el("p", { class: "note" }, n)));
  $("command").textContent = command;
}

async function renderGpuTable(est) {
  const r = await fetch(`/api/gpu-table?device_used_bytes=${est.device_used_bytes}&device_used_bytes_high=${est.device_used_bytes_high}&unified_memory_bytes=${est.unified_memory_bytes || 0}`);
  const rows = await r.json();
  const body = $("gpu-table").tBodies[0];
  body.replaceChildren(...rows.map((g) => {
    const tr = el("tr", { "data-gpu": g.gpu, "data-fits": String(g.fits), "data-verdict": g.verdict, "data-need-bytes": String(g.need_bytes) });
    const price = g.usd_per_hour == null ? "" : `$${Number(g.usd_per_hour).toFixed(2)}/h (${g.price_as_of || "?"})`;
    const cells = [g.gpu, fmtBytes(g.capacity_bytes), fmtBytes(g.free_bytes), g.verdict, fmtBytes(g.margin_bytes), g.memory_bandwidth_gbps ?? "–", g.bf16_dense_tflops ?? "–", price || "–"];
    cells.forEach((c, i) => { const td = el("td", {}, String(c)); if (i === 3) td.className = g.fits ? "good" : g.verdict === "tight" ? "warn" : "bad"; tr.appendChild(td); });
    return tr;
  }));
}

function showError(msg) { const e = $("error"); e.textContent = msg; e.hidden = !msg; }

// -- the flow ----------------------------------------------------------------------------------
async function refresh(opts = {}) {
  const mine = ++generation;
  let q;
  try { q = queryFor("estimate", opts.engine ? { engine: opts.engine } : {}); } catch (e) { showError(e.message); return; }
  history.replaceState(null, "", "?" + query(opts.view ? { view: opts.view } : {}).toString());
  showError("");
  const started = performance.now();
  const heavy = q.get("engine") !== "analytic";
  const word = heavy ? "tracing (the fake-tensor engine runs the model's code)… " : "estimating… ";
  const tick = setInterval(() => { if (mine === generation) $("status").textContent = word + ((performance.now() - started) / 1000).toFixed(0) + " s"; }, 500);
  $("status").textContent = word;
  delete $("status").dataset.state;
  try {
    const { body, command } = await api("estimate", q);
    clearInterval(tick);
    if (mine !== generation) return;
    renderEstimate(body, command);
    $("status").textContent = `${body.engine} engine, ${((performance.now() - started) / 1000).toFixed(2)} s`;
    $("status").dataset.state = "done";
    await renderGpuTable(body);
  } catch (e) {
    if (mine !== generation) return;
    if (!heavy && /--engine trace|trace engine/.test(e.message) && !opts.engine) { clearInterval(tick); return refresh({ engine: "auto" }); }
    $("answer").hidden = true;  // no stale numbers next to the message
    showError(e.message); $("status").textContent = "error"; $("status").dataset.state = "error";
  } finally { clearInterval(tick); }
}

async function runSection(command, target, extra, render) {
  const t = $(target);
  t.replaceChildren(el("p", { class: "muted" }, "running memfit " + command + "…"));
  try {
    const { body, command: line, notTaken } = await api(command, queryFor(command, extra));
    t.replaceChildren(...render(body, notTaken), el("code", {}, line));
    t.dataset.state = "done";
  } catch (e) { t.replaceChildren(el("div", { class: "error" }, e.message)); t.dataset.state = "error"; }
}

function verdictLine(f, gpu, suffix, id) {
  const attrs = { class: f ? ({ fits: "good", tight: "warn" }[f.verdict] || "bad") : "" };
  if (id) attrs.id = id;
  if (f) attrs["data-verdict"] = f.verdict;
  return el("p", attrs, f ? verdictText(f, gpu) + suffix : "choose a GPU for the as-asked verdict");
}

// The form's job (the banner's verdict, the table's row), then, where the planner searches some
// of its fields itself, the job it starts from: two jobs, each named, never one job twice.
function askedLines(body, notTaken, command) {
  const asked = lastEstimate && lastEstimate.est.fits;
  const out = [el("h3", {}, "As asked"), verdictLine(asked, asked && asked.gpu, " (as asked)", "as-asked")];
  if (notTaken && body.as_asked) {
    const from = body.baseline ? " (" + body.baseline.summary + ")" : "";
    out.push(el("p", { class: "note", id: "not-taken" }, "memfit " + command + " does not take " + notTaken + " from the form (it searches the techniques itself): it starts from the job without them" + from + ":"));
    out.push(verdictLine(body.as_asked, body.gpu || (body.budget && body.budget.gpu), " (the planner's start)", "planner-start"));
  }
  return out;
}

function planView(p, notTaken) {
  const out = askedLines(p, notTaken, "plan");
  out.push(el("h3", {}, "Recommended plan"));
  const rec = p.recommended;
  if (rec) {
    out.push(el("p", { id: "plan-recommended" }, rec.summary + " — " + fmtBytes(rec.device_used_bytes) + (rec.tokens_per_s ? ", " + Math.round(rec.tokens_per_s) + " tokens/s" : "")));
    if (p.settings_export && p.settings_export.memfit) out.push(el("code", {}, p.settings_export.memfit));
  } else out.push(el("p", { class: "bad" }, "nothing fits" + (p.closest ? ": closest " + p.closest.summary : "")));
  if (p.alternatives && p.alternatives.length) {
    const ul = el("ul");
    for (const a of p.alternatives) ul.appendChild(el("li", {}, a.summary + " — " + fmtBytes(a.device_used_bytes)));
    out.push(el("h3", {}, "Alternatives"), ul);
  }
  for (const n of p.notes || []) out.push(el("p", { class: "note" }, n));
  return out;
}

function upgradeView(u, notTaken) {
  return [...askedLines(u, notTaken, "upgrade"), el("h3", {}, "Upgrade verdict"), el("p", { id: "upgrade-verdict", class: u.upgrade ? "bad" : "good" }, u.summary || u.verdict)];
}

function fitView(f) {
  const key = Object.keys(f).find((k) => k.startsWith("max_"));
  const answer = key && f[key] !== null ? key.replace("max_", "largest ") + ": " + f[key] : "nothing fits";
  const out = [el("h3", {}, "Largest batch"), el("p", { id: "fit-answer" }, answer + " (limit " + fmtBytes(f.limit_bytes) + " on " + f.gpu + ", confirmed by " + (f.confirmed_by || "none") + ")")];
  for (const n of f.notes || []) out.push(el("p", { class: "note" }, n));
  return out;
}

function copy(text) {
  if (navigator.clipboard) navigator.clipboard.writeText(text).catch(() => {});
  $("status").textContent = "copied";
}

async function main() {
  schema = await (await fetch("/api/schema")).json();
  buildForm();
  const view = loadState();
  let timer = null;
  $("job").addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => refresh(), 250); });
  $("job").addEventListener("submit", (e) => e.preventDefault());
  $("copy-command").addEventListener("click", () => copy($("command").textContent));
  $("copy-json").addEventListener("click", () => copy(JSON.stringify(lastEstimate ? lastEstimate.est : {}, null, 2)));
  $("run-trace").addEventListener("click", () => { $("f-engine").value = "trace"; refresh(); });
  $("run-plan").addEventListener("click", () => { refreshView("plan"); runSection("plan", "plan", { confirm: "none" }, planView); });
  $("run-upgrade").addEventListener("click", () => { refreshView("upgrade"); runSection("upgrade", "upgrade", {}, upgradeView); });
  $("run-fit").addEventListener("click", () => runSection("fit", "fit", { solve: "batch" }, fitView));
  await refresh();
  if (view === "plan") $("run-plan").click();
  if (view === "upgrade") $("run-upgrade").click();
}

function refreshView(view) { history.replaceState(null, "", "?" + query({ view }).toString()); }

document.addEventListener("DOMContentLoaded", () => { main().catch((e) => showError(String(e))); });
