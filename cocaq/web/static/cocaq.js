// The web app's only script: draws the charts from their inert JSON blocks, refreshes a running job's
// live part in place, and copies the sbatch line. No data of the page is ever run as code.
"use strict";
(function () {
  function drawCharts() {
    if (typeof Plotly === "undefined") { return; }
    document.querySelectorAll("[data-figure]").forEach(function (el) {
      var block = document.getElementById(el.getAttribute("data-figure"));
      if (!block) { return; }
      var fig = JSON.parse(block.textContent);
      Plotly.newPlot(el, fig.data, fig.layout, { displaylogo: false, displayModeBar: false, responsive: true });
    });
  }
  function refreshLive() {
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var url = el.getAttribute("data-live");
      window.setInterval(function () {
        fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
          .then(function (r) { return r.ok ? r.json() : null; })
          .then(function (d) {
            if (!d) { return; }
            // the server's own rendering of the fragment (autoescaped), parsed as a document, not run
            var doc = new DOMParser().parseFromString(d.html, "text/html");
            el.replaceChildren.apply(el, Array.from(doc.body.childNodes));
          })
          .catch(function () {});
      }, 30000);
    });
  }
  function copyButtons() {
    document.querySelectorAll("button.copy").forEach(function (b) {
      if (!navigator.clipboard) { return; }
      b.hidden = false;
      b.addEventListener("click", function () {
        var code = document.getElementById(b.getAttribute("data-copy"));
        navigator.clipboard.writeText(code.textContent).then(function () { b.textContent = "Copied"; });
      });
    });
  }
  document.addEventListener("DOMContentLoaded", function () { drawCharts(); refreshLive(); copyButtons(); });
})();
