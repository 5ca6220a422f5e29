// The Memory page (#memory, #memory/<Article>): the vault's state, setting it up, search,
// an article with its links and backlinks, its revisions and what each changed, and
// synthesis over the saved chats (a dry-run preview first, live progress, cancel).
// Everything is /api/memory/* and the SSE stream of /v1/memory/synthesize.
import { getJSON, postJSON } from "./api.js";
import { renderMarkdown } from "./markdown.js";
import { SynthesisPanel } from "./memory_synth.js";

const h = (tag, props = {}, ...children) => {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
};
const q = encodeURIComponent;
const WIKILINK = /\[\[([^[\]|#\n]{1,200})(?:#[^[\]|\n]*)?(?:\|([^[\]\n]*))?\]\]/g;

// An article title as its file stem, as the server makes it (memory/articles.py stem_of).
export function stemOf(title) {
  const words = title.replace(/_/g, " ").match(/[A-Za-z0-9][A-Za-z0-9\-.,'()]*/g) || [];
  return words.join("_").replace(/^[_.,\-'()]+|[_.,\-'()]+$/g, "").slice(0, 80);
}

const articleHref = (name) => `#memory/${q(name)}`;
const routedArticle = () => decodeURIComponent(location.hash.replace(/^#\/?memory\/?/, ""));
const fmtBytes = (n) => (n >= 1048576 ? `${(n / 1048576).toFixed(1)} MiB`
  : n >= 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${n} B`);

function section() {
  const el = h("section", { id: "view-memory", className: "view status-view memory-view", hidden: true });
  el.setAttribute("aria-label", "Memory");
  el.innerHTML = `
    <div class="status-head"><h1>Memory</h1>
      <button id="memory-refresh" type="button">Refresh</button></div>
    <p class="muted">Articles written from your saved chats by the served model; the chat's
      <code>memory_search</code> tool reads them.</p>
    <div class="cards">
      <article class="card" aria-labelledby="h-mem-status"><h2 id="h-mem-status">Vault</h2>
        <div id="memory-status" aria-live="polite"></div></article>
      <article class="card" aria-labelledby="h-mem-synth"><h2 id="h-mem-synth">Synthesis</h2>
        <div id="memory-synth"></div></article>
      <article class="card wide" aria-labelledby="h-mem-search"><h2 id="h-mem-search">Search</h2>
        <form id="memory-search-form" class="row" role="search">
          <label class="sr-only" for="memory-q">Search the memory vault</label>
          <input id="memory-q" type="search" placeholder="Search articles, e.g. kiwi" autocomplete="off">
          <label class="sr-only" for="memory-scope">Where to search</label>
          <select id="memory-scope"><option value="all">Everything</option>
            <option value="articles">Articles</option><option value="reference">Reference</option></select>
          <button type="submit" class="primary">Search</button>
        </form>
        <div id="memory-results" aria-live="polite"></div></article>
      <article class="card wide" aria-labelledby="h-mem-article" id="memory-article-card" hidden>
        <h2 id="h-mem-article" tabindex="-1">Article</h2>
        <div id="memory-article" class="memory-article markdown"></div>
        <div class="memory-links">
          <div><h3>Links to</h3><ul id="memory-outbound" class="memory-linklist"></ul></div>
          <div><h3>Linked from</h3><ul id="memory-inbound" class="memory-linklist"></ul></div>
        </div>
        <h3 id="h-mem-history">History</h3>
        <ol id="memory-history" class="memory-history" aria-labelledby="h-mem-history"></ol>
        <pre id="memory-diff" class="memory-diff" tabindex="0" aria-label="Changes" hidden></pre>
      </article>
    </div>`;
  return el;
}

export class MemoryView {
  constructor(main) {
    this.el = section();
    main.append(this.el);
    this.$ = (id) => this.el.querySelector(`#${id}`);
    this.names = new Set();
    this.current = null;
    this.hasVault = false; // what /api/memory/status said last
    this.synth = new SynthesisPanel(this.$("memory-synth"), () => this.refresh());
    this.$("memory-refresh").addEventListener("click", () => this.refresh());
    this.$("memory-search-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.search();
    });
  }

  // Called on every route change; #memory/<name> opens that article.
  async show(visible) {
    if (!visible) return;
    await this.refresh(); // first: the article names mark links to articles not written yet
    const name = routedArticle();
    if (name && name !== this.current && this.hasVault) this.open(name); // none yet: set-up first
  }

  async refresh() {
    const r = await getJSON("/api/memory/status").catch(() => null);
    const box = this.$("memory-status");
    this.hasVault = r?.body?.enabled === true;
    if (r?.body?.enabled === false) {
      this.synth.enable(false);
      const button = h("button", { type: "button", className: "primary", id: "memory-init",
        textContent: "Set up the vault" });
      button.addEventListener("click", () => this.init(button));
      box.replaceChildren(h("p", {}, "No memory vault yet. Setting it up makes ",
        h("code", { textContent: r.body.root }), " with an articles folder and a search index."),
      button);
      return;
    }
    if (!r?.ok) {
      this.synth.enable(false);
      box.replaceChildren(h("p", { className: "muted",
        textContent: r ? (r.body?.error || `HTTP ${r.status}`) : "The server did not answer." }));
      return;
    }
    const s = r.body.status;
    this.synth.enable(true);
    const last = s.lastSynthesisMs ? new Date(s.lastSynthesisMs).toLocaleString() : "never";
    const rows = [["Articles", s.articleCount], ["Reference pages", s.referenceCount],
      ["Chats read", s.sessionsCovered ?? "—"], ["Last synthesis", last],
      ["Index size", s.indexBytes === undefined ? "—" : fmtBytes(s.indexBytes)], ["Folder", s.root]];
    const table = h("table", { className: "kv", id: "memory-kv" });
    for (const [k, v] of rows) {
      const tr = table.insertRow();
      tr.append(h("th", { scope: "row", textContent: k }), h("td", { textContent: String(v) }));
    }
    const recent = (s.recentArticles || []).map((a) => h("li", {}, this.link(a.article)));
    box.replaceChildren(table, recent.length ? h("h3", { textContent: "Recently changed" }) : null,
      recent.length ? h("ul", { className: "memory-linklist" }, ...recent) : null);
    const list = await getJSON("/api/memory/list").catch(() => null);
    this.names = new Set(list?.body?.articles || []);
  }

  async init(button) {
    button.disabled = true;
    const r = await postJSON("/api/memory/init", {});
    if (!r.ok) {
      button.disabled = false;
      this.$("memory-status").append(h("p", { className: "memory-error", role: "alert",
        textContent: r.body?.error || `HTTP ${r.status}` }));
      return;
    }
    await this.refresh();
    this.$("memory-q").focus();
    const name = routedArticle();
    if (name && this.hasVault) this.open(name); // the article the link asked for
  }

  link(name) {
    const a = h("a", { href: articleHref(name), textContent: name.replace(/_/g, " ") });
    if (this.names.size && !this.names.has(name)) {
      a.classList.add("missing");
      a.title = "No article yet";
    }
    return a;
  }

  async search() {
    const text = this.$("memory-q").value.trim();
    const box = this.$("memory-results");
    if (!text) return;
    const r = await getJSON(`/api/memory/search?q=${q(text)}&scope=${this.$("memory-scope").value}&limit=50`);
    if (!r.ok) {
      box.replaceChildren(h("p", { className: "muted", textContent: r.body?.error || `HTTP ${r.status}` }));
      return;
    }
    if (r.body.enabled === false) {
      box.replaceChildren(h("p", { className: "muted", textContent: "No memory vault yet: set it up above, then search it." }));
      return;
    }
    const { summaries = [], hits = [] } = r.body;
    if (!summaries.length) {
      box.replaceChildren(h("p", { className: "muted", textContent: `Nothing found for “${text}”.` }));
      return;
    }
    const terms = [...new Set(summaries.flatMap((s) => s.matched_terms || []))];
    const items = summaries.map((s) => {
      const lines = hits.filter((x) => x.article === s.article).slice(0, 3).map((x) =>
        h("li", { className: "search-snippet" }, mark(x.excerpt, terms)));
      const name = s.article.startsWith("Reference/")
        ? h("span", { className: "memory-ref", textContent: s.article }) : this.link(s.article);
      return h("li", { className: "memory-hit" }, name,
        h("span", { className: "muted", textContent: ` · ${s.occurrences} match${s.occurrences === 1 ? "" : "es"}` }),
        lines.length ? h("ul", {}, ...lines) : null);
    });
    box.replaceChildren(h("p", { className: "muted", textContent: `${summaries.length} found` }),
      h("ul", { className: "memory-hits", id: "memory-hits" }, ...items));
  }

  async open(name) {
    this.current = name;
    const card = this.$("memory-article-card");
    const [page, links, history] = await Promise.all([
      getJSON(`/api/memory/article?name=${q(name)}`), getJSON(`/api/memory/links?name=${q(name)}`),
      getJSON(`/api/memory/history?name=${q(name)}&limit=50`)]);
    card.hidden = false;
    this.$("h-mem-article").textContent = name.replace(/_/g, " ");
    const body = this.$("memory-article");
    if (!page.ok) {
      body.textContent = page.status === 404 ? `There is no article “${name}” yet.` : (page.body?.error || `HTTP ${page.status}`);
      for (const id of ["memory-outbound", "memory-inbound", "memory-history"]) this.$(id).replaceChildren();
      this.$("memory-diff").hidden = true;
      return;
    }
    body.innerHTML = renderMarkdown(page.body.content.replace(WIKILINK, (_, target, label) =>
      `[${(label || target.replace(/_/g, " ")).trim()}](${articleHref(stemOf(target))})`));
    body.querySelectorAll("a[href]").forEach((a) => {
      const href = a.getAttribute("href");
      if (!href.startsWith("#memory/")) {
        a.target = "_blank";
        a.rel = "noopener noreferrer";
      } else if (this.names.size && !this.names.has(decodeURIComponent(href.slice(8)))) {
        a.classList.add("missing");
        a.title = "No article yet";
      }
    });
    const list = (id, names, empty) => this.$(id).replaceChildren(...(names.length
      ? names.map((n) => h("li", {}, this.link(n))) : [h("li", { className: "muted", textContent: empty })]));
    list("memory-outbound", links.body?.outbound || [], "no links");
    list("memory-inbound", links.body?.inbound || [], "no article links here");
    this.history(name, history.body?.entries || []);
    this.$("h-mem-article").focus({ preventScroll: false });
  }

  history(name, entries) {
    this.$("memory-diff").hidden = true;
    this.$("memory-history").replaceChildren(...entries.map((e, i) => {
      const older = entries[i + 1];
      const button = h("button", { type: "button", className: "link-btn",
        textContent: older ? "Changes from the version before" : "Show as first written" });
      button.setAttribute("aria-label", `Changes in revision ${e.hash.slice(0, 8)}: ${e.subject}`);
      button.addEventListener("click", () => this.diff(name, e.hash, button));
      return h("li", {}, h("code", { textContent: e.hash.slice(0, 8) }),
        ` ${e.date} · ${e.subject} `, button);
    }));
  }

  async diff(name, rev, button) {
    const r = await getJSON(`/api/memory/diff?name=${q(name)}&rev=${rev}`);
    const pre = this.$("memory-diff");
    pre.replaceChildren(...(r.ok ? r.body.diff.split("\n").map((line) => h("span", {
      className: line.startsWith("+") && !line.startsWith("+++") ? "diff-add"
        : line.startsWith("-") && !line.startsWith("---") ? "diff-del" : "",
      textContent: `${line}\n` })) : [r.body?.error || `HTTP ${r.status}`]));
    pre.hidden = false;
    pre.setAttribute("aria-label", `Changes in revision ${rev.slice(0, 8)}`);
    this.el.querySelectorAll("#memory-history button[aria-pressed]").forEach((b) => b.removeAttribute("aria-pressed"));
    button.setAttribute("aria-pressed", "true");
    pre.focus();
  }
}

// ``text`` with each of ``terms`` (whole words, any case) in <mark>, safely.
function mark(text, terms) {
  const span = h("span");
  if (!terms.length) {
    span.textContent = text;
    return span;
  }
  const escaped = terms.map((t) => t.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  const re = new RegExp(`\\b(${escaped.join("|")})\\w*`, "gi");
  let at = 0;
  for (const m of text.matchAll(re)) {
    span.append(text.slice(at, m.index), h("mark", { textContent: m[0] }));
    at = m.index + m[0].length;
  }
  span.append(text.slice(at));
  return span;
}
