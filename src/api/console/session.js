// One session's view: the transcript from its log (GET /history pages), then live from its
// SSE stream with ?after=<last seq>. Every event is applied once, in order, by its sequence
// number (`id`): anything at or below the last applied one is dropped, so a reconnect, a reload
// or a gateway restart continues the transcript with nothing missing or doubled. On any stream
// error the view reads the log from where it stopped and opens the stream again.
//
// Agent text only ever reaches the page through textContent / text nodes (markdown.js).

import { api, sessionPath } from "./api.js";
import { renderMarkdown } from "./markdown.js";
import { elicitationForm } from "./elicitation.js";
import { FilesPanel } from "./files.js";
import { $, el } from "./dom.js";
import { People, who } from "./people.js";
import { UsagePanel } from "./usage.js";

/** The names of the session stream's events (EventSource only delivers named ones asked for). */
const EVENTS = [
  "user_message_chunk", "agent_message_chunk", "agent_thought_chunk", "tool_call",
  "tool_call_update", "plan", "available_commands_update", "current_mode_update",
  "prompt_suggestions_update",
  "config_option_update", "session_info_update", "usage_update", "turn_started", "turn_ended",
  "permission_requested", "permission_resolved", "elicitation_requested",
  "elicitation_resolved", "elicitation_completed", "session_deleted", "agent_exited",
  "state_changed", "forked", "workspace_changed", "prompt_queued", "prompt_withdrawn", "gap",
  "message",
];

function textOf(blocks) {
  return (blocks || []).map((b) => (b?.type === "text" ? b.text : `[${b?.type}]`)).join("");
}

export function lastSeen(id) {
  return Number(sessionStorage.getItem(`acp-console.last.${id}`) || 0);
}

export class SessionView {
  constructor(id, hooks) {
    this.id = id;
    this.hooks = hooks;
    this.lastSeq = 0;
    this.source = null;
    this.closed = false;
    this.retry = 500;
    this.state = {};
    this.session = null;
    this.activity = null;
    this.current = null;
    this.tools = new Map();
    this.requests = new Map();
    this.planNode = null;
    this.dirty = new Set();
    this.transcript = $("transcript");
    // Follow the end of the transcript unless the reader scrolled up.
    this.atEnd = true;
    this.transcript.onscroll = () => {
      const t = this.transcript;
      this.atEnd = t.scrollHeight - t.scrollTop - t.clientHeight < 80;
    };
  }

  async open() {
    this.transcript.replaceChildren();
    this.transcript.dataset.lastSeq = "0";
    $("requests").replaceChildren();
    $("session-error").textContent = "";
    const s = await api.get(sessionPath(this.id));
    // Another session was opened meanwhile: this one's view is not shown.
    if (this.closed) return;
    this.session = s;
    this.state = s.state || {};
    this.activity = s.activity || null;
    this.renderHead();
    this.renderSuggested();
    this.files = new FilesPanel(this.id, s.workspace, { ask: this.hooks.ask });
    this.people = new People(this.id);
    this.usage = new UsagePanel(this.id);
    await this.catchUp();
    this.people.refreshQueue();
    this.usage.start();
    this.connect();
  }

  close() {
    this.closed = true;
    this.source?.close();
    this.files?.close();
    this.people?.close();
    this.usage?.close();
  }

  /** Applies the log's events after the last applied one, page by page. */
  async catchUp() {
    let after = this.lastSeq;
    for (;;) {
      const page = await api.get(sessionPath(this.id, `/history?after=${after}&limit=500`));
      for (const e of page.events) {
        // The log numbers events without holes, so a jump in a page of it is retention's.
        if (e.seq > this.lastSeq + 1 && e.event !== "gap") {
          this.current = null;
          this.note(`events ${this.lastSeq + 1}–${e.seq - 1} are no longer kept (gap)`, "gap");
        }
        this.apply(e.seq, e.event, e.data);
      }
      if (page.nextAfter == null || this.closed) break;
      after = page.nextAfter;
    }
    this.flush(true);
  }

  connect() {
    if (this.closed) return;
    const source = api.stream(sessionPath(this.id, "/events"), { after: String(this.lastSeq) });
    this.source = source;
    source.onopen = () => {
      this.retry = 500;
      this.hooks.connection("online");
      // Open, this stream is counted among the watchers: they are shown as the gateway has
      // them now, since a `watchers_changed` sent before the lifecycle stream connected is
      // not replayed to it.
      this.people?.showWatchers();
    };
    for (const name of EVENTS) {
      source.addEventListener(name, (ev) => {
        const seq = Number(ev.lastEventId);
        if (!(seq > this.lastSeq)) return;
        this.apply(seq, name, JSON.parse(ev.data));
        this.scheduleFlush();
      });
    }
    source.onerror = () => {
      // Reconnect ourselves (EventSource gives up on a non-200 answer, e.g. while a
      // restarted gateway starts): the log first, then the stream after it.
      source.close();
      if (this.closed || this.source !== source) return;
      this.hooks.connection("reconnecting");
      setTimeout(() => this.reconnect(source), this.retry);
    };
  }

  /** Reopens the stream (with the API's current key), from the last event applied. */
  renew() {
    const source = this.source;
    source?.close();
    this.reconnect(source);
  }

  async reconnect(source) {
    if (this.closed || this.source !== source) return;
    try {
      await this.catchUp();
      const s = await api.get(sessionPath(this.id));
      this.session = s;
      this.activity = s.activity || this.activity;
      this.renderHead();
      this.connect();
    } catch {
      this.retry = Math.min(this.retry * 2, 5000);
      setTimeout(() => this.reconnect(source), this.retry);
    }
  }

  scheduleFlush() {
    if (this.flushTimer) return;
    this.flushTimer = setTimeout(() => {
      this.flushTimer = null;
      this.flush();
    }, 30);
  }

  /** Renders the messages whose text changed since the last flush. */
  flush(toEnd = false) {
    const stick = toEnd || this.atEnd;
    for (const m of this.dirty) {
      m.body.replaceChildren(m.markdown ? renderMarkdown(m.text) : document.createTextNode(m.text));
    }
    this.dirty.clear();
    this.transcript.dataset.lastSeq = String(this.lastSeq);
    if (stick) this.transcript.scrollTop = this.transcript.scrollHeight;
  }

  // ---- events ----------------------------------------------------------------------------

  apply(seq, name, data) {
    if (!(seq > this.lastSeq)) return;
    this.lastSeq = seq;
    sessionStorage.setItem(`acp-console.last.${this.id}`, String(seq));
    const u = data?.update;
    switch (name) {
      case "turn_started":
        this.current = null;
        this.message("user", textOf(data.prompt), seq, who(data.author, "You"));
        this.current = null;
        this.setActivity("running");
        if (data.queueId) this.people?.refreshQueue();
        break;
      case "user_message_chunk":
        this.chunk("user", u.content, seq);
        break;
      case "agent_message_chunk":
        this.chunk("agent", u.content, seq);
        break;
      case "agent_thought_chunk":
        this.chunk("thought", u.content, seq);
        break;
      case "tool_call":
      case "tool_call_update":
        this.tool(u);
        break;
      case "plan":
        this.state.plan = u.entries;
        this.plan(u.entries);
        break;
      case "available_commands_update":
        this.state.availableCommands = u.availableCommands;
        break;
      case "prompt_suggestions_update":
        this.state.promptSuggestions = u.suggestions;
        this.renderSuggested();
        break;
      case "current_mode_update":
        this.state.modes = { ...(this.state.modes || {}), currentModeId: u.currentModeId };
        this.renderPickers();
        break;
      case "config_option_update":
        this.state.configOptions = u.configOptions;
        this.renderPickers();
        break;
      case "session_info_update":
        if (u.title !== undefined && this.session) {
          this.session.title = u.title;
          this.renderHead();
        }
        break;
      case "usage_update":
        this.state.usage = { ...(this.state.usage || {}), latest: u };
        this.renderUsage();
        this.usage?.noted(u);
        break;
      case "state_changed":
        if (data.modes) this.state.modes = { ...(this.state.modes || {}), ...data.modes };
        if (data.models) this.state.models = { ...(this.state.models || {}), ...data.models };
        if (data.configOptions) this.state.configOptions = data.configOptions;
        this.renderPickers();
        break;
      case "turn_ended":
        this.current = null;
        this.setActivity("idle");
        if (data.usage) this.state.usage = { ...(this.state.usage || {}), lastPrompt: data.usage };
        this.renderUsage();
        this.usage?.turnEnded(data);
        if (data.error) this.note(`turn failed: ${data.error.detail || data.error.title}`, "error");
        else if (data.stopReason && data.stopReason !== "end_turn") this.note(`turn ended: ${data.stopReason}`);
        break;
      case "permission_requested":
        this.current = null;
        this.setActivity("awaiting_permission");
        this.permission(data);
        break;
      case "permission_resolved":
        this.resolved(data, data.outcome?.optionId || data.outcome?.outcome);
        if (this.activity === "awaiting_permission") this.setActivity("running");
        break;
      case "elicitation_requested":
        this.current = null;
        this.setActivity("awaiting_input");
        this.elicitation(data);
        break;
      case "elicitation_resolved":
        this.resolved(data, data.action);
        if (this.activity === "awaiting_input") this.setActivity("running");
        break;
      case "elicitation_completed":
        this.note(`elicitation ${data.elicitationId} completed`);
        break;
      case "gap":
        this.current = null;
        this.note(`events ${data.from}–${data.to} are no longer kept (gap)`, "gap");
        break;
      case "session_deleted":
        this.note("this session was deleted", "error");
        this.close();
        this.hooks.deleted(this.id);
        break;
      case "agent_exited":
        this.current = null;
        this.note("the agent process exited");
        break;
      case "workspace_changed":
        this.note(`files changed: ${(data.paths || []).join(", ")}`);
        this.files?.changed();
        break;
      case "prompt_queued":
        this.note(`${who(data.author, "someone")} queued a prompt${data.interrupt ? " to run next" : ""}`);
        this.people?.refreshQueue();
        break;
      case "prompt_withdrawn":
        this.note(data.by ? `${who(data.by)} withdrew a queued prompt` : `a queued prompt was dropped: ${data.reason}`);
        this.people?.refreshQueue();
        break;
      case "forked":
        this.note(`forked from ${data.parentSessionId} at event ${data.parentSeq}`);
        break;
      default:
        break;
    }
  }

  message(kind, text, seq, author = "You") {
    const node = el(kind === "thought" ? "details" : "div", kind === "thought" ? "thought" : `msg ${kind}`);
    node.dataset.seq = String(seq);
    let body;
    if (kind === "thought") {
      node.append(el("summary", null, "Thought"));
      body = el("div");
    } else {
      node.append(el("span", "who", kind === "user" ? author : "Agent"));
      body = el("div", "body");
    }
    node.append(body);
    this.transcript.append(node);
    const m = { kind, node, body, text, markdown: kind !== "thought" };
    this.current = m;
    this.dirty.add(m);
    return m;
  }

  chunk(kind, content, seq) {
    const text = content?.type === "text" ? content.text : `[${content?.type}]`;
    if (this.current && this.current.kind === kind) {
      this.current.text += text;
      this.dirty.add(this.current);
    } else {
      this.message(kind, text, seq);
    }
  }

  note(text, cls = "") {
    this.transcript.append(el("p", `note ${cls}`, text));
  }

  tool(u) {
    let t = this.tools.get(u.toolCallId);
    if (!t) {
      t = { node: el("div", "tool"), fields: {} };
      t.node.dataset.toolCallId = u.toolCallId;
      this.tools.set(u.toolCallId, t);
      this.transcript.append(t.node);
      this.current = null;
    }
    for (const [k, v] of Object.entries(u)) if (v !== undefined && v !== null) t.fields[k] = v;
    const f = t.fields;
    const head = el("div");
    head.append(el("strong", null, f.title || f.toolCallId));
    if (f.kind) head.append(el("span", "badge", f.kind));
    if (f.status) head.append(el("span", `badge status ${f.status}`, f.status));
    const parts = [head];
    for (const loc of f.locations || []) {
      parts.push(el("div", "mono muted", loc.line ? `${loc.path}:${loc.line}` : loc.path));
    }
    for (const c of f.content || []) {
      if (c.type === "diff") {
        parts.push(el("div", "mono", c.path));
        const pre = el("pre", "diff");
        for (const l of (c.oldText || "").split("\n")) if (c.oldText != null) pre.append(el("span", "del", `- ${l}\n`));
        for (const l of (c.newText || "").split("\n")) pre.append(el("span", "add", `+ ${l}\n`));
        parts.push(pre);
      } else if (c.type === "content" && c.content?.type === "text") {
        const d = el("div");
        d.append(renderMarkdown(c.content.text));
        parts.push(d);
      } else if (c.type === "terminal") {
        parts.push(el("div", "mono muted", `terminal ${c.terminalId}`));
      }
    }
    t.node.replaceChildren(...parts);
  }

  plan(entries) {
    this.planNode?.remove();
    const box = el("div", "tool");
    box.append(el("strong", null, "Plan"));
    const ul = el("ul", "plan");
    for (const e of entries || []) {
      const li = el("li", e.status, e.content);
      li.setAttribute("aria-label", `${e.status}: ${e.content}`);
      ul.append(li);
    }
    box.append(ul);
    this.planNode = box;
    this.transcript.append(box);
    this.current = null;
  }

  // ---- requests that wait for the user ----------------------------------------------------

  deadline(box, data) {
    if (data.deadline) box.append(el("p", "muted", `Answer before ${new Date(data.deadline).toLocaleTimeString()}`));
  }

  permission(data) {
    const req = data.request || {};
    const box = el("section", "request permission");
    box.setAttribute("aria-label", "Permission request");
    box.append(el("h3", null, "Permission requested"));
    box.append(el("p", null, req.toolCall?.title || req.toolCall?.toolCallId || "a tool call"));
    this.deadline(box, data);
    const row = el("div", "row");
    for (const o of req.options || []) {
      const b = el("button", o.kind?.startsWith("reject") ? "danger" : "", o.name || o.optionId);
      b.type = "button";
      b.dataset.optionId = o.optionId;
      b.addEventListener("click", () => this.answer("permissions", data.requestId, { optionId: o.optionId }, box));
      row.append(b);
    }
    box.append(row);
    this.addRequest(data.requestId, box);
  }

  elicitation(data) {
    const box = elicitationForm(data, (body) => this.answer("elicitations", data.requestId, body, box));
    this.deadline(box, data);
    this.addRequest(data.requestId, box);
  }

  addRequest(requestId, box) {
    box.dataset.requestId = requestId;
    this.requests.get(requestId)?.remove();
    this.requests.set(requestId, box);
    $("requests").append(box);
  }

  async answer(kind, requestId, body, box) {
    for (const b of box.querySelectorAll("button")) b.disabled = true;
    try {
      await api.post(sessionPath(this.id, `/${kind}/${encodeURIComponent(requestId)}`), body);
    } catch (e) {
      box.append(el("p", "error", e.message));
      for (const b of box.querySelectorAll("button")) b.disabled = false;
    }
  }

  resolved(data, how) {
    this.requests.get(data.requestId)?.remove();
    this.requests.delete(data.requestId);
    this.current = null;
    const by = data.answeredBy ? ` by ${who(data.answeredBy)}` : "";
    this.note(`${data.requestId}: ${how} (${data.reason}${by})`);
  }

  // ---- head: title, status, activity, usage, pickers --------------------------------------

  setActivity(a) {
    this.activity = a;
    this.renderActivity();
    this.hooks.activity?.(this.id, a);
  }

  renderActivity() {
    const a = $("session-activity");
    const activity = this.activity || "not running";
    a.textContent = activity;
    a.className = `badge ${this.activity || ""}`;
    const running = this.activity && this.activity !== "idle";
    $("cancel").hidden = !running;
    $("interrupt").hidden = !running;
    // While a turn runs, a prompt waits in the queue for its turn.
    $("send").textContent = running ? "Queue" : "Send";
    $("send").disabled = false;
  }

  renderHead() {
    const s = this.session;
    if (!s) return;
    $("session-title").textContent = s.title || "(untitled)";
    const st = $("session-status");
    st.textContent = s.status;
    st.className = `badge ${s.status}`;
    $("session-agent").textContent = `agent ${s.agent}`;
    $("session-cwd").textContent = s.cwd;
    $("archive").textContent = s.archived ? "Unarchive" : "Archive";
    this.renderActivity();
    this.renderUsage();
    this.renderPickers();
  }

  /** Called with a session from the list's live updates. */
  update(s) {
    if (!this.session) return;
    // The activity comes from this session's own stream, which orders it with the turn's
    // events; the lifecycle stream's copy may be older.
    const { activity: _ignored, state: _state, ...rest } = s;
    this.session = { ...this.session, ...rest };
    this.renderHead();
  }

  renderUsage() {
    const u = this.state.usage || {};
    const parts = [];
    if (u.latest?.used != null) parts.push(`context ${u.latest.used}/${u.latest.size ?? "?"}`);
    if (u.lastPrompt?.totalTokens != null) parts.push(`last turn ${u.lastPrompt.totalTokens} tokens`);
    $("session-usage").textContent = parts.join(" · ");
  }

  /** The choices of a category: the config option of it when offered, else modes / models. */
  choices(category) {
    const opt = (this.state.configOptions || []).find((o) => o.category === category && o.type === "select");
    if (opt) {
      const flat = (opt.options || []).flatMap((o) => (o.options ? o.options : [o]));
      return { current: opt.currentValue, list: flat.map((o) => ({ id: o.value, name: o.name })) };
    }
    if (category === "mode" && this.state.modes) {
      const m = this.state.modes;
      return { current: m.currentModeId, list: (m.availableModes || []).map((x) => ({ id: x.id, name: x.name })) };
    }
    if (category === "model" && this.state.models) {
      const m = this.state.models;
      return { current: m.currentModelId, list: (m.availableModels || []).map((x) => ({ id: x.modelId, name: x.name })) };
    }
    return null;
  }

  renderPickers() {
    for (const category of ["mode", "model"]) {
      const select = $(`${category}-select`);
      const label = $(`${category}-label`);
      const c = this.choices(category);
      select.hidden = label.hidden = !c || !c.list.length;
      if (!c) continue;
      select.replaceChildren(
        ...c.list.map((o) => {
          const op = el("option", null, o.name || o.id);
          op.value = o.id;
          return op;
        }),
      );
      select.value = c.current ?? "";
    }
  }

  async setChoice(category, value) {
    const body = category === "mode" ? { modeId: value } : { modelId: value };
    try {
      const r = await api.put(sessionPath(this.id, `/${category}`), body);
      if (r?.state) this.state = { ...this.state, ...r.state };
      $("session-error").textContent = "";
    } catch (e) {
      $("session-error").textContent = `${category}: ${e.message}`;
    }
    this.renderPickers();
  }

  commands() {
    return this.state.availableCommands || [];
  }

  /** The agent's prompt suggestions, as buttons that put their text in the prompt field. */
  renderSuggested() {
    const box = $("prompt-suggestions");
    const text = (s) => (s.prompt || []).filter((b) => b.type === "text").map((b) => b.text).join(" ").trim();
    const shown = (this.state.promptSuggestions || []).map(text).filter(Boolean);
    box.replaceChildren(
      ...shown.map((t) => {
        const b = el("button", "secondary chip", t);
        b.type = "button";
        b.addEventListener("click", () => {
          $("prompt").value = t;
          $("prompt").focus();
        });
        return b;
      }),
    );
    box.hidden = !shown.length;
  }
}
