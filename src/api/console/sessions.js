// The session list: pages of GET /sessions (filters: cwd, agent, archived), kept up to date by
// the lifecycle stream GET /events (created, updated, status, deleted), which also brings the
// watchers of sessions and the tenant's budget alerts (`usage_budget`) to the console's hooks.

import { api } from "./api.js";
import { $, el } from "./dom.js";

export class SessionList {
  constructor(hooks) {
    this.hooks = hooks;
    this.items = new Map();
    this.filter = { cwd: "", agent: "", archived: false };
    this.cursor = null;
    this.selected = null;
    this.source = null;
  }

  query(cursor) {
    const q = new URLSearchParams({ limit: "30" });
    if (this.filter.cwd) q.set("cwd", this.filter.cwd);
    if (this.filter.agent) q.set("agent", this.filter.agent);
    if (this.filter.archived) q.set("archived", "true");
    if (cursor) q.set("cursor", cursor);
    return `/sessions?${q}`;
  }

  async reload() {
    const page = await api.get(this.query());
    this.items.clear();
    $("sessions").replaceChildren();
    this.add(page);
  }

  async more() {
    if (!this.cursor) return;
    this.add(await api.get(this.query(this.cursor)));
  }

  add(page) {
    for (const s of page.sessions) this.upsert(s, false);
    this.cursor = page.nextCursor || null;
    $("more").hidden = !this.cursor;
    $("list-error").textContent = "";
  }

  matches(s) {
    return (
      (!this.filter.cwd || s.cwd === this.filter.cwd) &&
      (!this.filter.agent || s.agent === this.filter.agent) &&
      !!s.archived === this.filter.archived
    );
  }

  upsert(s, toTop) {
    const old = this.items.get(s.sessionId);
    if (!this.matches(s)) {
      if (old) {
        old.li.remove();
        this.items.delete(s.sessionId);
      }
      return;
    }
    const item = old || { li: el("li") };
    item.session = { ...(old?.session || {}), ...s };
    this.items.set(s.sessionId, item);
    this.render(item);
    if (!old) $("sessions").append(item.li);
    if (toTop) $("sessions").prepend(item.li);
  }

  render(item) {
    const s = item.session;
    const a = el("a");
    a.href = `#/s/${encodeURIComponent(s.sessionId)}`;
    a.dataset.sessionId = s.sessionId;
    if (this.selected === s.sessionId) a.setAttribute("aria-current", "page");
    a.append(el("span", "title", s.title || "(untitled)"));
    const sub = el("span", "sub");
    sub.append(el("span", `badge ${s.status}`, s.status));
    sub.append(" ");
    if (s.activity) sub.append(el("span", `badge ${s.activity}`, s.activity), " ");
    sub.append(`${s.agent} · ${s.cwd}`);
    a.append(sub);
    item.li.replaceChildren(a);
  }

  select(id) {
    this.selected = id;
    for (const item of this.items.values()) this.render(item);
  }

  /** The open session's activity, as its own stream orders it. */
  activity(id, activity) {
    const item = this.items.get(id);
    if (!item || item.session.activity === activity) return;
    item.session = { ...item.session, activity };
    this.render(item);
  }

  remove(id) {
    this.items.get(id)?.li.remove();
    this.items.delete(id);
  }

  /** Follows GET /events; reloads the list whenever the stream (re)opens, so nothing is missed. */
  follow() {
    this.source?.close();
    const source = api.stream("/events");
    this.source = source;
    source.onopen = () => this.reload().catch((e) => ($("list-error").textContent = e.message));
    const update = (ev) => {
      const d = JSON.parse(ev.data);
      if (d.session) {
        this.upsert(d.session, true);
        this.hooks.updated(d.session);
      }
    };
    source.addEventListener("session_created", update);
    source.addEventListener("session_updated", update);
    source.addEventListener("session_status", (ev) => {
      const d = JSON.parse(ev.data);
      const item = this.items.get(d.sessionId);
      const patch = { sessionId: d.sessionId, status: d.status };
      if (d.status !== "live") patch.activity = null;
      if (item) {
        item.session = { ...item.session, ...patch };
        this.render(item);
      }
      this.hooks.updated(patch);
    });
    source.addEventListener("watchers_changed", (ev) => {
      const d = JSON.parse(ev.data);
      this.hooks.watchers?.(d.sessionId, d.watchers);
    });
    source.addEventListener("usage_budget", (ev) => this.hooks.budget?.(JSON.parse(ev.data)));
    source.addEventListener("session_deleted", (ev) => {
      const d = JSON.parse(ev.data);
      this.remove(d.sessionId);
      this.hooks.deleted(d.sessionId);
    });
    source.onerror = () => {
      if (source.readyState === EventSource.CLOSED) {
        this.hooks.connection("reconnecting");
        setTimeout(() => this.source === source && this.follow(), 1500);
      }
    };
  }
}
