/* Draws every <div data-chart="ID"> with the Plotly figure in <script id="ID"
   type="application/json"> (Django's json_script), on load and after htmx swaps.
   A point whose customdata is a site path ("/p/...") opens that page when clicked.
   A figure's "shared" (not Plotly's) holds per-point arrays every line has in common (the
   same runs' times, links and tooltips): sent once, given to each line here. */
(function () {
  "use strict";

  function draw(element) {
    if (typeof Plotly === "undefined") { return; }
    var source = document.getElementById(element.getAttribute("data-chart"));
    if (!source) { return; }
    var figure = JSON.parse(source.textContent);
    withShared(figure);
    element.textContent = "";  // drop the no-JavaScript fallback text
    element.classList.add("chart-drawn");
    Plotly.newPlot(element, figure.data, figure.layout, {
      responsive: true,
      displaylogo: false,
      modeBarButtonsToRemove: ["select2d", "lasso2d"],
    });
    element.on("plotly_click", function (event) {
      var point = event.points && event.points[0];
      var link = point && point.customdata;
      if (typeof link === "string" && link.charAt(0) === "/") {
        window.location.assign(link);
      }
    });
  }

  function withShared(figure) {
    var shared = figure.shared || {};
    figure.data.forEach(function (trace) {
      Object.keys(shared).forEach(function (key) {
        if (!(key in trace)) { trace[key] = shared[key].slice(); }  // a copy per line
      });
    });
    delete figure.shared;
  }

  // Content swapped in by htmx is new elements, so "not drawn yet" finds exactly them.
  function drawPending() {
    var elements = document.querySelectorAll("[data-chart]:not(.chart-drawn)");
    for (var i = 0; i < elements.length; i++) { draw(elements[i]); }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", drawPending);
  } else {
    drawPending();
  }
  document.addEventListener("htmx:afterSettle", drawPending);
})();
