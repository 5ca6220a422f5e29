// Written by `mlxbun harness pi`; `mlxbun harness pi --remove` deletes it.
// pi's `/adapter` command for an mlxbun server: pick a LoRA adapter from pi.
//
//   /adapter, /adapter list   adapters on disk, which are loaded, the active one
//   /adapter <id>[+<id>]      load it if needed (POST /v1/adapters), then send
//                             `adapter: <id>` with every request to mlxbun
//   /adapter <id> --force     load one trained on another base model anyway
//   /adapter off              send no adapter field (the server's default applies)
//   /adapter none             the base model, even over a `serve --adapter` default
//
// The server is MLXBUN_URL when set, else DEFAULT_URL below; MLXBUN_API_KEY, when the
// server has one, is read from the environment. Only requests that go to mlxbun get
// the field (pi's `mlxbun` provider, or any model whose base URL is this server).
// Standalone use: copy this file into ~/.pi/agent/extensions/ and `/reload` in pi.
import type { ExtensionAPI, ExtensionContext } from "@earendil-works/pi-coding-agent";

const DEFAULT_URL = "http://127.0.0.1:8080";
const PROVIDER = "mlxbun";
const STATUS_KEY = "mlxbun-adapter";

type OnDisk = { id: string; path: string; base_model?: string | null; compatible?: boolean;
                mounted?: boolean; mounted_as?: string | null };
type Loaded = { id: string; path?: string };

function root(url: string): string {
  return url.trim().replace(/\/+$/, "").replace(/\/v1$/, "");
}

const SERVER = root(process.env.MLXBUN_URL || DEFAULT_URL);

async function call(path: string, body?: unknown): Promise<any> {
  const key = process.env.MLXBUN_API_KEY;
  const headers: Record<string, string> = key ? { Authorization: `Bearer ${key}` } : {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let answer: Response;
  try {
    answer = await fetch(`${SERVER}${path}`, {
      method: body === undefined ? "GET" : "POST", headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(120_000), // a mount waits for the decode step in flight
    });
  } catch (error) {
    throw new Error(`no mlxbun server answers at ${SERVER} (set MLXBUN_URL): ${error}`);
  }
  const data = await answer.json().catch(() => ({}));
  if (!answer.ok) throw new Error(data?.error?.message ?? `${path}: HTTP ${answer.status}`);
  return data;
}

async function state(): Promise<{ disk: OnDisk[]; loaded: Loaded[]; serverDefault?: string }> {
  const [disk, loaded] = await Promise.all([call("/v1/adapters/available"), call("/v1/adapters")]);
  return { disk: disk.adapters ?? [], loaded: loaded.adapters ?? [],
           serverDefault: loaded.default ?? undefined };
}

function listing(s: Awaited<ReturnType<typeof state>>, active: string | undefined): string {
  const loadedIds = new Set(s.loaded.map((a) => a.id));
  const lines = [`mlxbun adapters at ${SERVER}:`];
  for (const a of s.disk) {
    const notes: string[] = [];
    if (a.mounted) notes.push(a.mounted_as && a.mounted_as !== a.id ? `loaded as ${a.mounted_as}` : "loaded");
    if (a.compatible === false) notes.push(`trained on ${a.base_model}: needs --force`);
    lines.push(`  ${a.id}${notes.length ? `  (${notes.join(", ")})` : ""}  ${a.path}`);
    if (a.mounted_as) loadedIds.delete(a.mounted_as);
  }
  for (const id of loadedIds) lines.push(`  ${id}  (loaded, not in the adapter folders)`);
  if (lines.length === 1) lines.push("  none on disk (<mlxbun home>/adapters or /finetunes, ~/.cache/mlxbun by default)");
  const fallback = s.serverDefault ? `the server's default, ${s.serverDefault}` : "the base model";
  lines.push(`active: ${active ?? `none (requests get ${fallback})`}`);
  return lines.join("\n");
}

/** Load every id of `spec` ("a" or "a+b") that is not loaded yet, from the adapter folders. */
async function mount(spec: string, force: boolean): Promise<string[]> {
  const ids = spec.split(/[+,]/).map((id) => id.trim());
  if (ids.some((id) => !id)) throw new Error(`adapter spec ${JSON.stringify(spec)} has an empty name`);
  const s = await state();
  const loadedIds = new Set(s.loaded.map((a) => a.id));
  const mounted: string[] = [];
  for (const id of ids) {
    if (loadedIds.has(id)) continue;
    const found = s.disk.find((a) => a.id === id);
    if (!found) {
      const names = s.disk.map((a) => a.id).join(", ") || "none";
      throw new Error(`no adapter ${id} on disk or loaded (on disk: ${names})`);
    }
    await call("/v1/adapters", { id, path: found.path, force });
    mounted.push(id);
  }
  return mounted;
}

function forMlxbun(ctx: ExtensionContext): boolean {
  const model = ctx.model as { provider?: string; baseUrl?: string } | undefined;
  return model?.provider === PROVIDER || (!!model?.baseUrl && root(model.baseUrl) === SERVER);
}

export default function (pi: ExtensionAPI) {
  let active: string | undefined; // the `adapter` field sent; undefined: none sent
  let known: string[] = []; // ids seen by the last listing, for completion

  function show(ctx: ExtensionContext) {
    ctx.ui.setStatus(STATUS_KEY, active ? `adapter: ${active}` : undefined);
  }

  pi.registerCommand("adapter", {
    description: "mlxbun LoRA adapter: /adapter [list | <id> [--force] | off | none]",
    getArgumentCompletions: async (prefix: string) => {
      if (!known.length) known = await state().then((s) => s.disk.map((a) => a.id)).catch(() => []);
      const items = ["list", "off", "none", ...known].filter((word) => word.startsWith(prefix));
      return items.length ? items.map((word) => ({ value: word, label: word })) : null;
    },
    handler: async (args: string, ctx) => {
      const words = args.trim().split(/\s+/).filter(Boolean);
      const force = words.includes("--force");
      const rest = words.filter((word) => word !== "--force");
      try {
        if (rest.length > 1) throw new Error("usage: /adapter [list | <id>[+<id>] [--force] | off | none]");
        const what = rest[0] ?? "list";
        if (what === "list") {
          const s = await state();
          known = s.disk.map((a) => a.id);
          ctx.ui.notify(listing(s, active), "info");
        } else if (what === "off") {
          active = undefined;
          ctx.ui.notify("adapter off: requests carry no adapter field", "info");
        } else if (what === "none") {
          active = "none";
          ctx.ui.notify("adapter none: requests ask for the base model", "info");
        } else {
          const mounted = await mount(what, force);
          active = what;
          const loadedNote = mounted.length ? `loaded ${mounted.join(", ")}; ` : "";
          const where = forMlxbun(ctx) ? "" : ` (once the model is mlxbun's: now ${ctx.model?.provider ?? "none"})`;
          ctx.ui.notify(`${loadedNote}adapter ${what} active: every request to mlxbun carries it${where}`, "info");
        }
        show(ctx);
      } catch (error) {
        ctx.ui.notify(`/adapter: ${error instanceof Error ? error.message : error}`, "error");
      }
    },
  });

  pi.on("before_provider_request", (event, ctx) => {
    const payload = event.payload;
    if (!active || !forMlxbun(ctx) || !payload || typeof payload !== "object") return undefined;
    return { ...(payload as Record<string, unknown>), adapter: active };
  });
}
