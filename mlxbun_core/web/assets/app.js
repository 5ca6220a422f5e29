// The web app: hash routes (#chat, #status), the chat socket, and the wiring between
// the views. No framework and no build step; every import is a file in /assets.
import { chatAvailability } from "./api.js";
import { snapshot, spotlight } from "./appctx.js";
import { ChatView } from "./chat.js";
import { ChatCurve } from "./chatcurve.js";
import { Coding } from "./coding.js";
import { ChatSocket } from "./conn.js";
import { Composer } from "./composer.js";
import { ModelsView } from "./models.js";
import { LAB_ROUTES, LabViews } from "./lab.js";
import { MemoryView } from "./memory.js";
import { Settings } from "./settings.js";
import { Sidebar } from "./sidebar.js";
import { StatusView } from "./status.js";

const ROUTES = ["chat", "status", "models", "memory", ...LAB_ROUTES];
const $ = (id) => document.getElementById(id);
const lab = new LabViews($("main"));

// the open chat survives a reload of this tab (sessionStorage is per tab)
const ACTIVE = "mlxbun.activePath";
const state = { route: "chat", activePath: sessionStorage.getItem(ACTIVE), busy: false,
  awaiting: null, ready: false, unavailable: null, restoring: false };

const socket = new ChatSocket(onFrame, onStatus);
const send = (frame) => {
  if (socket.send(frame)) return true;
  showError(state.unavailable || "Not connected to the server yet.");
  return false;
};

const chat = new ChatView($("messages"), {
  edit: (entryId, text) => !state.busy && send({ type: "edit_resend", entryId, text }),
  regenerate: () => !state.busy && send({ type: "regenerate" }),
  switchTo: (entryId) => !state.busy && send({ type: "switch_sibling", entryId }),
});
const settings = new Settings(send);
const curve = new ChatCurve(send);
const coding = new Coding(send, chat);
const sidebar = new Sidebar(send, () => setSidebar(false));
const status = new StatusView();
const models = new ModelsView();
const memory = new MemoryView($("main"));
const composer = new Composer((text, images) => {
  if (state.busy || !send({ type: "prompt", text, images: images.map(({ data, mimeType }) => ({ data, mimeType })) })) {
    return false;
  }
  state.awaiting = { text, images };
  chat.showPendingUser(text, images.map((i) => i.url));
  setBusy(true);
  return true;
}, () => send({ type: "abort" }));

// -- frames from the server --------------------------------------------------------
function onFrame(frame) {
  switch (frame.type) {
    case "ready":
      state.ready = true;
      $("model-name").textContent = frame.model;
      chat.modelName = frame.model;
      settings.ready(frame);
      composer.ready(frame);
      if (state.activePath) {
        state.restoring = true; // a session that is gone since is forgotten quietly
        send({ type: "open_session", path: state.activePath });
      }
      curve.ready(); // a curve from the Curves page ("use in chat") goes to this chat
      pushContext();
      break;
    case "settings": settings.show(frame); curve.show(frame); break;
    case "history":
      state.restoring = false;
      chat.renderHistory(frame.items);
      break;
    case "sessions":
      state.activePath = frame.activePath;
      if (frame.activePath) sessionStorage.setItem(ACTIVE, frame.activePath);
      else sessionStorage.removeItem(ACTIVE);
      sidebar.render(frame.items, frame.activePath);
      break;
    case "turn_start":
      state.awaiting = null;
      setBusy(true);
      chat.beginTurn();
      break;
    case "text_delta": chat.appendText(frame.delta); break;
    case "thinking_delta": chat.appendThinking(frame.delta); break;
    case "tool_start": chat.toolStart(frame); break;
    case "tool_end": chat.toolEnd(frame); break;
    case "tool_approval_request": coding.request(frame); break;
    case "tool_update": coding.update(frame); break;
    case "queue_update": coding.queue(frame); break;
    case "coding_tools": coding.state(frame); break;
    case "tool_approvals": coding.approvals(frame); break;
    case "mcp_status": coding.mcpStatus(frame); break;
    case "turn_end":
      chat.endTurn(frame);
      setBusy(false);
      break;
    case "context": showContext(frame); break;
    case "context_trimmed": chat.trimNote(frame.dropped); break;
    case "ui_navigate": navigate(frame.route); break;
    case "ui_spotlight":
      if (frame.route && frame.route !== state.route) navigate(frame.route);
      setTimeout(() => spotlight(frame), 50);
      break;
    case "error": onError(frame); break;
    default: break; // siblings: the history items carry them
  }
}

function onError(frame) {
  if (state.restoring && frame.status === 404) { // the chat open before the reload is gone
    state.restoring = false;
    state.activePath = null;
    sessionStorage.removeItem(ACTIVE);
    return;
  }
  showError(frame.message);
  curve.refused(frame.message);
  if (state.awaiting) { // the prompt was refused: nothing was saved, give the text back
    composer.restore(state.awaiting.text, state.awaiting.images);
    state.awaiting = null;
    $("messages").lastElementChild?.remove();
    setBusy(false);
  }
}

function onStatus(kind, text) {
  const conn = $("conn");
  conn.textContent = text;
  conn.dataset.state = kind;
  if (kind !== "open" && state.busy) {
    chat.endTurn({});
    setBusy(false);
  }
  if (kind === "refused") chatUnavailable(text);
}

// The server cannot host the chat (under --isolate, or it refused this client): say so
// once, keep it on screen, and disable everything that would need the socket.
function chatUnavailable(reason) {
  state.unavailable = reason;
  const conn = $("conn");
  conn.textContent = "chat unavailable";
  conn.dataset.state = "refused";
  composer.disable();
  sidebar.disable();
  document.querySelector("#messages .empty-hint")?.remove(); // "Ask anything" would mislead
  showError(reason, true);
}

async function start() {
  const chat = await chatAvailability();
  if (chat && !chat.available) {
    chatUnavailable(chat.reason || "The chat is not available on this server.");
    return;
  }
  socket.connect();
}

function setBusy(busy) {
  state.busy = busy;
  composer.busy(busy);
}

let errorTimer = 0;
function showError(message, sticky = false) {
  const box = $("error");
  if (box.dataset.sticky && !sticky) return; // a lasting reason outranks passing errors
  box.textContent = message;
  box.hidden = false;
  clearTimeout(errorTimer);
  if (sticky) box.dataset.sticky = "1";
  else errorTimer = setTimeout(() => { box.hidden = true; }, 8000);
}

function showContext(frame) {
  const meter = $("context-meter");
  if (!frame.contextWindow) {
    meter.textContent = frame.tokens ? `${frame.tokens} tokens` : "";
    return;
  }
  meter.textContent = `${frame.tokens.toLocaleString()} / ${frame.contextWindow.toLocaleString()} tokens`;
  meter.dataset.level = frame.percent > 90 ? "high" : frame.percent > 70 ? "mid" : "low";
  meter.setAttribute("aria-label", `Context window ${frame.percent}% used`);
  meter.title = frame.warning || "Context window used";
  const warn = $("context-warning");
  warn.textContent = frame.warning || "";
  warn.hidden = !frame.warning;
}

// -- routes ------------------------------------------------------------------------
function navigate(route) {
  if (ROUTES.includes(route)) location.hash = `#${route}`;
}

function applyRoute() {
  const wanted = (location.hash.replace(/^#\/?/, "") || "chat").split("/")[0]; // #memory/<article>
  const route = ROUTES.includes(wanted) ? wanted : "chat";
  if (route !== state.route) state.step = null;
  state.route = route;
  for (const r of ROUTES) $(`view-${r}`).hidden = r !== state.route;
  document.querySelectorAll(".views a").forEach((a) => {
    if (a.dataset.route === state.route) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  });
  document.title = state.route === "chat" ? "mlxbun" : `mlxbun · ${state.route}`;
  status.show(state.route === "status");
  models.show(state.route === "models");
  memory.show(state.route === "memory");
  lab.show(state.route);
  revealCurrentLink();
  pushContext();
}

// On a narrow screen the page links scroll sideways: keep the current one in view.
function revealCurrentLink() {
  const nav = document.querySelector(".views");
  const current = nav.querySelector("a[aria-current=page]");
  if (!current || nav.scrollWidth <= nav.clientWidth) return;
  const box = current.getBoundingClientRect();
  const edge = nav.getBoundingClientRect();
  if (box.left < edge.left || box.right > edge.right) {
    nav.scrollLeft += box.left - edge.left - (edge.width - box.width) / 2;
  }
}

function pushContext() {
  if (!state.ready) return;
  const view = { chat: "conversation", status: "server status", models: "model library", memory: "memory vault" }[state.route] || `${state.route} jobs`;
  const context = { route: state.route, view, snapshot: snapshot(state.route) };
  if (state.step && state.step.route === state.route) {
    const { index, count, label } = state.step;
    context.step = { index, count, label };
  }
  socket.send({ type: "context", context });
}

// A lab form's numbered steps (its fieldsets, "1 · Model", "2 · Recipe"): the step that
// takes the focus is pushed with the context, so the assistant knows where the user is.
$("main").addEventListener("focusin", (event) => {
  const fieldset = event.target.closest(".lab-form > fieldset");
  if (!fieldset) return;
  const steps = [...fieldset.parentElement.querySelectorAll(":scope > fieldset")];
  const index = steps.indexOf(fieldset);
  if (state.step?.route === state.route && state.step.index === index) return;
  const label = fieldset.querySelector("legend")?.textContent || "";
  state.step = { route: state.route, index, count: steps.length, label };
  pushContext();
});

// On a phone the chats list is a drawer over the page: its own close button and a tap on
// the dimmed page close it, and focus goes back to the ☰ button that opened it.
function setSidebar(open) {
  const wasOpen = document.body.classList.contains("sidebar-open");
  document.body.classList.toggle("sidebar-open", open);
  $("sidebar-toggle").setAttribute("aria-expanded", String(open));
  $("sidebar-scrim").hidden = !open;
  if (open && !wasOpen) $("sidebar-close").focus({ preventScroll: true });
  if (!open && wasOpen && $("sidebar").contains(document.activeElement)) $("sidebar-toggle").focus();
}

$("sidebar-toggle").addEventListener("click", () =>
  setSidebar(!document.body.classList.contains("sidebar-open")));
$("sidebar-close").addEventListener("click", () => setSidebar(false));
$("sidebar-scrim").addEventListener("click", () => setSidebar(false));
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape") setSidebar(false);
});
$("key-form").addEventListener("submit", () => setTimeout(() => location.reload(), 0));
// the fine-tune page's "Chat with it": a new chat that uses the adapter it mounted
window.addEventListener("mlxbun:chat-with-adapter", (event) => {
  if (send({ type: "new_session" }) && send({ type: "set_adapter", id: event.detail })) navigate("chat");
});
window.addEventListener("hashchange", applyRoute);

applyRoute();
start();

// Installable as an app: a shell-only service worker, in secure contexts only.
const local = ["localhost", "127.0.0.1", "[::1]"].includes(location.hostname);
if ("serviceWorker" in navigator && (location.protocol === "https:" || local)) {
  navigator.serviceWorker.register("/sw.js", { scope: "/" }).catch(() => {});
}
