// The web app: hash routes (#chat, #status), the chat socket, and the wiring between
// the views. No framework and no build step; every import is a file in /assets.
import { snapshot, spotlight } from "./appctx.js";
import { ChatView } from "./chat.js";
import { ChatSocket } from "./conn.js";
import { Composer } from "./composer.js";
import { Settings } from "./settings.js";
import { Sidebar } from "./sidebar.js";
import { StatusView } from "./status.js";

const ROUTES = ["chat", "status"];
const $ = (id) => document.getElementById(id);

const state = { route: "chat", activePath: null, busy: false, awaiting: null, ready: false };

const socket = new ChatSocket(onFrame, onStatus);
const send = (frame) => {
  if (socket.send(frame)) return true;
  showError("Not connected to the server yet.");
  return false;
};

const chat = new ChatView($("messages"), {
  edit: (entryId, text) => !state.busy && send({ type: "edit_resend", entryId, text }),
  regenerate: () => !state.busy && send({ type: "regenerate" }),
  switchTo: (entryId) => !state.busy && send({ type: "switch_sibling", entryId }),
});
const settings = new Settings(send);
const sidebar = new Sidebar(send, () => setSidebar(false));
const status = new StatusView();
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
      if (state.activePath) send({ type: "open_session", path: state.activePath });
      pushContext();
      break;
    case "settings": settings.show(frame); break;
    case "history": chat.renderHistory(frame.items); break;
    case "sessions":
      state.activePath = frame.activePath;
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
    case "turn_end":
      chat.endTurn(frame);
      setBusy(false);
      break;
    case "context": showContext(frame); break;
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
  showError(frame.message);
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
}

function setBusy(busy) {
  state.busy = busy;
  composer.busy(busy);
}

let errorTimer = 0;
function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = false;
  clearTimeout(errorTimer);
  errorTimer = setTimeout(() => { box.hidden = true; }, 8000);
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
}

// -- routes ------------------------------------------------------------------------
function navigate(route) {
  if (ROUTES.includes(route)) location.hash = `#${route}`;
}

function applyRoute() {
  const wanted = location.hash.replace(/^#\/?/, "") || "chat";
  state.route = ROUTES.includes(wanted) ? wanted : "chat";
  for (const r of ROUTES) $(`view-${r}`).hidden = r !== state.route;
  document.querySelectorAll(".views a").forEach((a) => {
    if (a.dataset.route === state.route) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  });
  document.title = state.route === "chat" ? "mlxbun" : `mlxbun · ${state.route}`;
  status.show(state.route === "status");
  pushContext();
}

function pushContext() {
  if (!state.ready) return;
  const view = state.route === "chat" ? "conversation" : "server status";
  socket.send({ type: "context", context: { route: state.route, view, snapshot: snapshot(state.route) } });
}

function setSidebar(open) {
  document.body.classList.toggle("sidebar-open", open);
  $("sidebar-toggle").setAttribute("aria-expanded", String(open));
}

$("sidebar-toggle").addEventListener("click", () =>
  setSidebar(!document.body.classList.contains("sidebar-open")));
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape") setSidebar(false);
});
$("key-form").addEventListener("submit", () => setTimeout(() => location.reload(), 0));
window.addEventListener("hashchange", applyRoute);

applyRoute();
socket.connect();

// Installable as an app: a shell-only service worker, in secure contexts only.
const local = ["localhost", "127.0.0.1", "[::1]"].includes(location.hostname);
if ("serviceWorker" in navigator && (location.protocol === "https:" || local)) {
  navigator.serviceWorker.register("/sw.js", { scope: "/" }).catch(() => {});
}
