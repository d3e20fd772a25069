// The report page: draws RUN, METRICS, INTERVALS and SCALING (embedded by
// report.c) with Chart.js. Each chart says in #render-status how many points
// it drew, which the headless-browser test reads; errors go to #errors.
"use strict";
const errors = document.getElementById("errors");
function fail(msg) {
  errors.textContent += msg + "\n";
  document.getElementById("render-status").textContent = "error";
}
window.addEventListener("error", (e) => fail("error: " + e.message));
const consoleError = console.error;
console.error = (...a) => { fail("console.error: " + a.join(" ")); consoleError(...a); };

const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const drawn = {};
Chart.defaults.animation = false;
Chart.defaults.maintainAspectRatio = false;
Chart.defaults.font.size = 12;

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function section(title, note, wide) {
  const s = el("section", wide ? { class: "wide" } : {});
  s.appendChild(el("h2", {}, title));
  if (note) s.appendChild(el("p", { class: "note" }, note));
  document.getElementById("page").appendChild(s);
  return s;
}
function canvasIn(s, id, tall) {
  const box = el("div", { class: tall ? "chart tall" : "chart" });
  const c = el("canvas", { id: id });
  box.appendChild(c);
  s.appendChild(box);
  return c;
}
function fmtBytes(b) {
  if (b >= 1 << 30) return (b / (1 << 30)).toFixed(2) + " GiB";
  if (b >= 1 << 20) return (b / (1 << 20)).toFixed(1) + " MiB";
  if (b >= 1 << 10) return (b / (1 << 10)).toFixed(1) + " KiB";
  return b + " B";
}

// Drag across a chart to zoom its x axis; double-click to reset.
function zoomable(chart) {
  const c = chart.canvas;
  let x0 = null;
  c.addEventListener("mousedown", (e) => { x0 = e.offsetX; });
  c.addEventListener("mouseup", (e) => {
    if (x0 === null || Math.abs(e.offsetX - x0) < 5) { x0 = null; return; }
    const s = chart.scales.x, a = s.getValueForPixel(Math.min(x0, e.offsetX)), b = s.getValueForPixel(Math.max(x0, e.offsetX));
    chart.options.scales.x.min = a;
    chart.options.scales.x.max = b;
    chart.update();
    x0 = null;
  });
  c.addEventListener("dblclick", () => {
    delete chart.options.scales.x.min;
    delete chart.options.scales.x.max;
    chart.update();
  });
  return chart;
}

function series(key, scale) {
  const pts = [];
  for (const m of METRICS) if (typeof m[key] === "number") pts.push({ x: m.step, y: m[key] * (scale || 1) });
  return pts;
}
function lineChart(id, s, sets, yTitles, xTitle) {
  const datasets = sets.filter((d) => d.data.length > 0).map((d, i) => ({
    label: d.label, data: d.data, yAxisID: d.axis || "y", borderColor: COLORS[d.color !== undefined ? d.color : i],
    backgroundColor: COLORS[d.color !== undefined ? d.color : i], borderWidth: 1.5, pointRadius: d.points ? 3 : 0,
    showLine: !d.points, tension: 0,
  }));
  const scales = { x: { type: "linear", title: { display: true, text: xTitle || "step" } },
                   y: { title: { display: true, text: yTitles[0] } } };
  if (sets[0].fromZero) scales.y.suggestedMin = 0;
  if (yTitles[1]) scales.y2 = { position: "right", title: { display: true, text: yTitles[1] }, grid: { drawOnChartArea: false } };
  const ch = new Chart(canvasIn(s, id), { type: "line", data: { datasets: datasets },
    options: { parsing: false, interaction: { mode: "nearest", axis: "x", intersect: false }, scales: scales } });
  drawn[id] = datasets.reduce((n, d) => n + d.data.length, 0);
  return zoomable(ch);
}

// A settings table's rows, a name and its value each.
function rowAdder(t) {
  return (k, v) => { const r = el("tr"); r.appendChild(el("th", {}, k)); r.appendChild(el("td", {}, String(v))); t.appendChild(r); };
}

function settings() {
  const s = section("Run", RUN ? null : "run.json was not found: only the metrics are known");
  const t = el("table");
  const add = rowAdder(t);
  const last = METRICS[METRICS.length - 1];
  if (RUN) {
    document.getElementById("command").textContent = RUN.command;
    const g = RUN.settings;
    add("model", g.model + ": " + g.layers + " layers, " + g.heads + " heads, " + g.channels + " channels, vocab " + g.vocab + ", " +
        (g.parameters / 1e6).toFixed(2) + "M parameters");
    const plural = (n, word) => n + " " + word + (n === 1 ? "" : "s");
    const tp = g.tp || 1, pp = g.pp || 1; // tensor-parallel ranks and pipeline stages share their samples
    add("batch", g.batch + " x " + g.seq + " tokens x " + g.grad_accum + (pp > 1 ? " micro-batches" : " accumulation") + " x " +
        plural(g.ranks / (tp * pp), "data-parallel rank"));
    add("strategy", g.strategy + " over " + plural(g.ranks, "rank") + (tp > 1 ? " (tensor parallel " + tp + (g.sp ? ", sequence parallel" : "") + ")" : "") +
        (pp > 1 ? " (" + pp + " pipeline stages, " + g.pp_schedule + ")" : "") + ", " + plural(g.threads_per_rank, "thread") + " each");
    if (g.precision !== undefined)
      add("precision", g.precision === "fp32" ? "fp32" : g.precision + " mixed precision (f32 master weights and optimizer)" +
          (g.grad_comm !== "fp32" ? ", gradients reduced in " + g.grad_comm : "") +
          (g.grad_store !== "fp32" ? ", kept in " + g.grad_store : ""));
    add("optimizer", g.optimizer + ", lr " + Number(g.lr.toPrecision(4)) + " (" + g.schedule + ", warm-up " + g.warmup + ")" +
        (g.grad_clip > 0 ? ", clip " + g.grad_clip : ""));
    add("steps", g.steps_done + " of " + g.steps + " in " + RUN.wall_s.toFixed(1) + " s");
    add("machine", RUN.machine.cpu + "; peak " + RUN.machine.peak_gflops.toFixed(1) + " GFLOP/s (" + RUN.machine.peak_source + ")");
    const d = RUN.device; // --device cuda: the model, its gradients and AdamW's state on the GPU; the memory below is the host's mirrors
    if (d)
      add("GPU", d.name + " (cuda:" + d.ordinal + "): " + (d.memory_used_bytes / 2 ** 30).toFixed(2) + " of " +
          (d.memory_total_bytes / 2 ** 30).toFixed(2) + " GiB in use at the end; attention: " + d.attention + (d.tf32 ? "; TF32 matmuls" : "") +
          "; the memory figures below are the host's mirrors");
    add("model FLOPs", (RUN.flops_per_step / 1e9).toFixed(3) + " GFLOP per step (6N + 12LTC per token)");
    add("data", g.data);
  }
  add("last step", "step " + last.step + ", loss " + last.loss + (last.mfu !== undefined ? ", MFU " + (100 * last.mfu).toFixed(1) + "%" : ""));
  s.appendChild(t);
}

// Averages of each phase over groups of steps, so a long run stays readable.
// A second-order optimizer's preconditioning is its own phase: taken out of forward and backward (K-FAC's factors
// are made there) and out of the optimizer's time (the rest of it), so the bars still stack to the step.
function phaseValue(m, k) {
  const inF = m.precondition_in_forward_ms || 0, inB = m.precondition_in_backward_ms || 0, all = m.precondition_ms || 0;
  if (k === "forward_ms") return (m.forward_ms || 0) - inF;
  if (k === "backward_ms") return (m.backward_ms || 0) - inB;
  if (k === "optimizer_ms") return (m.optimizer_ms || 0) - (all - inF - inB);
  return m[k] || 0;
}

function phases() {
  const keys = [["forward_ms", "forward"], ["backward_ms", "backward"], ["optimizer_ms", "optimizer"],
                ["comm_exposed_ms", "exposed communication"], ["data_ms", "data"]];
  if (METRICS.some(m => m.precondition_ms > 0)) keys.splice(2, 0, ["precondition_ms", "preconditioning"]);
  const group = Math.max(1, Math.ceil(METRICS.length / 200)), labels = [], sums = keys.map(() => []);
  for (let i = 0; i < METRICS.length; i += group) {
    const part = METRICS.slice(i, i + group);
    labels.push(part.length > 1 ? part[0].step + "-" + part[part.length - 1].step : String(part[0].step));
    keys.forEach(([k], j) => sums[j].push(part.reduce((a, m) => a + phaseValue(m, k), 0) / part.length));
  }
  const s = section("Time per phase (ms per step)", group > 1 ? "each bar averages " + group + " steps" : null);
  const datasets = keys.map(([, name], j) => ({ label: name, data: sums[j], backgroundColor: COLORS[j] }));
  new Chart(canvasIn(s, "chart-phases"), { type: "bar", data: { labels: labels, datasets: datasets },
    options: { scales: { x: { stacked: true, title: { display: true, text: "step" } }, y: { stacked: true, title: { display: true, text: "ms" } } } } });
  drawn["chart-phases"] = labels.length * keys.length;
}

// A rank's place in words: "rank 3: DP 1, stage 1, TP 1" (only the axes the run splits), or "rank 3".
function role(rank) {
  const p = RUN && RUN.placement ? RUN.placement.find((x) => x.rank === rank) : null, g = RUN ? RUN.settings : {};
  if (!p) return "rank " + rank;
  const dp = g.ranks / ((g.tp || 1) * (g.pp || 1) * (g.cp || 1)), parts = [];
  if (dp > 1) parts.push("DP " + p.dp);
  if ((g.pp || 1) > 1) parts.push("stage " + p.pp);
  if ((g.cp || 1) > 1) parts.push("CP " + p.cp);
  if ((g.tp || 1) > 1) parts.push("TP " + p.tp);
  return "rank " + rank + (parts.length ? ": " + parts.join(", ") : "");
}

// Every rank's memory by category (stages and TP ranks hold different parts): one stacked bar a rank.
function memory() {
  if (!RUN) return;
  const cats = ["parameters", "gradients", "optimizer", "buffers", "activations"];
  const ranks = RUN.memory_per_rank && RUN.memory_per_rank.length ? RUN.memory_per_rank
              : RUN.memory_bytes ? [Object.assign({ rank: 0, buffers: 0 }, RUN.memory_bytes)] : [];
  if (!ranks.length) return;
  const s = section("Memory per rank", "MiB; other: the rest of the peak resident size (libraries, scratch)");
  const sets = cats.concat(["other"]).map((c, i) => ({ label: c, backgroundColor: COLORS[i],
    data: ranks.map((r) => (c === "other" ? Math.max(0, r.peak_rss - cats.reduce((a, k) => a + (r[k] || 0), 0)) : r[c] || 0) / 1048576) }));
  new Chart(canvasIn(s, "chart-memory", ranks.length > 4), { type: "bar", data: { labels: ranks.map((r) => role(r.rank)), datasets: sets },
    options: { indexAxis: "y", scales: { x: { stacked: true, title: { display: true, text: "MiB" } }, y: { stacked: true } } } });
  drawn["chart-memory"] = sets.length * ranks.length;
}

// A pipeline's idle share of each step, measured and as its schedule replayed with the measured durations predicts.
function bubble() {
  const b = series("bubble", 100);
  if (!b.length) return;
  lineChart("chart-bubble", section("Pipeline bubble", "the stages' idle share of each step (the mean over the stages)"),
            [{ label: "bubble %", data: b, fromZero: true }, { label: "the schedule replayed %", data: series("bubble_model", 100) }],
            ["% of the step"]);
}

// A gradient codec's wire (--compress): the bytes a rank sent for the gradients each step, and the elements they hold
// over those that travelled.
function compression() {
  const b = series("grad_sent_bytes", 1 / 1048576);
  if (!b.length) return;
  lineChart("chart-compression", section("Gradient compression", "what a rank put on the wire for the gradients each step, and the compression ratio"),
            [{ label: "MiB sent a step", data: b, fromZero: true }, { label: "compression ratio", data: series("compress_ratio"), axis: "y2" }],
            ["MiB a step", "ratio"]);
}

// A mixture of experts: each step's most chosen expert over the mean (the worst layer's and the layers' average), and
// the same over each evaluation's held-out batches (1: balanced).
function experts() {
  const w = series("expert_load_max_mean");
  if (!w.length) return;
  lineChart("chart-experts", section("Experts' load", "the most chosen expert over the mean, 1 when balanced: a step's batch, and an evaluation's batches"),
            [{ label: "step, worst layer", data: w }, { label: "step, layers' average", data: series("expert_load_max_mean_avg") },
             { label: "validation, worst layer", data: series("val_expert_load_max_mean"), points: true }], ["max / mean"]);
}

// Reinforcement learning on a language model (--grpo): the rollouts' mean reward and the KL to the reference by step.
function rewards() {
  const r = series("reward");
  if (!r.length) return;
  lineChart("chart-reward", section("Reward and KL (GRPO)", "each step's completions' mean reward, and the mean KL estimate a completion token to the starting model"),
            [{ label: "mean reward", data: r }, { label: "KL", data: series("kl"), axis: "y2", fromZero: true }],
            ["reward", "KL"]);
}

// Over the traced steps, each rank's time computing, waiting on communication and idle (neither): a table.
function rankTimes() {
  if (!INTERVALS || !INTERVALS.length) return;
  const by = new Map();
  for (const iv of INTERVALS) {
    const r = by.get(iv[0]) || { lo: Infinity, hi: -Infinity, compute: 0, wait: 0 };
    r.lo = Math.min(r.lo, iv[2]);
    r.hi = Math.max(r.hi, iv[3]);
    if (iv[1] === 0 && /^(forward|backward|optimizer)/.test(iv[4])) r.compute += iv[3] - iv[2];
    if (/^wait/.test(iv[4])) r.wait += iv[3] - iv[2];
    by.set(iv[0], r);
  }
  const s = section("Time per rank (traced steps)", "ms: computing (forward, backward, optimizer), waiting on its peers, " +
                    "and idle (neither: a pipeline's bubble, the data, the rest)");
  const t = el("table"), h = el("tr");
  ["rank", "compute", "wait", "idle", "span"].forEach((k) => h.appendChild(el("th", {}, k)));
  t.appendChild(h);
  for (const [rank, r] of [...by.entries()].sort((a, b) => a[0] - b[0])) {
    const span = r.hi - r.lo, tr = el("tr");
    tr.appendChild(el("td", {}, role(rank)));
    [r.compute, r.wait, Math.max(0, span - r.compute - r.wait), span].forEach((v) => tr.appendChild(el("td", { class: "num" }, v.toFixed(1))));
    t.appendChild(tr);
  }
  s.appendChild(t);
  drawn["table-rank-times"] = by.size;
}

function io() {
  if (!RUN || !RUN.io) return;
  const s = section("I/O per rank");
  const t = el("table"), h = el("tr");
  ["rank", "tokens read", "time", "checkpoints written", "time"].forEach((k) => h.appendChild(el("th", {}, k)));
  t.appendChild(h);
  for (const r of RUN.io) {
    const tr = el("tr");
    [r.rank, fmtBytes(r.data_read_bytes), (r.data_read_s * 1e3).toFixed(1) + " ms", fmtBytes(r.ckpt_write_bytes),
     (r.ckpt_write_s * 1e3).toFixed(1) + " ms"].forEach((v) => tr.appendChild(el("td", { class: "num" }, String(v))));
    t.appendChild(tr);
  }
  s.appendChild(t);
}

// Each rank's tracks as rows, each event a bar from its start to its end.
function timeline() {
  if (!INTERVALS || INTERVALS.length === 0) return;
  const tracks = ["compute", "communication", "data", "checkpoint I/O", "GPU"];
  const kinds = [["forward", /^forward/], ["backward", /^backward/], ["optimizer", /^optimizer/], ["wait (exposed)", /^wait/],
                 ["collective", /^(allreduce|allgather|reduce|broadcast|barrier|alltoall|gather|scatter|send|recv|sendrecv)/],
                 ["data", /batch|token/], ["checkpoint", /checkpoint/], ["evaluation", /^evaluation/]];
  const rows = [], sets = kinds.map(([name], i) => ({ label: name, data: [], backgroundColor: COLORS[i], borderColor: COLORS[i],
                                                         borderWidth: 0, minBarLength: 2, barPercentage: 0.8, categoryPercentage: 1, grouped: false,
                                                         order: name === "evaluation" ? 1 : 0 }));
  let t0 = Infinity;
  for (const iv of INTERVALS) t0 = Math.min(t0, iv[2]);
  for (const iv of INTERVALS) {
    const k = kinds.findIndex(([, re]) => re.test(iv[4]));
    if (k < 0) continue; // "step" and "finish gradients" contain the others
    const row = role(iv[0]) + " " + tracks[iv[1]];
    if (!rows.includes(row)) rows.push(row);
    sets[k].data.push({ x: [iv[2] - t0, iv[3] - t0], y: row, name: iv[4], args: iv[5] });
  }
  // idle: the gaps between a rank's compute-track events (a pipeline stage waiting for its neighbour shows as these)
  const idle = { label: "idle", data: [], backgroundColor: "#dddddd", borderColor: "#dddddd", borderWidth: 0, minBarLength: 1,
                 barPercentage: 0.8, categoryPercentage: 1, grouped: false, order: 2 };
  for (const rank of new Set(INTERVALS.map((iv) => iv[0]))) {
    const evs = INTERVALS.filter((iv) => iv[0] === rank && iv[1] === 0 && kinds.some(([, re]) => re.test(iv[4]))).sort((a, b) => a[2] - b[2]);
    let end = evs.length ? evs[0][3] : 0;
    for (const iv of evs.slice(1)) {
      if (iv[2] - end > 0.01) idle.data.push({ x: [end - t0, iv[2] - t0], y: role(rank) + " " + tracks[0], name: "idle", args: "" });
      end = Math.max(end, iv[3]);
    }
  }
  if (idle.data.length) sets.push(idle);
  rows.sort((a, b) => a.localeCompare(b, "en", { numeric: true }));
  const ranks = new Set(INTERVALS.map((iv) => iv[0])).size;
  const s = section("Timeline (" + ranks + " rank" + (ranks > 1 ? "s" : "") + ")",
                    "from the trace: drag to zoom, double-click to reset, hover for names, bytes and algorithms", true);
  const ch = new Chart(canvasIn(s, "chart-timeline", true), { type: "bar",
    data: { labels: rows, datasets: sets.filter((d) => d.data.length > 0) },
    options: { indexAxis: "y", parsing: { xAxisKey: "x", yAxisKey: "y" },
      scales: { x: { type: "linear", title: { display: true, text: "ms since the first traced event" } }, y: { type: "category" } },
      plugins: { tooltip: { callbacks: { label: (c) => { const d = c.raw; return d.name + ": " + (d.x[1] - d.x[0]).toFixed(3) + " ms " + d.args; } } } } } });
  drawn["chart-timeline"] = sets.reduce((n, d) => n + d.data.length, 0);
  zoomable(ch);
}

function scaling() {
  if (!SCALING || !SCALING.length) return;
  const s = section("Scaling (dtrain bench train)", "total tok/s against ideal (ranks x one rank's) and the PyTorch DDP baseline, same run");
  const one = SCALING.find((r) => r.nproc === 1) || SCALING[0], base = one.tok_per_s / one.nproc;
  const sets = [{ label: "dtrain", data: SCALING.map((r) => ({ x: r.nproc, y: r.tok_per_s })) },
                { label: "ideal", data: SCALING.map((r) => ({ x: r.nproc, y: base * r.nproc })) }];
  if (SCALING.some((r) => typeof r.torch_tok_per_s === "number"))
    sets.push({ label: "PyTorch DDP", data: SCALING.filter((r) => typeof r.torch_tok_per_s === "number").map((r) => ({ x: r.nproc, y: r.torch_tok_per_s })) });
  const datasets = sets.map((d, i) => ({ label: d.label, data: d.data, borderColor: COLORS[i], backgroundColor: COLORS[i], pointRadius: 4 }));
  new Chart(canvasIn(s, "chart-scaling"), { type: "line", data: { datasets: datasets },
    options: { parsing: false, scales: { x: { type: "linear", ticks: { stepSize: 1 }, title: { display: true, text: "ranks" } }, y: { title: { display: true, text: "tok/s (all ranks)" } } } } });
  drawn["chart-scaling"] = datasets.reduce((n, d) => n + d.data.length, 0);
}

// A reinforcement-learning run (dtrain rl --report): its settings, the mean return and the losses by environment
// steps, the throughput, and the film of the trained policy's episode.
function rlSettings() {
  const s = section("Run"), t = el("table"), g = RUN.settings;
  const add = rowAdder(t);
  document.getElementById("command").textContent = RUN.command;
  add("algorithm", g.algo.toUpperCase() + " on " + g.env);
  add("rollouts", g.envs + " environments x " + g.rollout_steps + " steps, over " + g.ranks + (g.ranks === 1 ? " rank" : " ranks"));
  const n = (x) => Number(x.toPrecision(4)); // the settings are floats
  add("updates", g.epochs + " epochs x " + g.minibatches + " minibatches; lr " + n(g.lr) + (g.anneal_lr ? " annealed to 0" : "") +
      ", gamma " + n(g.gamma) + ", lambda " + n(g.gae_lambda) + ", clip " + n(g.clip) + ", entropy " + n(g.ent_coef));
  add("networks", "actor and critic, two hidden layers of " + g.hidden);
  add("outcome", RUN.env_steps + " environment steps in " + RUN.updates + " updates and " + RUN.wall_s.toFixed(1) + " s, " +
      RUN.episodes + " episodes; mean return of the last 100: " + RUN.mean_return.toFixed(2));
  add("machine", RUN.machine.cpu);
  s.appendChild(t);
}
function bySteps(key, needEpisodes) {
  const pts = [];
  for (const m of METRICS) if (typeof m[key] === "number" && (!needEpisodes || m.episodes > 0)) pts.push({ x: m.env_steps, y: m[key] });
  return pts;
}
function film() {
  if (!FILM) return;
  const f = RUN.film, s = section("An episode of the trained policy", f ? "greedy actions from reset(seed " + RUN.settings.seed +
    "): return " + f.return.toFixed(1) + " in " + f.steps + " steps; the film loops" : null);
  const d = el("div");
  d.className = "film";
  d.innerHTML = FILM;
  s.appendChild(d);
  drawn["film"] = d.querySelectorAll("animate").length;
}
const rlParts = [
  rlSettings,
  () => lineChart("chart-return", section("Mean return", "over the last 100 finished episodes, after each update"),
                  [{ label: "mean return", data: bySteps("mean_return", true) }], ["return"], "environment steps"),
  () => lineChart("chart-rl-loss", section("Losses", "each update's mean over its minibatches"),
                  [{ label: "policy loss", data: bySteps("pg_loss") }, { label: "entropy", data: bySteps("entropy") },
                   { label: "value loss", data: bySteps("v_loss"), axis: "y2" }], ["policy loss, entropy", "value loss"], "environment steps"),
  () => lineChart("chart-rl-throughput", section("Throughput"), [{ label: "environment steps/s (all ranks)", data: bySteps("steps_per_s") }],
                  ["steps/s"], "environment steps"),
  film,
];

// An image model's run (dtrain train --model mlp|resnet... --report): its settings and outcome, the loss, the learning rate
// and gradient norm, and the test accuracy by step (an epoch's line has no step: its last, from steps_per_epoch).
function imageSettings() {
  const s = section("Run"), t = el("table"), g = RUN.settings;
  const add = rowAdder(t);
  document.getElementById("command").textContent = RUN.command;
  add("model", g.model + ": " + (g.parameters / 1e6).toFixed(3) + "M parameters; data " + g.data);
  add("batch", g.images_per_step + " images a step (" + g.batch + " a rank x " + g.grad_accum + " accumulation x " + g.ranks +
      (g.ranks === 1 ? " rank" : " ranks") + "), " + g.strategy);
  add("optimizer", g.optimizer + ", lr " + Number(g.lr.toPrecision(4)));
  add("steps", g.steps_done + " (" + g.epochs + " epochs of " + g.steps_per_epoch + ") in " + RUN.wall_s.toFixed(1) + " s");
  add("outcome", "test accuracy " + (100 * RUN.test_accuracy).toFixed(2) + "%, " + RUN.img_per_s.toFixed(0) + " img/s (all ranks)");
  add("machine", RUN.machine.cpu);
  s.appendChild(t);
}
function accuracy() {
  const per = RUN.settings.steps_per_epoch, pts = [];
  for (const m of METRICS)
    if (typeof m.test_accuracy === "number") pts.push({ x: typeof m.step === "number" ? m.step : m.epoch * per, y: 100 * m.test_accuracy });
  return pts;
}
const imageParts = [
  imageSettings,
  () => lineChart("chart-loss", section("Loss"), [{ label: "training loss", data: series("loss") }], ["cross-entropy"]),
  () => lineChart("chart-lr", section("Learning rate and gradient norm"), [{ label: "learning rate", data: series("lr"), fromZero: true },
                  { label: "gradient norm", data: series("grad_norm"), axis: "y2" }], ["learning rate", "gradient norm"]),
  () => lineChart("chart-accuracy", section("Test accuracy"), [{ label: "test accuracy %", data: accuracy(), points: true }], ["%"]),
];

// Each part on its own: one that fails (say, a run.json from another
// version) is named in #errors and the others still draw.
const trainParts = [
  settings,
  () => lineChart("chart-loss", section("Loss"), [{ label: "training loss", data: series("loss") },
                  { label: "validation loss", data: series("val_loss"), points: true }], ["nats per token"]),
  () => lineChart("chart-lr", section("Learning rate and gradient norm"), [{ label: "learning rate", data: series("lr"), fromZero: true },
                  { label: "gradient norm", data: series("grad_norm"), axis: "y2" }], ["learning rate", "gradient norm"]),
  () => lineChart("chart-throughput", section("Throughput and MFU"), [{ label: "tok/s (all ranks)", data: series("tok_per_s") },
                  { label: "MFU %", data: series("mfu", 100), axis: "y2" }], ["tok/s", "MFU %"]),
  experts, rewards, phases, bubble, compression, memory, rankTimes, timeline, scaling, io,
];
for (const part of RUN && RUN.kind === "rl" ? rlParts : RUN && RUN.kind === "images" ? imageParts : trainParts) {
  try { part(); } catch (e) { fail("error in " + (part.name || "a chart") + ": " + e.message); }
}
const status = document.getElementById("render-status");
if (status.textContent !== "error") {
  status.textContent = "ok";
  status.setAttribute("data-charts", JSON.stringify(drawn));
  status.hidden = true; // for the tests that read the page; a reader sees only an error
}
