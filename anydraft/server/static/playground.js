// the anydraft playground's script (playground.html): a file of its own, so the page's
// Content-Security-Policy allows no inline script
"use strict";
const $ = (id) => document.getElementById(id);
let apiKey = null;   // memory only, by design: never localStorage or a cookie
let model = null;    // the id the server serves (sent back with each request)
let aborter = null;

function showError(message) { const e = $("error"); e.textContent = message; e.hidden = !message; }

async function api(path, init = {}) {
  const headers = { ...(init.headers || {}) };
  if (apiKey) headers["Authorization"] = "Bearer " + apiKey;
  const r = await fetch(path, { ...init, headers });
  if (r.status === 401) { $("key-form").hidden = false; $("key").focus(); }
  if (!r.ok) {
    let message = `HTTP ${r.status}`;
    try { message = (await r.json()).error.message || message; } catch (_) { /* not JSON */ }
    throw new Error(message);
  }
  return r;
}

async function loadModels() {
  try {
    const info = (await (await api("/v1/models")).json()).data[0];
    const a = info.anydraft || {};
    model = info.id;
    $("m-target").textContent = a.target || info.id;
    $("m-drafter").textContent = a.drafter || "none";
    $("m-method").textContent = a.method || "?";
    $("m-context").textContent = a.context_window || "?";
    document.querySelector("#out-main .method").textContent = a.method || "?";
    $("key-form").hidden = true;
    showError("");
  } catch (err) { showError(err.message); }
}

$("key-ok").addEventListener("click", () => { apiKey = $("key").value.trim() || null; $("key").value = ""; loadModels(); });
$("key").addEventListener("keydown", (ev) => { if (ev.key === "Enter") { ev.preventDefault(); $("key-ok").click(); } });

// one output panel: its text as colored spans, the stats line and the per-step timeline
function Panel(el) {
  const text = el.querySelector(".text"), stats = el.querySelector(".stats"), timeline = el.querySelector(".timeline");
  const p = { steps: 0, tokens: 0, offered: 0, accepted: 0, start: 0, final: null };
  p.reset = () => {
    text.textContent = ""; timeline.textContent = ""; stats.textContent = "";
    Object.assign(p, { steps: 0, tokens: 0, offered: 0, accepted: 0, start: performance.now(), final: null });
    el.dataset.state = "running";
  };
  p.span = (piece, origin) => {
    const last = text.lastElementChild;
    if (last && last.dataset.origin === origin) { last.textContent += piece; return; }
    const s = document.createElement("span");
    s.className = "o-" + origin; s.dataset.origin = origin; s.textContent = piece;
    text.appendChild(s);
  };
  p.step = (st) => {
    p.steps += 1; p.tokens += st.tokens; p.offered += st.offered; p.accepted += st.accepted;
    const bar = document.createElement("div"), h = 9;  // pixels per token
    bar.className = "bar";
    bar.title = `step ${p.steps}: ${st.proposer}, offered ${st.offered}, accepted ${st.accepted}, ` +
                `${st.forced ? `forced by the grammar ${st.forced}, ` : ""}${st.tokens} token${st.tokens === 1 ? "" : "s"}, ${(st.seconds * 1000).toFixed(1)} ms`;
    const part = (cls, n) => { if (n > 0) { const i = document.createElement("i"); i.className = cls; i.style.height = n * h + "px"; bar.appendChild(i); } };
    part("o-" + (st.proposer === "copy" ? "copy" : "draft"), st.accepted);
    part("rejected", st.offered - st.accepted);
    part("o-grammar", st.forced || 0);
    part("o-target", st.tokens - st.accepted - (st.forced || 0));
    timeline.appendChild(bar);
    timeline.scrollLeft = timeline.scrollWidth;
  };
  p.show = () => {
    const secs = (performance.now() - p.start) / 1000, f = p.final;
    const rate = f ? f.tokens_per_s : p.tokens / Math.max(secs, 1e-3);
    const acc = p.offered ? (100 * p.accepted / p.offered).toFixed(0) + "%" : "n/a";
    stats.textContent = `${p.tokens} tokens in ${p.steps} steps · ${rate.toFixed(1)} tokens/s · ` +
      `acceptance ${acc} (${p.accepted}/${p.offered})` +
      (f ? ` · ${f.mean_accepted.toFixed(2)} tokens per target call · finish: ${f.finish_reason}` +
           (f.cached_tokens ? ` · prompt ${f.cached_tokens}/${f.prompt_tokens} tokens from the prefix cache` : "") : "");
  };
  p.text = () => text.textContent;
  p.el = el;
  return p;
}
const panels = { main: Panel($("out-main")), plain: Panel($("out-plain")) };

// stream one request into a panel; the server's error (HTTP or in-stream) is thrown
async function run(panel, body, signal) {
  const chat = $("endpoint").value === "chat";
  const path = chat ? "/v1/chat/completions" : "/v1/completions";
  panel.reset();
  const timer = setInterval(panel.show, 250);
  try {
    const r = await api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal });
    const reader = r.body.getReader(), decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let at;
      while ((at = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, at); buf = buf.slice(at + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
          const chunk = JSON.parse(line.slice(6));
          if (chunk.error) throw new Error(chunk.error.message);
          const choice = chunk.choices[0], extra = chunk.anydraft || {};
          if (!choice) continue;
          const piece = chat ? (choice.delta.content || "") : (choice.text || "");
          if (extra.spans) for (const s of extra.spans) panel.span(s.text, s.origin);
          else if (piece) panel.span(piece, "target");
          for (const st of extra.steps || []) panel.step(st);
          if (choice.finish_reason) panel.final = { ...extra, finish_reason: choice.finish_reason };
        }
      }
    }
  } finally {
    clearInterval(timer);
    panel.show();
    panel.el.dataset.state = "done";
  }
}

$("form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  showError("");
  document.body.dataset.state = "running";
  if (!model) await loadModels();
  if (!model) return;
  const chat = $("endpoint").value === "chat", prompt = $("prompt").value;
  const body = { model, stream: true, temperature: Number($("temperature").value),
                 max_tokens: Number($("max-tokens").value) };
  if (chat) body.messages = [{ role: "user", content: prompt }]; else body.prompt = prompt;
  const compare = $("compare").checked;
  $("out-plain").hidden = !compare;
  aborter = new AbortController();
  $("run").disabled = true; $("stop").disabled = false;
  try {
    await run(panels.main, body, aborter.signal);
    // after, not beside: the two would share the server's cores and slow each other down
    if (compare) await run(panels.plain, { ...body, anydraft_method: "ar" }, aborter.signal);
  } catch (err) {
    if (err.name !== "AbortError") showError(err.message);
  } finally {
    $("run").disabled = false; $("stop").disabled = true;
    document.body.dataset.state = "done";
  }
});
$("stop").addEventListener("click", () => aborter && aborter.abort());
loadModels();
