// Same-origin HTTP calls, with the API key when the server wants one.
const KEY = "mlxbun.apiKey";

export const apiKey = () => localStorage.getItem(KEY) || "";

export async function getJSON(path) {
  const headers = apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {};
  const response = await fetch(path, { headers });
  if (response.status === 401) await askForKey();
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  return { status: response.status, ok: response.ok, body };
}

// A JSON request with a body; on 401 the key dialog opens once and, given a key, the call
// is tried again with it.
export async function sendJSON(method, path, body) {
  const call = () => {
    const headers = { "Content-Type": "application/json" };
    if (apiKey()) headers.Authorization = `Bearer ${apiKey()}`;
    return fetch(path, { method, headers, body: body == null ? undefined : JSON.stringify(body) });
  };
  let response = await call();
  if (response.status === 401) {
    await askForKey();
    if (apiKey()) response = await call();
  }
  return { status: response.status, ok: response.ok, body: await response.json().catch(() => null) };
}

export const postJSON = (path, body, method = "POST") => sendJSON(method, path, body);

let asking = null;

// Show the key dialog once; resolves when the user saved a key.
export function askForKey() {
  if (asking) return asking;
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  asking = new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      if (input.value) localStorage.setItem(KEY, input.value);
      asking = null;
      resolve();
    }, { once: true });
    if (!dialog.open) dialog.showModal();
  });
  return asking;
}

// Why the chat socket could not open: a plain GET of /ws/chat answers 426 when all is
// well, else the reason (401 key, 403 remote client, 501 under --isolate).
export async function socketRefusal() {
  const r = await getJSON("/ws/chat");
  if ([401, 403, 501].includes(r.status)) {
    return { status: r.status, message: r.body?.error?.message || `HTTP ${r.status}` };
  }
  return null;
}

// Whether this server hosts the chat at all, from GET /v1's web_chat field ({available,
// reason}): the --isolate parent says no, so the page never opens a socket bound to fail.
// null when the server does not say; then the socket is simply tried.
export async function chatAvailability() {
  const r = await getJSON("/v1").catch(() => null);
  const chat = r?.ok ? r.body?.web_chat : null;
  return chat && typeof chat.available === "boolean" ? chat : null;
}
