// The shell-only service worker: installability and an instant paint of the page.
// It caches exactly the shell files and answers only those; every other request
// (/api/*, /v1/*, /ws/chat, /stats ...) goes to the network untouched. Not offline chat.
const VERSION = "__SHELL_VERSION__"; // the server fills in a hash of the shell files
const SHELL = __SHELL_FILES__;
const CACHE = "mlxbun-shell-" + VERSION;

self.addEventListener("install", (event) => {
  event.waitUntil(
    caches.open(CACHE)
      .then((cache) => cache.addAll(SHELL.map((url) => new Request(url, { cache: "reload" }))))
      .then(() => self.skipWaiting()));
});

self.addEventListener("activate", (event) => {
  event.waitUntil(
    caches.keys()
      .then((keys) => Promise.all(keys
        .filter((key) => key.startsWith("mlxbun-shell-") && key !== CACHE)
        .map((key) => caches.delete(key))))
      .then(() => self.clients.claim()));
});

self.addEventListener("fetch", (event) => {
  const request = event.request;
  if (request.method !== "GET") return;
  const url = new URL(request.url);
  if (url.origin !== self.location.origin || url.search || !SHELL.includes(url.pathname)) return;
  event.respondWith(
    caches.open(CACHE)
      .then((cache) => cache.match(url.pathname))
      .then((hit) => hit || fetch(request)));
});
