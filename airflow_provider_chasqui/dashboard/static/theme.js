// Runs before the page paints: Airflow 3's colour mode (its UI keeps "light", "dark" or
// "system" in localStorage "theme", on this same origin when the dashboard is the plugin),
// else the system's.  A change in Airflow's UI reaches this frame as a "storage" event.
"use strict";
(function () {
  const dark = window.matchMedia("(prefers-color-scheme: dark)");
  function apply() {
    let mode = null;
    try { mode = localStorage.getItem("theme"); } catch (e) { /* storage blocked */ }
    if (mode !== "dark" && mode !== "light") mode = dark.matches ? "dark" : "light";
    document.documentElement.dataset.theme = mode;
  }
  apply();
  dark.addEventListener("change", apply);
  window.addEventListener("storage", (e) => { if (!e.key || e.key === "theme") apply(); });
})();
