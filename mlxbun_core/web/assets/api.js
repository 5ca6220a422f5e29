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

// Why the chat socket could not open: the guard's answer for an admin route.
export async function socketRefusal() {
  const r = await getJSON("/api/sessions/search?q=%20");
  if (r.status === 401 || r.status === 403) return r.body?.error?.message || `HTTP ${r.status}`;
  return null;
}
