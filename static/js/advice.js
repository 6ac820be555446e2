/* gpuquota advice: the trade-off chart of /advice/ ([data-plot="advice"]): every replayed layout as a dot
   (utilisation against owners' p95 wait, size and colour the GPU-hours lost), the frontier as a line,
   today's layout and the recommended point marked. Data from json_script (no inline script: CSP). */
(function () {
  "use strict";
  function draw(el) {
    var area = el.querySelector(".plot-area");
    if (!area || !window.Plotly) return;
    var d = JSON.parse(el.querySelector('script[type="application/json"]').textContent);
    var lost = d.points.lost_gpu_hours;
    var most = Math.max.apply(null, lost.concat([0.001]));
    var traces = [
      { type: "scatter", mode: "markers", name: "layouts replayed", x: d.points.utilisation, y: d.points.wait,
        text: d.points.text, hovertemplate: "%{text}<br>utilisation %{x} %<br>owners' p95 wait %{y} s<extra></extra>",
        marker: { size: lost.map(function (l) { return 8 + 22 * l / most; }), color: lost, colorscale: "Reds",
                  showscale: true, colorbar: { title: { text: "GPU-h lost" } }, line: { width: 1, color: "#555" } } },
      { type: "scatter", mode: "lines", name: "frontier", x: d.frontier.utilisation, y: d.frontier.wait,
        line: { color: "#2f80ed", shape: "hv" } },
      { type: "scatter", mode: "markers", name: "today", x: [d.today.utilisation], y: [d.today.wait],
        marker: { symbol: "star", size: 16, color: "#f2c94c", line: { width: 1, color: "#333" } } }
    ];
    if (d.recommended !== null) {
      traces.push({ type: "scatter", mode: "markers", name: "recommended",
        x: [d.frontier.utilisation[d.recommended]], y: [d.frontier.wait[d.recommended]],
        marker: { symbol: "circle-open", size: 22, color: "#27ae60", line: { width: 3 } } });
    }
    Plotly.react(area, traces, {
      margin: { l: 70, r: 20, t: 10, b: 50 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, sans-serif", size: 12 }, legend: { orientation: "h" },
      xaxis: { title: { text: "cluster utilisation (%)" } },
      yaxis: { title: { text: "owners' p95 wait (s)" }, rangemode: "tozero" }
    }, { displayModeBar: false, responsive: true });
    el.dataset.drawn = "1";
  }
  function render(root) {
    var els = Array.prototype.slice.call(root.querySelectorAll ? root.querySelectorAll('[data-plot="advice"]') : []);
    if (root.matches && root.matches('[data-plot="advice"]')) els.unshift(root);
    els.forEach(function (el) {
      try { draw(el); } catch (e) { console.error("plot", e); }
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    if (window.htmx) { htmx.onLoad(render); } else { render(document); }
  });
})();
