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
    Plotly.react(area, [
      { type: "bar", name: "p95 wait of " + d.share + " (s)", x: x, y: d.p95_wait_s,
        marker: { color: "#2f80ed" } },
      { type: "scatter", mode: "lines+markers", name: "cluster utilisation (%)", x: x, y: d.utilisation,
        yaxis: "y2", line: { color: "#f2994a" } }
    ], {
      margin: { l: 50, r: 50, t: 10, b: 40 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, sans-serif", size: 12 }, legend: { orientation: "h" },
      xaxis: { type: "category" },
      yaxis: { title: "p95 wait (s)", rangemode: "tozero" },
      yaxis2: { title: "utilisation (%)", overlaying: "y", side: "right", range: [0, 100] }
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
