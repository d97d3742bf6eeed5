// Small behaviours of every page. Listeners sit on the document, so content htmx swaps in
// later works too.
//  - The top bar's menu button (phones): opens and closes the links, and says so to screen
//    readers through aria-expanded. Wider screens never show the button.
//  - <form data-confirm="question">: asked before a dangerous POST (cancel a run).
//  - <button data-copy="#id">: copies that element's text (a new API token) to the clipboard.
document.addEventListener("click", (event) => {
  const toggle = event.target.closest(".nav-toggle");
  if (toggle) {
    const menu = document.getElementById(toggle.getAttribute("aria-controls"));
    const open = toggle.getAttribute("aria-expanded") !== "true";
    toggle.setAttribute("aria-expanded", String(open));
    if (menu) menu.classList.toggle("open", open);
    return;
  }
  const copy = event.target.closest("button[data-copy]");
  if (copy) {
    const source = document.querySelector(copy.dataset.copy);
    if (!source) return;
    const done = () => { copy.textContent = "Copied"; };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(source.textContent.trim()).then(done, () => selectText(source));
    } else {
      selectText(source);  // plain http: the text is selected for Ctrl+C instead
    }
  }
});

function selectText(element) {
  const range = document.createRange();
  range.selectNodeContents(element);
  const selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
}

document.addEventListener("submit", (event) => {
  const form = event.target.closest("form[data-confirm]");
  if (form && !window.confirm(form.dataset.confirm)) event.preventDefault();
});
