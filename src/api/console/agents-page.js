// The Agents page (#/agents): the agents this replica runs, with how each is signed in — a
// button per auth method it offers (ACP `authenticate`, or its terminal login), and Log out
// when it advertises `logout` — and, for those installed from the ACP registry, where their
// install stands and Remove; then the registry's agents, each with Install. A terminal login
// runs in a panel of the page over the WebSocket `GET /agents/{name}/login` (the console's key
// as `access_token`, as the event streams carry it): the terminal's output shown as text, its
// escape sequences dropped; a line typed in the panel's field goes to it as keys.
//
// Names, descriptions and the terminal's output only ever reach the page as text.

import { api } from "./api.js";
import { $, el } from "./dom.js";

/** How often the page looks again while an install is under way. */
const POLL_MS = 1000;
/** How long after an install was asked for the page waits for its agent to be ready. */
const AWAIT_MS = 120_000;

/** Terminal output as plain text: CSI and OSC sequences and other escapes dropped, `\r\n`
 * kept as one line break, a lone `\r` dropped. */
export function plainText(s) {
  return s
    .replace(/\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)/g, "")
    .replace(/\x1b\[[0-?]*[ -/]*[@-~]/g, "")
    .replace(/\x1b[@-_]/g, "")
    .replace(/\r\n/g, "\n")
    .replace(/\r/g, "");
}

export class AgentsPage {
  /** `ask(text, options)`: the console's confirmation dialog. */
  constructor({ ask }) {
    this.ask = ask;
    this.generation = 0;
    this.timer = null;
    this.installing = false;
    this.awaited = null;
    this.visible = false;
    this.socket = null;
    $("terminal-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const keys = $("terminal-input").value;
      $("terminal-input").value = "";
      if (this.socket?.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify({ keys: `${keys}\r` }));
    });
    $("terminal-close").addEventListener("click", () => this.closeTerminal());
  }

  async show() {
    this.visible = true;
    $("agents-error").textContent = "";
    await Promise.all([this.loadAgents(), this.loadRegistry()]);
  }

  /** Leaving the page: no more polling; a running login goes on in its panel until closed. */
  hide() {
    this.visible = false;
    this.generation++;
    clearTimeout(this.timer);
    this.timer = null;
  }

  async loadAgents() {
    const generation = ++this.generation;
    let agents;
    try {
      agents = await api.get("/agents");
    } catch (e) {
      if (generation !== this.generation) return;
      $("agents-error").textContent = e.message;
      // A failed look while an install runs is tried again.
      if (this.installing || this.awaited) this.timer = setTimeout(() => this.loadAgents(), POLL_MS);
      return;
    }
    if (generation !== this.generation || !this.visible) return;
    $("agents-error").textContent = "";
    $("agents-list").replaceChildren(...agents.map((a) => this.agentItem(a)));
    clearTimeout(this.timer);
    // Looked at again while an install runs, and for a while after one was asked for until
    // its agent is listed and ready (its members start after the install).
    const installing = agents.some((a) => a.installed?.phase === "installing");
    const awaited = this.awaited && agents.find((a) => a.name === this.awaited.name);
    const settled = awaited && (awaited.ready || awaited.installed?.phase === "failed");
    const waiting = this.awaited && !settled && Date.now() < this.awaited.until;
    if (installing || waiting) this.timer = setTimeout(() => this.loadAgents(), POLL_MS);
    else if (this.installing || this.awaited) this.loadRegistry();
    if (!installing && !waiting) this.awaited = null;
    this.installing = installing;
  }

  agentItem(a) {
    const li = el("li", "agent");
    li.dataset.name = a.name;
    const info = a.agentInfo ? ` — ${a.agentInfo.name ?? ""} ${a.agentInfo.version ?? ""}`.trimEnd() : "";
    li.append(el("strong", "", a.name), el("span", "muted", info));
    const state = a.installed?.phase === "installing" ? "installing" : a.ready ? "ready" : "not ready";
    const badge = el("span", `badge ${state === "ready" ? "" : "warn"}`, state);
    badge.dataset.role = "state";
    li.append(" ", badge);
    if (a.installed?.phase === "failed") li.append(el("p", "error", a.installed.error || "the install failed"));
    const last = a.installed?.progress?.at(-1);
    if (a.installed?.phase === "installing" && last) li.append(el("p", "muted mono", last));
    if (!a.ready && a.unreadyReason) li.append(el("p", "muted", a.unreadyReason));
    const actions = el("div", "row");
    for (const m of a.authMethods || []) {
      const b = el("button", "secondary", m.name || m.id);
      b.type = "button";
      b.title = m.type === "terminal" ? "Runs the agent's login in a terminal on this page" : `Signs ${a.name} in with ${m.id}`;
      b.dataset.method = m.id;
      b.addEventListener("click", () => (m.type === "terminal" ? this.openTerminal(a.name, m.id) : this.signIn(a.name, m.id)));
      actions.append(b);
    }
    if (a.capabilities?.logout) actions.append(this.button("Log out", () => this.logOut(a.name)));
    if (a.installed) actions.append(this.button("Remove", () => this.remove(a.name), "danger"));
    if (actions.childElementCount) li.append(actions);
    const said = el("p", "muted");
    said.dataset.role = "said";
    said.setAttribute("role", "status");
    li.append(said);
    return li;
  }

  button(label, onClick, className = "secondary") {
    const b = el("button", className, label);
    b.type = "button";
    b.addEventListener("click", onClick);
    return b;
  }

  /** Shows `text` under the agent `name` (an error when `error`). */
  say(name, text, error = false) {
    const item = [...$("agents-list").children].find((li) => li.dataset.name === name);
    const said = item?.querySelector('[data-role="said"]');
    if (!said) return void ($("agents-error").textContent = text);
    said.className = error ? "error" : "muted";
    said.textContent = text;
  }

  async signIn(name, methodId) {
    try {
      await api.post(`/agents/${encodeURIComponent(name)}/authenticate`, { methodId });
      await this.loadAgents();
      this.say(name, `Signed in with ${methodId}.`);
    } catch (e) {
      this.say(name, e.message, true);
    }
  }

  async logOut(name) {
    try {
      await api.post(`/agents/${encodeURIComponent(name)}/logout`);
      await this.loadAgents();
      this.say(name, "Logged out.");
    } catch (e) {
      this.say(name, e.message, true);
    }
  }

  async remove(name) {
    const ok = await this.ask(`Remove the agent “${name}” from every replica?`, { okLabel: "Remove", danger: true });
    if (!ok) return;
    try {
      await api.call("DELETE", `/agents/${encodeURIComponent(name)}`);
      await this.loadAgents();
      await this.loadRegistry();
    } catch (e) {
      this.say(name, e.message, true);
    }
  }

  async loadRegistry() {
    let registry;
    try {
      registry = await api.get("/registry");
    } catch (e) {
      $("registry-status").textContent = `The registry cannot be read: ${e.message}`;
      $("registry-list").replaceChildren();
      return;
    }
    $("registry-status").textContent = `${registry.agents.length} agents in ${registry.source} (${registry.platform})`;
    $("registry-list").replaceChildren(...registry.agents.map((r) => this.registryItem(r)));
  }

  registryItem(r) {
    const li = el("li", "agent");
    li.dataset.id = r.id;
    li.append(el("strong", "", r.name || r.id), el("span", "muted", ` ${r.id} ${r.version}`));
    if (r.description) li.append(el("p", "", r.description));
    const kinds = r.kinds.length ? r.kinds.join(", ") : "nothing that runs on this machine";
    li.append(el("p", "muted", `Runs as: ${kinds}${r.installed.length ? ` · installed as ${r.installed.join(", ")}` : ""}`));
    const said = el("p", "muted");
    said.setAttribute("role", "status");
    if (r.kinds.length && !r.installed.length) {
      li.append(
        this.button("Install", async () => {
          try {
            await api.post("/agents", { registry: r.id });
            said.textContent = "Installing…";
            this.awaited = { name: r.id, until: Date.now() + AWAIT_MS };
            await this.loadAgents();
            await this.loadRegistry();
          } catch (e) {
            said.className = "error";
            said.textContent = e.message;
          }
        }),
      );
    }
    li.append(said);
    return li;
  }

  openTerminal(name, methodId) {
    this.closeTerminal();
    $("terminal-box").hidden = false;
    $("terminal-title").textContent = `Terminal login: ${name} (${methodId})`;
    $("terminal-screen").textContent = "";
    $("terminal-status").textContent = "Starting…";
    const url = new URL(`/agents/${encodeURIComponent(name)}/login`, location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    url.searchParams.set("methodId", methodId);
    const key = api.key();
    if (key) url.searchParams.set("access_token", key);
    const socket = new WebSocket(url);
    socket.binaryType = "arraybuffer";
    const decoder = new TextDecoder();
    this.socket = socket;
    socket.addEventListener("open", () => {
      $("terminal-status").textContent = "Running: type into the field below, then Send.";
      $("terminal-input").focus();
    });
    socket.addEventListener("message", (e) => {
      if (typeof e.data === "string") {
        const end = JSON.parse(e.data);
        $("terminal-status").textContent = `The login exited with code ${end.exit ?? "none"}.`;
        $("terminal-box").dataset.exit = String(end.exit);
        this.loadAgents();
        return;
      }
      $("terminal-screen").textContent += plainText(decoder.decode(e.data, { stream: true }));
    });
    socket.addEventListener("close", () => {
      if (this.socket === socket && !$("terminal-box").dataset.exit) {
        $("terminal-status").textContent = "The login's connection closed.";
      }
    });
  }

  closeTerminal() {
    this.socket?.close();
    this.socket = null;
    delete $("terminal-box").dataset.exit;
    $("terminal-box").hidden = true;
  }
}
