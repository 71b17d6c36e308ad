// The Usage page (#/usage?from=&to=&groupBy=, so that a reload shows the same): what turns
// spent, summed by GET /usage between two UTC days by tenant, user, agent, model, session or
// day (several at once), as a table with a total row; the same rows as a CSV file (asked for
// with the console's key and `Accept: text/csv`, saved through a blob link, as the Files
// panel's Download); and the lifecycle stream's `usage_budget` alerts, listed here and counted
// beside the navigation's Usage link.
//
// Tenants, users, agents, models and session ids only ever reach the page as text.

import { api } from "./api.js";
import { $, el } from "./dom.js";
import { NONE, TOKENS, cell, count, figures, headings, money, plural } from "./usage.js";

/** What the rows can be grouped by, in the order the API's columns come. */
export const KEYS = [
  ["tenant", "Tenant"],
  ["user", "User"],
  ["agent", "Agent"],
  ["model", "Model"],
  ["session", "Session"],
  ["day", "Day (UTC)"],
];

/** The UTC day `back` days ago, as YYYY-MM-DD (the API reads a day as a UTC one). */
function utcDay(back = 0) {
  return new Date(Date.now() - back * 86_400_000).toISOString().slice(0, 10);
}

/** The sum of a figure over rows, `null` when no row has it. */
function sum(rows, key) {
  const known = rows.map((r) => r[key]).filter((v) => v != null);
  return known.length ? known.reduce((a, b) => a + b, 0) : null;
}

/** Rows' costs summed per currency. */
function costs(rows) {
  const by = new Map();
  for (const r of rows) for (const c of r.costs || []) by.set(c.currency, (by.get(c.currency) || 0) + c.amount);
  return [...by].map(([currency, amount]) => ({ currency, amount }));
}

export class UsagePage {
  constructor() {
    this.generation = 0;
    this.alerts = 0;
    $("usage-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const hash = `#/usage?${this.query()}`;
      if (location.hash === hash) this.load();
      else location.hash = hash;
    });
    $("usage-csv").addEventListener("click", () => this.download());
  }

  /** Fills the form from the address's query (by default the last 30 days, by tenant) and
   * shows its rows. */
  async show(params) {
    $("usage-from").value = params.get("from") ?? utcDay(29);
    $("usage-to").value = params.get("to") ?? utcDay();
    const keys = (params.get("groupBy") || "tenant").split(",");
    for (const [key] of KEYS) $(`usage-by-${key}`).checked = keys.includes(key);
    await this.load();
  }

  /** The form as `GET /usage`'s query. */
  query() {
    const q = new URLSearchParams();
    for (const name of ["from", "to"]) {
      const value = $(`usage-${name}`).value;
      if (value) q.set(name, value);
    }
    const keys = KEYS.map(([key]) => key).filter((key) => $(`usage-by-${key}`).checked);
    q.set("groupBy", keys.length ? keys.join(",") : "tenant");
    return q;
  }

  async load() {
    const generation = ++this.generation;
    $("usage-error").textContent = "";
    $("usage-status").textContent = "Loading…";
    let report;
    try {
      report = await api.get(`/usage?${this.query()}`);
    } catch (e) {
      if (generation !== this.generation) return;
      $("usage-status").textContent = "";
      $("usage-error").textContent = e.message;
      return;
    }
    if (generation !== this.generation) return;
    this.render(report);
  }

  render(report) {
    const keys = report.groupBy;
    const label = (key) => KEYS.find(([k]) => k === key)?.[1] ?? key;
    const table = $("usage-table");
    if (!report.rows.length) {
      table.replaceChildren();
      $("usage-status").textContent = "No turn reported usage between these days.";
      return;
    }
    const body = el("tbody");
    for (const row of report.rows) {
      const tr = el("tr");
      for (const key of keys) tr.append(this.keyCell(key, row[key]));
      tr.append(cell(count(row.turns), "turns", true), ...figures(row));
      body.append(tr);
    }
    const head = el("thead");
    head.append(headings([...keys.map(label), "Turns", ...TOKENS.map(([, l]) => l), "Cost"]));
    const foot = el("tfoot");
    const total = el("tr");
    const name = el("th", null, "Total");
    name.scope = "row";
    name.colSpan = keys.length;
    const totals = { turns: sum(report.rows, "turns"), costs: costs(report.rows) };
    for (const [key] of TOKENS) totals[key] = sum(report.rows, key);
    if (totals.costs.length === 1) totals.cost = totals.costs[0];
    total.append(name, cell(count(totals.turns), "turns", true), ...figures(totals));
    foot.append(total);
    table.replaceChildren(head, body, foot);
    $("usage-status").textContent = `${plural(report.rows.length, "row")}, ${plural(totals.turns, "turn")}`;
  }

  /** A group's key: a session's id links to it; a turn without one (no user, no model) says so. */
  keyCell(key, value) {
    if (value == null) return cell(key === "user" ? "(no user)" : NONE, key);
    const td = cell(key === "session" ? "" : value, key);
    if (key === "session") {
      const a = el("a", "mono", value);
      a.href = `#/s/${encodeURIComponent(value)}`;
      td.append(a);
    }
    return td;
  }

  /** The rows shown, as CSV, saved by the browser. */
  async download() {
    const q = this.query();
    try {
      const res = await api.raw("GET", `/usage?${q}`, { accept: "text/csv" });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      const url = URL.createObjectURL(await res.blob());
      const a = el("a");
      a.href = url;
      a.download = `usage-${q.get("from") || "start"}-${q.get("to") || "now"}-by-${q.get("groupBy").replaceAll(",", "-")}.csv`;
      a.click();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
      $("usage-error").textContent = "";
    } catch (e) {
      $("usage-error").textContent = `download: ${e.message}`;
    }
  }

  /** A `usage_budget` of the lifecycle stream: listed, newest first, and counted in the nav. */
  alert(d) {
    const what = d.currency
      ? `cost budget (${money({ amount: d.spent, currency: d.currency })} of ${money({ amount: d.limit, currency: d.currency })})`
      : `token budget (${count(d.spent)} of ${count(d.limit)} tokens)`;
    const li = el("li", d.percent >= 100 ? "over" : "near");
    li.dataset.percent = String(d.percent);
    li.append(el("strong", null, `${d.percent} %`), ` of ${d.tenant}'s daily ${what} on ${d.day}`);
    $("usage-alerts").prepend(li);
    $("usage-alerts-box").hidden = false;
    this.alerts += 1;
    const badge = $("nav-usage-alerts");
    badge.textContent = String(this.alerts);
    badge.setAttribute("aria-label", plural(this.alerts, "budget alert"));
    badge.hidden = false;
  }
}
