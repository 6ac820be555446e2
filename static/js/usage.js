/* gpuquota usage page: draws [data-plot="usage"]: per bucket, GPU-hours run on own capacity and on
   borrowed GPUs stacked above zero, lent as a line, and the work lost by cause stacked below zero. Data
   from the element's <script type="application/json"> (json_script): no inline script (CSP). */
(function () {
  "use strict";
  var LOST = { reclaim: "#eb5757", priority: "#f2994a", node_lost: "#9b51e0", fenced: "#828282", gpu_failed: "#333333" };
  function draw(el) {
    var area = el.querySelector(".plot-area");
    if (!area || !window.Plotly) return;
    var d = JSON.parse(el.querySelector('script[type="application/json"]').textContent);
    var s = d.series, traces = [
      { type: "bar", name: d.labels.own, x: d.x, y: s.own, marker: { color: "#2f80ed" } },
      { type: "bar", name: d.labels.borrowed, x: d.x, y: s.borrowed, marker: { color: "#56ccf2" } }
    ];
    d.causes.forEach(function (c) {
      if (s[c].some(function (v) { return v > 0; })) {
        traces.push({ type: "bar", name: d.labels[c], x: d.x, y: s[c].map(function (v) { return -v; }),
                      marker: { color: LOST[c] || "#eb5757" } });
      }
    });
    traces.push({ type: "scatter", mode: "lines+markers", name: d.labels.lent, x: d.x, y: s.lent,
                  line: { color: "#27ae60" } });
    Plotly.react(area, traces, {
      barmode: "relative", margin: { l: 60, r: 20, t: 10, b: 40 },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, sans-serif", size: 12 }, legend: { orientation: "h" },
      yaxis: { title: { text: "GPU-hours (lost below zero)" }, zeroline: true }
    }, { displayModeBar: false, responsive: true });
    el.dataset.drawn = "1";
  }
  function render(root) {
    var els = Array.prototype.slice.call(root.querySelectorAll ? root.querySelectorAll('[data-plot="usage"]') : []);
    els.forEach(function (el) { try { draw(el); } catch (e) { console.error("plot", e); } });
  }
  document.addEventListener("DOMContentLoaded", function () { render(document); });
})();
