// The message box: Enter sends, Shift+Enter breaks the line, images attach as data URLs
// (from the file picker or a paste), Stop aborts the running turn.
const MAX_IMAGE_BYTES = 8 << 20;

function readImage(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => {
      const url = String(reader.result);
      resolve({ url, mimeType: file.type, data: url.slice(url.indexOf(",") + 1), name: file.name });
    };
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

export class Composer {
  constructor(onSend, onStop) {
    this.onSend = onSend;
    this.form = document.getElementById("composer");
    this.input = document.getElementById("composer-input");
    this.sendButton = document.getElementById("send");
    this.stopButton = document.getElementById("stop");
    this.tray = document.getElementById("attachments");
    this.picker = document.getElementById("attach-input");
    this.images = [];
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.submit();
    });
    this.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.submit();
      }
    });
    this.input.addEventListener("input", () => this.grow());
    this.input.addEventListener("paste", (event) => {
      const files = [...(event.clipboardData?.files || [])].filter((f) => f.type.startsWith("image/"));
      if (files.length) this.attach(files);
    });
    document.getElementById("attach").addEventListener("click", () => this.picker.click());
    this.picker.addEventListener("change", () => {
      this.attach([...this.picker.files]);
      this.picker.value = "";
    });
    this.stopButton.addEventListener("click", onStop);
  }

  ready(frame) {
    const hint = frame.vision ? "Attach images" : "Attach images (this model has no vision: it will refuse them)";
    document.getElementById("attach").title = hint;
  }

  async attach(files) {
    for (const file of files) {
      if (!file.type.startsWith("image/") || file.size > MAX_IMAGE_BYTES) continue;
      this.images.push(await readImage(file));
    }
    this.renderTray();
  }

  renderTray() {
    this.tray.replaceChildren();
    this.images.forEach((img, i) => {
      const chip = document.createElement("span");
      chip.className = "chip";
      const thumb = document.createElement("img");
      thumb.src = img.url;
      thumb.alt = img.name || "image";
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "icon-btn small";
      remove.textContent = "✕";
      remove.setAttribute("aria-label", `Remove ${img.name || "image"}`);
      remove.addEventListener("click", () => {
        this.images.splice(i, 1);
        this.renderTray();
      });
      chip.append(thumb, remove);
      this.tray.append(chip);
    });
  }

  submit() {
    const text = this.input.value;
    if (!text.trim() && !this.images.length) return;
    if (this.onSend(text, this.images)) {
      this.input.value = "";
      this.images = [];
      this.renderTray();
      this.grow();
    }
  }

  restore(text, images) {
    this.input.value = text;
    this.images = images;
    this.renderTray();
    this.grow();
  }

  // No chat on this server: nothing here can be sent (the banner says why, once).
  disable() {
    this.input.disabled = true;
    this.input.placeholder = "Chat unavailable";
    for (const id of ["send", "attach", "thinking", "settings-toggle"]) {
      document.getElementById(id).disabled = true;
    }
  }

  busy(on) {
    this.sendButton.hidden = on;
    this.stopButton.hidden = !on;
    if (!on) this.input.focus({ preventScroll: true });
  }

  grow() {
    this.input.style.height = "auto";
    this.input.style.height = `${Math.min(this.input.scrollHeight, 240)}px`;
  }
}
