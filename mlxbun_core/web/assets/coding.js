// Coding tools: the switch and folder in the settings panel, the approval cards in the
// chat (allow once / always / deny), output and diffs on the tool cards, and the list of
// tools the user always allows (revocable). The server confines and gates; this only asks.
import { apiKey } from "./api.js";

const el = (tag, cls, text) => {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
};
const $ = (id) => document.getElementById(id);

export class Coding {
  constructor(send, chat) {
    this.send = send;
    this.chat = chat;
    this.enabled = $("coding-enabled");
    this.folder = $("coding-folder");
    this.note = $("coding-note");
    this.always = $("coding-always");
    this.waiting = $("approval-queue");
    this.enabled.addEventListener("change", () => this.apply());
    $("coding-apply").addEventListener("click", () => this.apply());
  }

  apply() {
    const frame = { type: "set_coding_tools", enabled: this.enabled.checked };
    if (this.enabled.checked) frame.workspace = this.folder.value.trim() || null;
    this.send(frame);
  }

  // coding_tools {active, workspace, pending, available}
  state(frame) {
    this.enabled.checked = frame.active;
    this.enabled.disabled = !frame.available;
    if (frame.workspace && document.activeElement !== this.folder) this.folder.value = frame.workspace;
    this.note.textContent = !frame.available ? "Coding tools answer loopback clients only."
      : frame.active ? `On in ${frame.workspace}: edits, writes and commands ask you first.` : "Off.";
  }

  // tool_approvals {alwaysAllow}
  approvals(frame) {
    this.always.replaceChildren(...frame.alwaysAllow.map((tool) => {
      const item = el("li", null, `${tool} `);
      const forget = el("button", "link-btn", "revoke");
      forget.type = "button";
      forget.setAttribute("aria-label", `Stop always allowing ${tool}`);
      forget.addEventListener("click", () => this.revoke(tool));
      item.append(forget);
      return item;
    }));
    if (!frame.alwaysAllow.length) this.always.append(el("li", "muted", "none"));
  }

  async revoke(tool) {
    const headers = { "Content-Type": "application/json" };
    if (apiKey()) headers.Authorization = `Bearer ${apiKey()}`;
    const r = await fetch("/api/settings/tool-approvals", { method: "DELETE", headers,
      body: JSON.stringify({ tool }) });
    if (r.ok) this.approvals(await r.json());
  }

  // queue_update {approvals: [{callId, tool}]}
  queue(frame) {
    const n = (frame.approvals || []).length;
    this.waiting.hidden = n === 0;
    this.waiting.textContent = n === 1 ? "1 call waits for your approval"
      : `${n} calls wait for your approval`;
  }

  // tool_approval_request {callId, tool, args, preview, approvalToken}: a card with the diff
  // or command; the answer echoes the card's token (the server takes no answer without it)
  request(frame) {
    const seg = this.chat.liveSegment();
    const card = el("section", "approval-card");
    card.dataset.callId = frame.callId;
    card.setAttribute("aria-label", `Approve ${frame.tool}`);
    const p = frame.preview || {};
    const mcp = p.server !== undefined;  // an MCP tool: the server, the tool and its arguments
    const what = mcp ? `Call ${p.tool} on MCP server ${p.server} (${p.where}, at most ${p.timeout} s):`
      : frame.tool === "bash" ? `Run in ${p.cwd} (through ${p.shell}, at most ${p.timeout} s):`
      : `${p.created ? "Create" : "Change"} ${p.path}:`;
    card.append(el("strong", "approval-title", `${frame.tool} wants to act`), el("p", null, what));
    const body = el("pre", mcp || frame.tool === "bash" ? "approval-command" : "approval-diff");
    if (mcp) body.textContent = p.arguments;
    else if (frame.tool === "bash") body.textContent = p.command;
    else renderDiff(body, p.diff || "");
    const row = el("div", "row approval-actions");
    const answer = (decision, alwaysAllow) => {
      this.send({ type: "approval", callId: frame.callId, decision, alwaysAllow,
        approvalToken: frame.approvalToken });
      row.querySelectorAll("button").forEach((b) => { b.disabled = true; });
      card.classList.add(decision === "deny" ? "denied" : "allowed");
      row.append(el("span", "muted", decision === "deny" ? "Denied."
        : alwaysAllow ? `Allowed; ${frame.tool} no longer asks.` : "Allowed once."));
    };
    for (const [label, cls, decision, always] of [["Allow once", "primary", "allow", false],
      [`Always allow ${frame.tool}`, "", "allow", true], ["Deny", "danger", "deny", false]]) {
      const b = el("button", cls, label);
      b.type = "button";
      b.addEventListener("click", () => answer(decision, always));
      row.append(b);
    }
    card.append(body, row);
    seg.tools.append(card);
    row.querySelector("button").focus({ preventScroll: true });
    this.chat.scroll(true);
  }

  // mcp_status {servers: [{name, state, tools, error}]}: one line per MCP server
  mcpStatus(frame) {
    const note = $("mcp-note");
    if (!note) return;
    note.replaceChildren(...(frame.servers || []).map((s) => el("div", null,
      `MCP ${s.name}: ${s.state}` + (s.state === "ready" ? ` (${s.tools.length} tools)` : "")
      + (s.error ? ` — ${s.error}` : ""))));
  }

  // tool_update {callId, kind, chunk}: output or a diff on the call's card
  update(frame) {
    const card = this.chat.live?.group.cards.get(frame.callId);
    if (!card) return;
    let out = card.querySelector(`.tool-${frame.kind === "diff" ? "diff" : "output"}`);
    if (!out) {
      out = el("pre", frame.kind === "diff" ? "tool-diff" : "tool-output");
      card.querySelector(".tool-args").after(out);
      card.open = true;
    }
    if (frame.kind === "diff") renderDiff(out, frame.chunk);
    else out.textContent += frame.chunk;
  }
}

function renderDiff(pre, diff) {
  pre.replaceChildren(...diff.split("\n").map((line) => {
    const cls = line.startsWith("+") && !line.startsWith("+++") ? "diff-add"
      : line.startsWith("-") && !line.startsWith("---") ? "diff-del" : null;
    return el("span", cls, `${line}\n`);
  }));
}
