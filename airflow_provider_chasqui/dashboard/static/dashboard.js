// The Chasqui dashboard's script: times in Airflow's format and timezone, and the live refresh.
// Airflow 3's UI keeps the chosen zone in localStorage "timezone" (JSON, on this origin when the
// dashboard is the plugin; the browser's zone when unset) and shows "YYYY-MM-DD HH:mm:ss".
"use strict";
function chasquiZone() {
  let zone = null;
  try {
    const raw = localStorage.getItem("timezone");
    if (raw) { try { zone = JSON.parse(raw); } catch (e) { zone = raw; } }
  } catch (e) { /* storage blocked */ }
  try { if (typeof zone === "string" && zone) { new Intl.DateTimeFormat("en-US", { timeZone: zone }); return zone; } }
  catch (e) { /* not a zone this browser knows */ }
  return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
}
function chasquiFormat(ms, zone, fmt) {
  const parts = {};
  const f = new Intl.DateTimeFormat("en-US", {
    timeZone: zone, hourCycle: "h23", year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short",
  });
  for (const p of f.formatToParts(new Date(ms))) parts[p.type] = p.value;
  const day = `${parts.year}-${parts.month}-${parts.day}`;
  if (fmt === "hm") return `${parts.hour}:${parts.minute}`;
  if (fmt === "dhm") return `${parts.month}-${parts.day} ${parts.hour}:${parts.minute}`;
  return `${day} ${parts.hour}:${parts.minute}:${parts.second} ${parts.timeZoneName}`;
}
function localTimes(root) {
  const zone = chasquiZone();
  document.documentElement.dataset.zone = zone;
  for (const el of root.querySelectorAll("[data-ms]")) {
    const ms = Number(el.dataset.ms);
    if (!Number.isFinite(ms)) continue;
    if (!el.title && el.tagName.toLowerCase() === "time") el.title = el.textContent;
    el.textContent = chasquiFormat(ms, zone, el.dataset.fmt);
  }
}
async function refresh() {
  const live = document.querySelector("[data-live]");
  const box = document.getElementById("live");
  if (!live || !box || !box.checked || document.hidden) return;
  try {
    const resp = await fetch(location.href, { credentials: "same-origin" });
    if (!resp.ok) return;
    const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
    const fresh = doc.querySelector(`[data-live="${live.dataset.live}"]`);
    if (fresh) { live.replaceChildren(...fresh.childNodes); localTimes(live); live.dataset.refreshed = Date.now(); }
  } catch (e) { /* the next tick retries */ }
}
// Links into Airflow's UI (a job's or spec's task instance) open in the whole window.  Airflow
// frames plugin pages in a sandbox without top navigation, so a same-origin frame asks Airflow's
// own router instead: a history entry and a popstate event are how its links navigate too.
function openInAirflow(event) {
  const a = event.target.closest("a.origin");
  if (!a || window.top === window || event.button !== 0 || event.ctrlKey || event.metaKey) return;
  try {
    const top = window.top;
    if (top.location.origin !== location.origin) return;
    const state = top.history.state || {};
    top.history.pushState({ usr: null, key: Math.random().toString(36).slice(2, 10), idx: (state.idx || 0) + 1 }, "", a.href);
    top.dispatchEvent(new PopStateEvent("popstate", { state: top.history.state }));
    event.preventDefault();
  } catch (e) { /* not allowed: the link's own target applies */ }
}
document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  document.addEventListener("click", openInAirflow);
  window.addEventListener("storage", (e) => { if (!e.key || e.key === "timezone") localTimes(document); });
  if (document.querySelector("[data-live]")) setInterval(refresh, 5000);
});
