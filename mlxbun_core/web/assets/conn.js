// The /ws/chat connection: JSON frames both ways, reconnects with backoff. A handshake the
// server refused (401 key, 403 remote client, 501 no chat here) is not retried: retrying
// cannot help until the user acts.
import { apiKey, socketRefusal } from "./api.js";

export class ChatSocket {
  constructor(onFrame, onStatus) {
    this.onFrame = onFrame;
    this.onStatus = onStatus;
    this.ws = null;
    this.backoff = 500;
  }

  url() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const key = apiKey();
    return `${scheme}://${location.host}/ws/chat${key ? `?api_key=${encodeURIComponent(key)}` : ""}`;
  }

  connect() {
    this.onStatus("connecting", "connecting…");
    const ws = new WebSocket(this.url());
    this.ws = ws;
    let opened = false;
    ws.onopen = () => {
      opened = true;
      this.backoff = 500;
      this.onStatus("open", "connected");
    };
    ws.onmessage = (event) => {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch {
        return;
      }
      this.onFrame(frame);
    };
    ws.onclose = async () => {
      if (this.ws !== ws) return;
      this.ws = null;
      const refusal = opened ? null : await socketRefusal().catch(() => null);
      if (refusal) {
        this.onStatus("refused", refusal.message, refusal);
        return;
      }
      this.onStatus("closed", "disconnected — retrying");
      setTimeout(() => this.connect(), this.backoff);
      this.backoff = Math.min(this.backoff * 2, 15000);
    };
  }

  get open() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  send(frame) {
    if (!this.open) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }
}
