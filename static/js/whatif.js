/* gpuquota what-if: draws the sweep's trade-off chart ([data-plot="sweep"]: the share's p95 wait and
   the cluster's utilisation per swept value), on load and after every htmx swap, like dashboard.js
   draws the others. Data from the element's <script type="application/json"> (json_script): no inline
   script, as the Content-Security-Policy wants. */
(function () {
  "use strict";
  function draw(el) {
    var area = el.querySelector(".plot-area");
    if (!area || !window.Plotly) return;
    var d = JSON.parse(el.querySelector('script[type="application/json"]').textContent);
    var x = d.values.map(String);
    if (el.dataset.tradeoff === "protection") return drawProtection(el, area, d, x);
    Plotly.react(area, [
      { type: "bar", name: "p95 wait of " + d.share + " (s)", x: x, y: d.p95_wait_s,
        marker: { color: "#2f80ed" } },
      { type: "scatter", mode: "lines+markers", name: "cluster utilisation (%)", x: x, y: d.utilisation,
        yaxis: "y2", line: { color: "#f2994a" } }
    ], {
      margin: { l: 60, r: 60, t: 10, b: 50 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, sans-serif", size: 12 }, legend: { orientation: "h" },
      // Titles as objects (plotly.js 3 ignores a plain string), the swept setting under the values; the
      // utilisation axis keeps its own round ticks (as an overlaying axis it took the wait axis's, at
      // 29.1, 58.2, ...) and draws no second grid.
      xaxis: { type: "category", title: { text: el.dataset.xTitle || "value" } },
      yaxis: { title: { text: "p95 wait of " + d.share + " (s)" }, rangemode: "tozero", tickformat: ",d" },
      yaxis2: { title: { text: "cluster utilisation (%)" }, overlaying: "y", side: "right", range: [0, 100],
                tickmode: "linear", tick0: 0, dtick: 20, showgrid: false }
    }, { displayModeBar: false, responsive: true });
    el.dataset.drawn = "1";
  }
  /* A sweep of min_runtime_s: what a protection window saves (work thrown away by pre-emptions, bars)
     against what it costs the owners (their p95 wait for reclaimed GPUs, the line). */
  function drawProtection(el, area, d, x) {
    Plotly.react(area, [
      { type: "bar", name: "GPU-hours of work lost to pre-emption", x: x, y: d.lost_gpu_hours,
        marker: { color: "#eb5757" } },
      { type: "scatter", mode: "lines+markers", name: "owners' p95 wait for reclaimed GPUs (s)", x: x,
        y: d.owner_wait_p95_s, yaxis: "y2", line: { color: "#2f80ed" } }
    ], {
      margin: { l: 60, r: 60, t: 10, b: 50 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, sans-serif", size: 12 }, legend: { orientation: "h" },
      xaxis: { type: "category", title: { text: el.dataset.xTitle || "value" } },
      yaxis: { title: { text: "GPU-hours lost" }, rangemode: "tozero" },
      yaxis2: { title: { text: "owners' p95 wait (s)" }, overlaying: "y", side: "right", rangemode: "tozero",
                showgrid: false }
    }, { displayModeBar: false, responsive: true });
    el.dataset.drawn = "1";
  }
  function render(root) {
    var els = Array.prototype.slice.call(root.querySelectorAll ? root.querySelectorAll('[data-plot="sweep"]') : []);
    if (root.matches && root.matches('[data-plot="sweep"]')) els.unshift(root);
    els.forEach(function (el) {
      try { draw(el); } catch (e) { console.error("plot", e); }
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    if (window.htmx) { htmx.onLoad(render); } else { render(document); }
  });
})();
