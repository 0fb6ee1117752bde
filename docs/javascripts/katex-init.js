// Render the math pymdownx.arithmatex (generic mode) leaves in <span class="arithmatex">, with the
// vendored KaTeX (docs/assets/katex): nothing is fetched from a CDN. Material's instant loading
// replaces the page without a load event, so render on its document$ observable when present.
function renderMath() {
  document.querySelectorAll(".arithmatex").forEach(function (el) {
    renderMathInElement(el, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: true,
    });
  });
}
if (typeof document$ !== "undefined") {
  document$.subscribe(renderMath);
} else {
  document.addEventListener("DOMContentLoaded", renderMath);
}
