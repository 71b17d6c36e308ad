// The Files panel of a session with a workspace of the gateway's: the tree (one folder at a
// time, with its path as links back up), a file's text, the last turn's changes and all the
// changes against the workspace's base (GET /diff, its patches coloured by line), upload by
// drag and drop or a file picker (POST /files, multipart, into the folder shown), download,
// and revert to a checkpoint or the base (POST /revert). A `workspace_changed` event of the
// session's stream refreshes what is shown.
//
// File contents and names only ever reach the page as text (textContent).

import { api, sessionPath } from "./api.js";
import { $, el } from "./dom.js";

/** What a file's view shows at most, in bytes. */
const SHOWN_BYTES = 1 << 20;

/** A workspace path as the files route takes it: each name encoded, joined by `/`. */
function encodePath(path) {
  return path.split("/").map(encodeURIComponent).join("/");
}

function join(folder, name) {
  return folder ? `${folder}/${name}` : name;
}

function size(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1 << 20) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / (1 << 20)).toFixed(1)} MiB`;
}

export class FilesPanel {
  /** `workspace` is the session view's; `ask` the console's confirmation dialog. */
  constructor(id, workspace, { ask }) {
    this.id = id;
    this.workspace = workspace;
    this.ask = ask;
    this.folder = "";
    this.tab = "tree";
    this.shown = null;
    this.refreshTimer = null;
    // Each refresh's number: an older one that answers last draws nothing.
    this.generation = 0;
    this.current = () => !this.closed;
    this.closed = false;
    this.box = $("files-box");
    this.box.hidden = !workspace;
    this.reset();
    if (!workspace) return;
    const git = !!workspace.base;
    for (const id of ["files-last-tab", "files-all-tab", "files-revert-row"]) $(id).hidden = !git;
    $("files-summary").textContent = workspace.branch
      ? `worktree on ${workspace.branch}`
      : `${workspace.kind} folder`;
    this.wire();
    this.show("tree");
  }

  close() {
    this.closed = true;
    clearTimeout(this.refreshTimer);
  }

  reset() {
    for (const id of ["files-crumbs", "files-list", "files-text", "files-diff", "files-revert-to"]) $(id).replaceChildren();
    $("files-error").textContent = $("files-status").textContent = "";
    $("files-view").hidden = true;
  }

  /** The panel's elements outlive it: each handler is set (not added), replacing the last. */
  wire() {
    $("files-tree-tab").onclick = () => this.show("tree");
    $("files-last-tab").onclick = () => this.show("last");
    $("files-all-tab").onclick = () => this.show("all");
    $("files-revert").onclick = () => this.revert();
    $("files-download").onclick = () => this.download();
    $("files-upload").onchange = (e) => {
      this.upload([...e.target.files]);
      e.target.value = "";
    };
    const drop = $("files-drop");
    drop.ondragover = (e) => {
      e.preventDefault();
      drop.classList.add("over");
    };
    drop.ondragleave = () => drop.classList.remove("over");
    drop.ondrop = (e) => {
      e.preventDefault();
      drop.classList.remove("over");
      this.upload([...(e.dataTransfer?.files || [])]);
    };
  }

  /** Called for each live `workspace_changed` event: refreshes soon, once for a burst. */
  changed() {
    clearTimeout(this.refreshTimer);
    this.refreshTimer = setTimeout(() => this.refresh(), 100);
  }

  async show(tab) {
    this.tab = tab;
    for (const [name, id] of [["tree", "files-tree-tab"], ["last", "files-last-tab"], ["all", "files-all-tab"]]) {
      $(id).setAttribute("aria-selected", String(name === tab));
    }
    await this.refresh();
  }

  /** Shows the open tab again, from the API, with the checkpoints to revert to. */
  async refresh() {
    if (this.closed) return;
    const generation = ++this.generation;
    this.current = () => !this.closed && this.generation === generation;
    $("files-error").textContent = "";
    const tree = this.tab === "tree";
    $("files-crumbs").hidden = $("files-list").hidden = !tree;
    $("files-diff").hidden = tree;
    if (!tree) $("files-view").hidden = true;
    try {
      if (tree) {
        await this.list();
        if (this.shown) await this.open(this.shown);
      } else {
        await this.diff(this.tab === "last");
      }
      if (this.workspace.base) await this.checkpoints();
    } catch (e) {
      if (this.current()) $("files-error").textContent = e.message;
    }
  }

  async list() {
    const path = this.folder ? `/files/${encodePath(this.folder)}` : "/files";
    let folder;
    try {
      folder = await api.get(sessionPath(this.id, path));
    } catch (e) {
      // The folder shown is gone (a revert, the agent): show the workspace's own.
      if (e.status !== 404 || !this.folder) throw e;
      this.folder = "";
      this.shown = null;
      return this.list();
    }
    if (!this.current()) return;
    this.crumbs();
    const items = folder.entries.map((entry) => {
      const li = el("li");
      const path = join(this.folder, entry.name);
      li.dataset.path = path;
      li.dataset.kind = entry.kind;
      if (entry.kind === "folder" || entry.kind === "file") {
        const a = el("button", "link", entry.kind === "folder" ? `${entry.name}/` : entry.name);
        a.type = "button";
        a.addEventListener("click", () => (entry.kind === "folder" ? this.enter(path) : this.open(path)));
        li.append(a);
      } else {
        li.append(el("span", null, `${entry.name} (${entry.kind})`));
      }
      if (entry.kind === "file") li.append(el("span", "muted", ` ${size(entry.size)}`));
      return li;
    });
    if (!items.length) items.push(el("li", "muted", "(empty)"));
    $("files-list").replaceChildren(...items);
  }

  crumbs() {
    const nav = $("files-crumbs");
    const names = this.folder ? this.folder.split("/") : [];
    const link = (label, path) => {
      const b = el("button", "link", label);
      b.type = "button";
      b.dataset.path = path;
      b.addEventListener("click", () => this.enter(path));
      return b;
    };
    const parts = [link("workspace", "")];
    names.forEach((name, i) => parts.push("/", link(name, names.slice(0, i + 1).join("/"))));
    nav.replaceChildren(...parts);
  }

  async enter(folder) {
    this.folder = folder;
    this.shown = null;
    $("files-view").hidden = true;
    await this.refresh();
  }

  /** Shows a file's text (its first MiB), or says it is binary. */
  async open(path) {
    this.shown = path;
    const res = await api.raw("GET", sessionPath(this.id, `/files/${encodePath(path)}`), {
      range: `bytes=0-${SHOWN_BYTES - 1}`,
    });
    if (res.status === 404) {
      this.shown = null;
      $("files-view").hidden = true;
      return;
    }
    // An empty file has no first byte to give: 416.
    if (!res.ok && res.status !== 416) throw new Error(`${path}: HTTP ${res.status}`);
    const bytes = res.ok ? new Uint8Array(await res.arrayBuffer()) : new Uint8Array();
    if (!this.current() || this.shown !== path) return;
    $("files-path").textContent = path;
    // `Content-Range: bytes 0-N/SIZE`: the file is larger than what was read when SIZE is.
    const whole = Number(res.headers.get("content-range")?.split("/")[1] ?? bytes.length);
    const cut = whole > bytes.length;
    let text;
    try {
      if (bytes.includes(0)) throw new Error("binary");
      // A cut may split a character: decode what is whole.
      text = new TextDecoder("utf-8", { fatal: !cut }).decode(bytes);
      if (cut) text += `\n… (the first ${size(bytes.length)} of ${size(whole)})`;
    } catch {
      text = `(binary, ${size(whole)})`;
    }
    $("files-text").textContent = text;
    $("files-view").hidden = false;
  }

  /** The file shown, saved by the browser. */
  async download() {
    const path = this.shown;
    if (!path) return;
    try {
      const res = await api.raw("GET", sessionPath(this.id, `/files/${encodePath(path)}`));
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      const url = URL.createObjectURL(await res.blob());
      const a = el("a");
      a.href = url;
      a.download = path.split("/").pop();
      a.click();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (e) {
      $("files-error").textContent = `download: ${e.message}`;
    }
  }

  async upload(files) {
    if (!files.length) return;
    const form = new FormData();
    for (const f of files) form.append("file", f, join(this.folder, f.name));
    try {
      await api.call("POST", sessionPath(this.id, "/files"), form);
      $("files-status").textContent = `uploaded ${files.map((f) => f.name).join(", ")}`;
    } catch (e) {
      $("files-error").textContent = `upload: ${e.message}`;
      return;
    }
    if (this.tab !== "tree") return this.show("tree");
    await this.refresh();
  }

  /** The changes against the base, or (`last`) what the newest turn's checkpoint changed. */
  async diff(last) {
    let query = "";
    if (last) {
      const listed = await api.get(sessionPath(this.id, "/checkpoints"));
      const turn = listed.checkpoints.find((c) => c.reason === "turn");
      if (!turn) {
        if (this.current()) $("files-diff").replaceChildren(el("p", "muted", "No turn has changed a file yet."));
        return;
      }
      query = `?checkpoint=${encodeURIComponent(turn.id)}`;
    }
    const d = await api.get(sessionPath(this.id, `/diff${query}`));
    if (!this.current()) return;
    const nodes = d.files.map((f) => {
      const box = el("section", "change");
      box.dataset.path = f.path;
      box.dataset.status = f.status;
      const head = el("h4", "mono");
      head.append(f.oldPath ? `${f.oldPath} → ${f.path}` : f.path, " ");
      head.append(el("span", "badge", f.status));
      head.append(el("span", "add", ` +${f.additions}`), el("span", "del", ` −${f.deletions}`));
      box.append(head);
      if (f.binary) {
        box.append(el("p", "muted", "binary"));
      } else {
        const pre = el("pre", "diff");
        for (const line of f.patch.split("\n")) {
          const cls = line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : line.startsWith("@@") ? "hunk" : "";
          pre.append(el("span", cls, `${line}\n`));
        }
        box.append(pre);
      }
      return box;
    });
    if (!nodes.length) nodes.push(el("p", "muted", last ? "That turn changed nothing." : "Nothing changed."));
    $("files-diff").replaceChildren(...nodes);
  }

  async checkpoints() {
    const listed = await api.get(sessionPath(this.id, "/checkpoints"));
    if (!this.current()) return;
    const select = $("files-revert-to");
    const keep = select.value;
    const options = listed.checkpoints.map((c) => {
      const when = new Date(c.createdAt).toLocaleTimeString();
      const o = el("option", null, `${when} · ${c.reason} · ${c.id.slice(0, 8)}`);
      o.value = c.id;
      return o;
    });
    const base = el("option", null, `the base · ${listed.base.slice(0, 8)}`);
    base.value = "base";
    options.push(base);
    select.replaceChildren(...options);
    if ([...select.options].some((o) => o.value === keep)) select.value = keep;
  }

  async revert() {
    const to = $("files-revert-to").value;
    if (!to) return;
    const label = $("files-revert-to").selectedOptions[0]?.textContent || to;
    const ok = await this.ask(`Make the workspace's files as they were at ${label}? The revert is a checkpoint, so it can be undone.`, {
      okLabel: "Revert",
      danger: true,
    });
    if (!ok) return;
    try {
      const c = await api.post(sessionPath(this.id, "/revert"), { to });
      $("files-status").textContent = `reverted: now at ${c.id.slice(0, 8)}`;
    } catch (e) {
      $("files-error").textContent = `revert: ${e.message}`;
      return;
    }
    await this.refresh();
  }
}
