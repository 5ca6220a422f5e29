// Model text to safe HTML: marked for markdown, DOMPurify against injected markup,
// highlight.js for code. All three are vendored (assets/vendor), never fetched.
import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.mjs";
import hljs from "./vendor/highlight.min.js";

const marked = new Marked({ gfm: true, breaks: true });

export function renderMarkdown(text) {
  return DOMPurify.sanitize(marked.parse(text || ""), { USE_PROFILES: { html: true } });
}

// Fill ``el`` with ``text`` as markdown; ``final`` also highlights code and adds copy buttons.
export function setMarkdown(el, text, final = true) {
  el.innerHTML = renderMarkdown(text);
  el.querySelectorAll("a[href]").forEach((a) => {
    a.target = "_blank";
    a.rel = "noopener noreferrer";
  });
  if (final) decorateCode(el);
}

export function decorateCode(el) {
  el.querySelectorAll("pre > code").forEach((code) => {
    if (code.dataset.highlighted) return;
    hljs.highlightElement(code);
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy-code";
    button.textContent = "Copy";
    button.setAttribute("aria-label", "Copy code");
    button.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(code.innerText);
        button.textContent = "Copied";
      } catch {
        button.textContent = "Select and copy";
      }
      setTimeout(() => { button.textContent = "Copy"; }, 1500);
    });
    code.parentElement.classList.add("has-copy");
    code.parentElement.append(button);
  });
}

export function escapeHTML(text) {
  const div = document.createElement("div");
  div.textContent = text;
  return div.innerHTML;
}
