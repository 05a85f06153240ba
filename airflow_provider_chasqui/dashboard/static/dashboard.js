// The Chasqui dashboard's only script: times in the viewer's zone, and the live refresh.
"use strict";
function localTimes(root) {
  for (const el of root.querySelectorAll("time[data-ms]")) {
    const d = new Date(Number(el.dataset.ms));
    if (!isNaN(d)) { el.title = el.textContent; el.textContent = d.toLocaleString() + " (yours)"; }
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
document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  if (document.querySelector("[data-live]")) setInterval(refresh, 5000);
});
