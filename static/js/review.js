/* Keyboard grading on the review item page: p / f = pass / fail, 1-9 = score 0.1-0.9 and
   0 = 1.0 (no key means two things: "1" is never 0.1 or 1.0 depending on who reads it),
   n = note, s = skip, u = undo the last grade, Enter = submit, Esc = leave a field. The forms work without this file
   (plain POST and redirect); with htmx the next item replaces #review-item, and since the
   listener sits on the document it keeps working for every swapped-in item. */
(function () {
  "use strict";

  var TEXT_INPUTS = ["text", "number", "search", "email", "url", "password", "tel"];

  function isTyping(element) {
    if (!element || !element.tagName) { return false; }
    var tag = element.tagName.toLowerCase();
    if (tag === "textarea" || tag === "select" || element.isContentEditable) { return true; }
    return tag === "input" && TEXT_INPUTS.indexOf((element.type || "text").toLowerCase()) !== -1;
  }

  function setVerdict(form, value) {
    var radio = form.querySelector('input[name="verdict"][value="' + value + '"]');
    if (!radio) { return; }
    radio.checked = true;
    var score = form.querySelector('input[name="score"]');
    // Pass / fail fill the score only while nobody chose one (or it was filled by p / f).
    if (score && (score.value === "" || score.dataset.auto === "1")) {
      score.value = value === "pass" ? "1" : "0";
      score.dataset.auto = "1";
    }
  }

  function setScore(form, digit) {
    var score = form.querySelector('input[name="score"]');
    if (!score) { return; }
    score.value = digit === 0 ? "1.0" : (digit / 10).toFixed(1);
    score.dataset.auto = "";
  }

  document.addEventListener("input", function (event) {
    if (event.target && event.target.name === "score") { event.target.dataset.auto = ""; }
  });

  document.addEventListener("keydown", function (event) {
    var form = document.getElementById("review-form");
    if (!form || event.ctrlKey || event.metaKey || event.altKey) { return; }
    var target = event.target;
    if (isTyping(target)) {
      // Enter in a field submits the form natively; Esc gives the keys back to the page.
      if (event.key === "Escape") { target.blur(); }
      return;
    }
    var key = event.key;
    if (key === "p" || key === "f") {
      setVerdict(form, key === "p" ? "pass" : "fail");
    } else if (/^[0-9]$/.test(key)) {
      setScore(form, Number(key));
    } else if (key === "n") {
      var note = form.querySelector('input[name="note"]');
      if (note) { note.focus(); }
    } else if (key === "u") {
      var undo = document.getElementById("review-undo");
      if (undo) { undo.requestSubmit(); }
    } else if (key === "s") {
      var skip = document.getElementById("review-skip");
      if (skip) { skip.requestSubmit(); }
    } else if (key === "Enter") {
      // A focused button submits on its own; anywhere else Enter means "submit".
      if (target && target.tagName && target.tagName.toLowerCase() === "button") { return; }
      form.requestSubmit();
    } else {
      return;
    }
    event.preventDefault();
  });
})();
