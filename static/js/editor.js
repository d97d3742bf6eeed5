// The spec editor: line numbers beside the YAML textarea, and "line N" in an error jumps
// to that line (selects it and scrolls it into view). The textarea works without this.
(function () {
  "use strict";

  function gutterFor(textarea) {
    return document.querySelector('.line-gutter[data-for="' + textarea.id + '"]');
  }

  function number(textarea) {
    var gutter = gutterFor(textarea);
    if (!gutter) { return; }
    var lines = textarea.value.split("\n").length;
    if (gutter.dataset.lines !== String(lines)) {
      var text = [];
      for (var i = 1; i <= lines; i++) { text.push(i); }
      gutter.textContent = text.join("\n");
      gutter.dataset.lines = String(lines);
    }
    gutter.scrollTop = textarea.scrollTop;
  }

  function jump(textarea, line) {
    var lines = textarea.value.split("\n");
    line = Math.max(1, Math.min(line, lines.length));
    var start = 0;
    for (var i = 0; i < line - 1; i++) { start += lines[i].length + 1; }
    textarea.focus();
    textarea.setSelectionRange(start, start + lines[line - 1].length);
    var height = parseFloat(getComputedStyle(textarea).lineHeight) || 20;
    textarea.scrollTop = Math.max(0, (line - 1) * height - textarea.clientHeight / 3);
    number(textarea);
  }

  function setUp() {
    var editors = document.querySelectorAll("textarea.yaml-editor");
    for (var i = 0; i < editors.length; i++) { number(editors[i]); }
  }

  document.addEventListener("input", function (event) {
    if (event.target.classList && event.target.classList.contains("yaml-editor")) {
      number(event.target);
    }
  });
  // Scroll events do not bubble: listen in the capture phase.
  document.addEventListener("scroll", function (event) {
    if (event.target.classList && event.target.classList.contains("yaml-editor")) {
      number(event.target);
    }
  }, true);
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-jump-line]");
    if (!button) { return; }
    var textarea = document.getElementById(button.getAttribute("data-target") || "spec-source");
    if (textarea) { jump(textarea, Number(button.getAttribute("data-jump-line"))); }
  });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", setUp);
  } else {
    setUp();
  }
  document.addEventListener("htmx:afterSettle", setUp);
})();
