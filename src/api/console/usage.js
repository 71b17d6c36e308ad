// What a session's turns spent, in the session view: the Usage panel (GET
// /sessions/{id}/usage), its totals in the panel's summary line and a table of the turns with
// their tokens and cost, refreshed after the session stream's `turn_ended` (once for a burst;
// the gateway records a turn's usage just after telling its end, so the panel looks again while
// the turn is not there yet). And how figures are shown, which the Usage page shares: a figure
// the agent did not report is "—", never 0.
//
// Users, models and currencies only ever reach the page as text (textContent).

import { api, sessionPath } from "./api.js";
import { $, el } from "./dom.js";

/** What a figure nobody reported shows. */
export const NONE = "—";

/** The token figures of a spend, in the order of the tables' columns, with their headings. */
export const TOKENS = [
  ["inputTokens", "Input"],
  ["outputTokens", "Output"],
  ["thoughtTokens", "Thought"],
  ["cacheReadTokens", "Cache read"],
  ["cacheWriteTokens", "Cache write"],
  ["totalTokens", "Total tokens"],
];

/** How long the panel waits after a `turn_ended`, so that a burst of them is one request. */
const SETTLE_MS = 250;
/** How often it looks again for a turn the ledger has not recorded yet, each a bit later. */
const RETRIES = 4;

/** A count of tokens or turns, or "—". */
export function count(n) {
  return n == null ? NONE : Number(n).toLocaleString();
}

/** `{amount, currency}` as "0.09 USD" (small amounts with their significant digits). */
export function money(c) {
  const a = Number(c.amount);
  const digits = a === 0 || Math.abs(a) >= 0.01 ? { maximumFractionDigits: 4 } : { maximumSignificantDigits: 3 };
  return `${a.toLocaleString(undefined, digits)} ${c.currency}`;
}

/** A spend's cost: in its one currency, else each of its `costs`, else "—". */
export function cost(spend) {
  if (spend.cost) return money(spend.cost);
  if (spend.costs?.length) return spend.costs.map(money).join(" + ");
  return NONE;
}

/** A table cell whose `data-col` names its column; numbers are aligned right. */
export function cell(text, col, numeric = false) {
  const td = el("td", numeric ? "num" : "", text);
  if (text === NONE) td.classList.add("muted");
  td.dataset.col = col;
  return td;
}

/** The cells of a spend's tokens and cost. */
export function figures(spend) {
  return [...TOKENS.map(([k]) => cell(count(spend[k]), k, true)), cell(cost(spend), "cost", true)];
}

/** A table's heading row. */
export function headings(labels) {
  const tr = el("tr");
  for (const label of labels) {
    const th = el("th", null, label);
    th.scope = "col";
    tr.append(th);
  }
  return tr;
}

export function plural(n, one) {
  return `${count(n)} ${n === 1 ? one : `${one}s`}`;
}

export class UsagePanel {
  constructor(id) {
    this.id = id;
    this.closed = false;
    // Each refresh's number: an older one that answers last draws nothing.
    this.generation = 0;
    this.timer = null;
    // The turns shown, the turns expected (a turn that reported usage has ended), and how
    // often the panel has looked again for them.
    this.shown = 0;
    this.want = 0;
    this.tries = 0;
    this.costSeen = false;
    $("usage-box").hidden = false;
    $("usage-summary").textContent = "";
    $("usage-turns-error").textContent = "";
    $("usage-turns").replaceChildren();
  }

  /** Shows the usage once the session view has read the log (`turn_ended`s then come live). */
  start() {
    this.want = 0;
    this.tries = 0;
    this.refresh();
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
  }

  /** A `usage_update` of the session: one with a cost means its turn will have a row. */
  noted(update) {
    if (update?.cost) this.costSeen = true;
  }

  /** A `turn_ended` of the session's stream (its `data`): refreshes soon. */
  turnEnded(data) {
    if (data?.usage || this.costSeen) this.want = Math.max(this.want, this.shown) + 1;
    this.costSeen = false;
    this.tries = 0;
    this.soon(SETTLE_MS);
  }

  soon(ms) {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.refresh(), ms);
  }

  /** Shows the session's usage as the gateway has it now. */
  async refresh() {
    if (this.closed) return;
    clearTimeout(this.timer);
    const generation = ++this.generation;
    let usage;
    try {
      usage = await api.get(sessionPath(this.id, "/usage"));
    } catch (e) {
      if (!this.closed && generation === this.generation) $("usage-turns-error").textContent = `usage: ${e.message}`;
      return;
    }
    if (this.closed || generation !== this.generation) return;
    $("usage-turns-error").textContent = "";
    this.show(usage);
    if (usage.turns.length < this.want && this.tries < RETRIES) {
      this.tries += 1;
      this.soon(SETTLE_MS * 2 ** this.tries);
    } else {
      this.want = usage.turns.length;
    }
  }

  show(usage) {
    const t = usage.totals;
    this.shown = usage.turns.length;
    const box = $("usage-box");
    box.dataset.turns = String(t.turns);
    $("usage-summary").textContent = t.turns
      ? `${plural(t.turns, "turn")} · ${count(t.totalTokens)} tokens · ${cost(t)}`
      : "no turn has reported usage yet";
    const table = $("usage-turns");
    if (!usage.turns.length) {
      table.replaceChildren();
      return;
    }
    const head = el("thead");
    head.append(headings(["Ended", "By", "Model", ...TOKENS.map(([, label]) => label), "Cost"]));
    const body = el("tbody");
    for (const turn of usage.turns) {
      const tr = el("tr");
      tr.append(
        cell(new Date(turn.endedAt).toLocaleString(), "endedAt"),
        cell(turn.user ?? turn.tenant, "user"),
        cell(turn.model ?? NONE, "model"),
        ...figures(turn),
      );
      body.append(tr);
    }
    const foot = el("tfoot");
    const total = el("tr");
    const label = el("th", null, `Total (${plural(t.turns, "turn")})`);
    label.scope = "row";
    label.colSpan = 3;
    total.append(label, ...figures(t));
    foot.append(total);
    table.replaceChildren(head, body, foot);
  }
}
