// The conversation: saved history, the streaming turn, tool cards, thinking panels,
// sibling arrows, edit-and-resend and regenerate.
import { decorateCode, setMarkdown } from "./markdown.js";

const el = (tag, cls, text) => {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
};

function button(label, onClick, cls = "link-btn", aria) {
  const b = el("button", cls, label);
  b.type = "button";
  if (aria) b.setAttribute("aria-label", aria);
  b.addEventListener("click", onClick);
  return b;
}

function pretty(value) {
  if (typeof value === "string") {
    try {
      return JSON.stringify(JSON.parse(value), null, 2);
    } catch {
      return value;
    }
  }
  return JSON.stringify(value, null, 2);
}

// How a saved answer ended, when it did not end by itself: "interrupted" is an answer
// whose turn never finished (the server stopped, or it is still being written elsewhere).
const FINISH_NOTES = { cancelled: "(stopped)", interrupted: "(interrupted)" };

export class ChatView {
  constructor(root, actions) {
    this.root = root;
    this.actions = actions; // {edit(entryId, text), regenerate(), switchTo(entryId)}
    this.modelName = "assistant";
    this.live = null;
    this.pending = false;
  }

  // -- saved history --------------------------------------------------------------
  renderHistory(items) {
    this.root.replaceChildren();
    this.live = null;
    if (!items.length) {
      this.root.append(el("p", "empty-hint", "Ask anything. Your chats are saved on this machine."));
      return;
    }
    const results = new Map(items.filter((i) => i.role === "tool").map((i) => [i.toolCallId, i]));
    let group = null;
    const lastAnswer = [...items].reverse().find((i) => i.role === "assistant");
    const last = items[items.length - 1];
    for (const item of items) {
      if (item.role === "user") {
        group = null;
        this.root.append(this.userMessage(item));
      } else if (item.role === "assistant") {
        if (!group) {
          if (item.meta?.trimmed) this.trimNote(item.meta.trimmed);
          group = this.assistantMessage(item.id);
          this.root.append(group.article);
          this.siblingArrows(group.footer, item);
        }
        this.fillSegment(group, item, results);
        if (item === lastAnswer) this.answerActions(group, item);
      } else if (item.role === "system") {
        this.root.append(el("p", "system-note", item.content));
      }
    }
    if (last.role === "user") this.unanswered(); // the answer never started (a crash, a reload)
    this.scroll(true);
  }

  userMessage(item) {
    const article = el("article", "msg user");
    article.dataset.id = item.id;
    article.append(el("div", "msg-role", "You"));
    if (item.images?.length) {
      const imgs = el("div", "msg-images");
      item.images.forEach((src) => {
        const img = el("img");
        img.src = src;
        img.alt = "attached image";
        imgs.append(img);
      });
      article.append(imgs);
    }
    const body = el("div", "msg-body plain", item.content);
    article.append(body);
    const footer = el("footer", "msg-actions");
    this.siblingArrows(footer, item);
    footer.append(button("Edit", () => this.editInPlace(article, body, item), "link-btn",
      "Edit this message and send it again"));
    article.append(footer);
    return article;
  }

  editInPlace(article, body, item) {
    if (article.querySelector(".edit-box")) return;
    const box = el("form", "edit-box");
    const area = el("textarea");
    area.value = item.content;
    area.rows = Math.min(10, Math.max(2, item.content.split("\n").length));
    area.setAttribute("aria-label", "Edited message");
    const send = el("button", "primary", "Send");
    send.type = "submit";
    box.append(area, send, button("Cancel", () => { box.remove(); body.hidden = false; }));
    box.addEventListener("submit", (event) => {
      event.preventDefault();
      if (this.actions.edit(item.id, area.value)) box.remove();
    });
    body.hidden = true;
    body.after(box);
    area.focus();
  }

  assistantMessage(id) {
    const article = el("article", "msg assistant");
    if (id) article.dataset.id = id;
    article.append(el("div", "msg-role", this.modelName));
    const segments = el("div", "segments");
    const footer = el("footer", "msg-actions");
    article.append(segments, footer);
    return { article, segments, footer, cards: new Map() };
  }

  segment(group) {
    const seg = el("div", "segment");
    const thinking = el("details", "thinking");
    thinking.hidden = true;
    thinking.append(el("summary", null, "Thinking"), el("div", "thinking-body"));
    const tools = el("div", "tool-cards");
    const body = el("div", "msg-body markdown");
    seg.append(thinking, body, tools);
    group.segments.append(seg);
    return { seg, thinking, tools, body, text: "", reasoning: "" };
  }

  fillSegment(group, item, results) {
    const s = this.segment(group);
    if (item.reasoning) {
      s.thinking.hidden = false;
      s.thinking.querySelector(".thinking-body").textContent = item.reasoning;
    }
    if (item.content) setMarkdown(s.body, item.content);
    for (const call of item.toolCalls || []) {
      const card = this.toolCard(s.tools, call.id, call.name, call.arguments);
      const result = results.get(call.id);
      if (result) this.finishCard(card, result.meta?.ok !== false, result.content);
    }
    const marker = FINISH_NOTES[item.meta?.finish];
    if (marker) s.body.append(el("p", "muted finish-note", marker));
  }

  unanswered() {
    const article = el("article", "msg unanswered");
    const footer = el("footer", "msg-actions");
    footer.append(el("span", "finish-note", "(no answer)"), button("Regenerate",
      () => this.actions.regenerate(), "link-btn", "Answer this message again"));
    article.append(footer);
    this.root.append(article);
  }

  answerActions(group, item) {
    const meta = item.meta || {};
    if (meta.lane) group.footer.append(el("span", "meta", `${meta.lane} lane`));
    if (meta.usage) group.footer.append(el("span", "meta", `${meta.usage.completion_tokens} tokens`));
    group.footer.append(button("Regenerate", () => this.actions.regenerate(), "link-btn",
      "Answer this message again"));
  }

  siblingArrows(footer, item) {
    const sib = item.siblings;
    if (!sib || sib.count < 2) return;
    const nav = el("span", "siblings");
    nav.setAttribute("role", "group");
    nav.setAttribute("aria-label", "Versions");
    const prev = button("‹", () => this.actions.switchTo(sib.ids[sib.index - 1]), "link-btn",
      "Previous version");
    const next = button("›", () => this.actions.switchTo(sib.ids[sib.index + 1]), "link-btn",
      "Next version");
    prev.disabled = sib.index === 0;
    next.disabled = sib.index === sib.count - 1;
    nav.append(prev, el("span", null, `${sib.index + 1}/${sib.count}`), next);
    footer.prepend(nav);
  }

  toolCard(parent, callId, name, args) {
    const card = el("details", "tool-card running");
    card.dataset.callId = callId || "";
    const summary = el("summary");
    summary.append(el("span", "tool-name", name), el("span", "tool-status", "running…"));
    card.append(summary, el("pre", "tool-args", pretty(args ?? {})));
    parent.append(card);
    return card;
  }

  finishCard(card, ok, result) {
    card.classList.remove("running");
    card.classList.add(ok ? "ok" : "failed");
    card.querySelector(".tool-status").textContent = ok ? "done" : "failed";
    card.append(el("pre", "tool-result", pretty(result)));
  }

  // The overflow marker: older messages the model did not read for the answer below it.
  trimNote(dropped) {
    const words = dropped === 1 ? "1 earlier message was" : `${dropped} earlier messages were`;
    this.root.append(el("p", "system-note trim-note",
      `⋯ ${words} left out so the chat fits the model's context window`));
  }

  // -- the streaming turn -------------------------------------------------------------
  showPendingUser(text, images) {
    this.root.querySelector(".empty-hint")?.remove();
    this.root.append(this.userMessage({ id: "", content: text, images }));
    this.scroll(true);
  }

  beginTurn() {
    this.root.querySelector(".empty-hint")?.remove();
    const group = this.assistantMessage(null);
    group.article.classList.add("streaming");
    group.article.setAttribute("aria-busy", "true");
    this.root.append(group.article);
    this.live = { group, seg: this.segment(group), frame: 0 };
    this.scroll(true);
  }

  liveSegment() {
    if (!this.live) this.beginTurn();
    if (this.live.afterTools) { // the answer after the tools reads below their cards
      this.live.seg = this.segment(this.live.group);
      this.live.afterTools = false;
    }
    return this.live.seg;
  }

  appendText(delta) {
    const seg = this.liveSegment();
    seg.text += delta;
    this.schedule();
  }

  appendThinking(delta) {
    const seg = this.liveSegment();
    seg.reasoning += delta;
    seg.thinking.hidden = false;
    if (!seg.text) seg.thinking.open = true;
    seg.thinking.querySelector(".thinking-body").textContent = seg.reasoning;
    this.scroll();
  }

  toolStart(frame) {
    if (!this.live) this.beginTurn();
    const seg = this.live.seg;
    this.live.group.cards.set(frame.callId, this.toolCard(seg.tools, frame.callId, frame.tool, frame.args));
    this.scroll();
  }

  toolEnd(frame) {
    const card = this.live?.group.cards.get(frame.callId);
    if (card) this.finishCard(card, frame.ok, frame.result);
    if (this.live) this.live.afterTools = true;
  }

  endTurn(frame) {
    if (!this.live) return;
    const { group, seg } = this.live;
    this.flush(true);
    // the history frame that follows draws the same note; drawn now, a stop shows at once
    const marker = FINISH_NOTES[frame.finish];
    if (marker) seg.body.append(el("p", "muted finish-note", marker));
    group.article.classList.remove("streaming");
    group.article.removeAttribute("aria-busy");
    if (frame.lane) group.footer.append(el("span", "meta", `${frame.lane} lane`));
    this.live = null;
  }

  schedule() {
    if (this.live.frame) return;
    this.live.frame = requestAnimationFrame(() => this.flush(false));
  }

  flush(final) {
    if (!this.live) return;
    this.live.frame = 0;
    const seg = this.live.seg;
    if (seg.text) {
      setMarkdown(seg.body, seg.text, final);
      if (seg.thinking.open && !final) seg.thinking.open = false;
    }
    if (final) decorateCode(this.live.group.article);
    this.scroll();
  }

  scroll(force = false) {
    const nearBottom = this.root.scrollHeight - this.root.scrollTop - this.root.clientHeight < 120;
    if (force || nearBottom) this.root.scrollTop = this.root.scrollHeight;
  }
}
