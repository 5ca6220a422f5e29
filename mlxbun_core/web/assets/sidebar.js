// The chats sidebar: new, open, fork, delete, and full-text search.
import { getJSON } from "./api.js";
import { escapeHTML } from "./markdown.js";

const FORK_ICON = '<svg viewBox="0 0 24 24" width="14" height="14" aria-hidden="true" fill="none" '
  + 'stroke="currentColor" stroke-width="2" stroke-linecap="round"><circle cx="6" cy="5" r="2"/>'
  + '<circle cx="18" cy="5" r="2"/><circle cx="12" cy="19" r="2"/><path d="M6 7v2a3 3 0 0 0 3 3h6a3 3 0 0 0 3-3V7M12 12v5"/></svg>';

function marked(snippet, ranges) {
  // escape first, then wrap the server's [start, end) ranges in <mark>
  let out = "";
  let at = 0;
  for (const [start, end] of ranges) {
    out += escapeHTML(snippet.slice(at, start)) + `<mark>${escapeHTML(snippet.slice(start, end))}</mark>`;
    at = end;
  }
  return out + escapeHTML(snippet.slice(at));
}

function when(seconds) {
  if (!seconds) return "";
  return new Date(seconds * 1000).toLocaleString([], { dateStyle: "medium", timeStyle: "short" });
}

export class Sidebar {
  constructor(send, onPicked) {
    this.send = send;
    this.onPicked = onPicked;
    this.list = document.getElementById("session-list");
    this.results = document.getElementById("search-results");
    this.search = document.getElementById("session-search");
    this.activePath = null;
    this.timer = 0;
    document.getElementById("new-session").addEventListener("click", () => {
      this.send({ type: "new_session" });
      this.onPicked();
    });
    this.search.addEventListener("input", () => {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.runSearch(), 250);
    });
  }

  // No chat on this server: no saved chats to list either (the banner says why, once).
  disable() {
    document.getElementById("new-session").disabled = true;
    this.search.disabled = true;
    const note = document.createElement("li");
    note.className = "muted sidebar-note";
    note.textContent = "No chats on this server.";
    this.list.replaceChildren(note);
  }

  render(items, activePath) {
    this.activePath = activePath;
    this.list.replaceChildren();
    this.list.dataset.rendered = "true"; // the server's list has arrived (tests wait on it)
    for (const item of items) {
      const li = document.createElement("li");
      li.className = "session" + (item.path === activePath ? " active" : "");
      const open = document.createElement("button");
      open.type = "button";
      open.className = "session-open";
      open.innerHTML = `<span class="session-title"></span><span class="session-when"></span>`;
      open.querySelector(".session-title").textContent = item.title;
      open.querySelector(".session-when").textContent = when(item.updated);
      if (item.path === activePath) open.setAttribute("aria-current", "true");
      open.addEventListener("click", () => this.open(item.path));
      const fork = this.small(FORK_ICON, `Fork “${item.title}”`, () => {
        this.send({ type: "fork_session", path: item.path });
        this.onPicked();
      });
      const del = this.small("✕", `Delete “${item.title}”`, () => {
        if (confirm(`Delete “${item.title}”? This cannot be undone.`)) {
          this.send({ type: "delete_session", path: item.path });
        }
      });
      li.append(open, fork, del);
      this.list.append(li);
    }
  }

  small(label, aria, onClick) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "icon-btn small";
    if (label.startsWith("<svg")) b.innerHTML = label;
    else b.textContent = label;
    b.title = aria;
    b.setAttribute("aria-label", aria);
    b.addEventListener("click", onClick);
    return b;
  }

  open(path) {
    this.send({ type: "open_session", path });
    this.onPicked();
  }

  async runSearch() {
    const q = this.search.value.trim();
    if (!q) {
      this.results.replaceChildren();
      return;
    }
    const r = await getJSON(`/api/sessions/search?q=${encodeURIComponent(q)}`);
    if (q !== this.search.value.trim()) return; // a newer search is on its way
    this.results.replaceChildren();
    if (!r.ok) {
      this.results.textContent = r.body?.error?.message || r.body?.error || "search failed";
      return;
    }
    if (!r.body.results.length) {
      this.results.textContent = "No matches.";
      return;
    }
    for (const hit of r.body.results) {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "search-hit";
      const title = document.createElement("strong");
      title.textContent = hit.sessionTitle;
      b.append(title);
      for (const m of hit.matches.slice(0, 3)) {
        const p = document.createElement("span");
        p.className = "search-snippet";
        p.innerHTML = marked(m.snippet, m.ranges);
        b.append(p);
      }
      b.addEventListener("click", () => this.open(hit.sessionPath));
      this.results.append(b);
    }
  }
}
