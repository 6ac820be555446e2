/* gpuquota dashboard: draws the plotly charts of [data-plot] elements, on load and after every htmx
   swap. The data comes from a <script type="application/json"> inside each element (Django's
   json_script); share colours come from the stylesheet's --s0..--s9, so there is one palette. */
(function () {
  "use strict";
  var css = getComputedStyle(document.documentElement);
  function colour(i) {
    if (i === undefined || i === null || i < 0) return "#9aa5b1";
    return css.getPropertyValue("--s" + i).trim() || "#9aa5b1";
  }
  function data(el, n) {
    var scripts = el.querySelectorAll('script[type="application/json"]');
    return JSON.parse(scripts[n || 0].textContent);
  }
  var config = { displayModeBar: false, responsive: true };
  var layout = { margin: { l: 40, r: 10, t: 10, b: 30 }, paper_bgcolor: "rgba(0,0,0,0)",
                 plot_bgcolor: "rgba(0,0,0,0)", font: { family: "system-ui, sans-serif", size: 12 } };
  function merge(extra) { return Object.assign({}, layout, extra); }
  // "#rrggbb" mixed with white: share 0 is the colour, 1 is white.
  function lighten(hex, share) {
    var n = parseInt(hex.slice(1), 16), parts = [n >> 16, (n >> 8) & 255, n & 255];
    return "rgb(" + parts.map(function (c) { return Math.round(c + (255 - c) * share); }).join(",") + ")";
  }

  var stateColours = { "within its guarantee": "#9aa5b1", "borrowing": "#2f80ed", "lending": "#27ae60",
                       "starved": "#eb5757" };
  var draw = {
    // The organisation tree of one GPU type: a ring per level, sized by capacity, coloured by state.
    sunburst: function (el, area) {
      var d = data(el);
      Plotly.react(area, [{
        type: "sunburst", ids: d.ids, labels: d.labels, parents: d.parents, values: d.values,
        branchvalues: "remainder", text: d.text, hoverinfo: "label+text",
        marker: { colors: d.states.map(function (s) { return stateColours[s] || "#9aa5b1"; }) }
      }], merge({ margin: { l: 0, r: 0, t: 0, b: 0 } }), config);
    },
    sankey: function (el, area) {
      var d = data(el);
      Plotly.react(area, [{
        type: "sankey", arrangement: "snap",
        node: { label: d.labels, color: d.colours.map(colour), pad: 18, thickness: 16 },
        link: { source: d.source, target: d.target, value: d.value, label: d.link_labels,
                color: d.source.map(function (s) { return colour(d.colours[s]) + "88"; }) }
      }], merge({ margin: { l: 10, r: 10, t: 10, b: 10 } }), config);
    },
    history: function (el, area) {
      var d = data(el, 0), colours = data(el, 1);
      var traces = Object.keys(d.series).map(function (name) {
        return { type: "scatter", mode: d.times.length < 10 ? "lines+markers" : "lines",
                 stackgroup: "used", name: name, x: d.times,
                 y: d.series[name], line: { width: 0.5, color: colour(colours[name]) } };
      });
      Plotly.react(area, traces, merge({ xaxis: { type: "date", range: [d.start, d.end] },
                   yaxis: { title: { text: "GPUs" }, rangemode: "tozero" },
                   legend: { orientation: "h" } }), config);
    },
    timeline: function (el, area) {
      var d = data(el);
      var outcomes = { SUCCEEDED: "#27ae60", FAILED: "#eb5757", PREEMPTED: "#f2994a", STOPPING: "#f2994a",
                       NODE_LOST: "#9b51e0", CANCELLED: "#9aa5b1", TIMED_OUT: "#eb5757" };
      function strong(b) { return outcomes[b.outcome] || "#2f80ed"; }
      // A light fill with the outcome's colour in its outline, grey hatching where borrowed, and dark
      // words: white words on a strong colour crossed by white hatching could not be read.
      Plotly.react(area, [{
        type: "bar", orientation: "h", base: d.bars.map(function (b) { return b.start; }),
        x: d.bars.map(function (b) { return b.ms; }), y: d.bars.map(function (b) { return b.label; }),
        text: d.bars.map(function (b) { return b.outcome + (b.borrowed ? " · borrowed" : "") + " · " + b.nodes; }),
        textposition: "inside", insidetextanchor: "start", hoverinfo: "text+y",
        insidetextfont: { color: "#1f2933" },
        marker: { color: d.bars.map(function (b) { return lighten(strong(b), 0.78); }),
                  line: { color: d.bars.map(strong), width: 1.5 },
                  pattern: { shape: d.bars.map(function (b) { return b.borrowed ? "/" : ""; }),
                             fillmode: "overlay", fgcolor: "#52606d", fgopacity: 0.45, size: 10,
                             solidity: 0.15 } }
      }], merge({ xaxis: { type: "date" }, yaxis: { autorange: "reversed" }, margin: { l: 80, r: 10, t: 10, b: 30 } }), config);
    },
    // A share's track record: each start's forecast wait (x) against its actual wait (y), in minutes, its
    // likely range a bar across the point: the bar crosses the diagonal when the start fell inside it.
    track_record: function (el, area) {
      var d = data(el), top = 1;
      var groups = [["within", "started within its range", "#27ae60"], ["outside", "outside its range", "#eb5757"],
                    ["none", "no range", "#9aa5b1"]];
      d.points.forEach(function (p) { top = Math.max(top, p.x + p.plus, p.y); });
      var traces = groups.map(function (g) {
        var ps = d.points.filter(function (p) { return p.group === g[0]; });
        return { type: "scatter", mode: "markers", name: g[1], marker: { color: g[2], size: 7 },
                 x: ps.map(function (p) { return p.x; }), y: ps.map(function (p) { return p.y; }),
                 text: ps.map(function (p) { return p.text; }), hoverinfo: "text",
                 error_x: { type: "data", symmetric: false, color: g[2], thickness: 1, width: 0,
                            array: ps.map(function (p) { return p.plus; }),
                            arrayminus: ps.map(function (p) { return p.minus; }) } };
      }).filter(function (t) { return t.x.length; });
      traces.unshift({ type: "scatter", mode: "lines", name: "started as forecast", x: [0, top], y: [0, top],
                       line: { color: "#52606d", dash: "dot", width: 1 }, hoverinfo: "skip" });
      Plotly.react(area, traces, merge({ margin: { l: 50, r: 10, t: 10, b: 40 }, legend: { orientation: "h" },
                   xaxis: { title: { text: "forecast wait (min)" }, rangemode: "tozero" },
                   yaxis: { title: { text: "actual wait (min)" }, rangemode: "tozero" } }), config);
    },
    // Before and after per share, grouped: GPU-hours run, or p95 wait (the figure in d.y_title).
    whatif: function (el, area) {
      var d = data(el);
      Plotly.react(area, [
        { type: "bar", name: "simulated, as is", x: d.shares, y: d.before, marker: { color: "#9aa5b1" } },
        { type: "bar", name: d.after_label || "simulated, with the change", x: d.shares, y: d.after,
          marker: { color: "#2f80ed" } }
      ], merge({ barmode: "group", yaxis: { title: { text: d.y_title || "mean wait (s)" }, rangemode: "tozero" },
                 legend: { orientation: "h" } }), config);
    }
  };

  function render(root) {
    if (!window.Plotly) return;
    var els = Array.prototype.slice.call(root.querySelectorAll ? root.querySelectorAll("[data-plot]") : []);
    if (root.matches && root.matches("[data-plot]")) els.unshift(root);
    els.forEach(function (el) {
      var area = el.querySelector(".plot-area"), fn = draw[el.dataset.plot];
      if (!area || !fn) return;
      try { fn(el, area); el.dataset.drawn = "1"; } catch (e) { console.error("plot", e); }
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    if (window.htmx) { htmx.onLoad(render); } else { render(document); }
  });

  // A form with data-stales="#target": editing it empties the target, which showed a result (the what-if
  // preview) for the values before the edit.
  function stale(e) {
    var form = e.target.closest && e.target.closest("form[data-stales]");
    var target = form && document.querySelector(form.dataset.stales);
    if (target) target.innerHTML = "";
  }
  document.addEventListener("input", stale);
  document.addEventListener("change", stale);

  // A request htmx sent that failed (a 5xx, a refusal it does not swap, or no answer at all) is said on
  // the page, not only in the console; the notice goes when the same element's next request succeeds.
  var failed = null;
  function notice(text, elt) {
    failed = text ? elt : null;
    var box = document.getElementById("request-error");
    if (!text) { if (box) box.remove(); return; }
    if (!box) {
      box = document.createElement("div");
      box.id = "request-error";
      box.className = "errors request-error";
      box.setAttribute("role", "alert");
      (document.getElementById("main") || document.body).prepend(box);
    }
    box.textContent = text;
  }
  document.addEventListener("htmx:responseError", function (e) {
    var xhr = e.detail.xhr, what = xhr.status + (xhr.statusText ? " " + xhr.statusText : "");
    var body = (xhr.getResponseHeader("Content-Type") || "").indexOf("text/plain") === 0 ? xhr.responseText : "";
    notice(xhr.status >= 500
      ? "The server failed to answer (" + what + "): this part of the page did not update. " +
        "Try again; if it keeps failing, the server's log says why."
      : (body && body.length < 300 ? body : "Refused (" + what + ")."), e.detail.elt);
  });
  document.addEventListener("htmx:sendError", function (e) {
    notice("The server cannot be reached: the page shows what it last knew.", e.detail.elt);
  });
  document.addEventListener("htmx:afterRequest", function (e) {
    if (e.detail.successful && failed && e.detail.elt === failed) notice("");
  });
  // A control marked data-autosubmit submits its form when changed: no inline handlers, which the
  // Content-Security-Policy (script-src 'self') forbids.
  document.addEventListener("change", function (e) {
    var el = e.target;
    if (el.matches && el.matches("[data-autosubmit]") && el.form) {
      if (el.form.requestSubmit) el.form.requestSubmit(); else el.form.submit();
    }
  });
})();
