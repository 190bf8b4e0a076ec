// The site's math: pymdownx.arithmatex (generic mode) wraps each formula in an element of class
// "arithmatex" holding \( ... \) or \[ ... \]; KaTeX (vendored here, no network) renders them on
// every page load, including mkdocs-material's instant navigation (document$).
function jaxweightRenderMath(root) {
  root.querySelectorAll(".arithmatex").forEach(function (el) {
    renderMathInElement(el, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  });
}
if (typeof document$ !== "undefined") {
  document$.subscribe(function (page) { jaxweightRenderMath(page.body || document.body); });
} else {
  document.addEventListener("DOMContentLoaded", function () { jaxweightRenderMath(document.body); });
}
