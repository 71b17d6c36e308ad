// The people on one session, in the session view: who wrote each prompt and answered each
// request (`who`), the prompts queued behind the running turn with a Withdraw button each
// (GET and DELETE /sessions/{id}/queue), and who is watching (GET /sessions/{id}/watchers once
// the session's stream is open, refreshed by the lifecycle stream's `watchers_changed`).

import { api, sessionPath } from "./api.js";
import { $, el } from "./dom.js";

/** How an author ({tenant, user?, name?}) is shown: their name, else their user, else `fallback`. */
export function who(author, fallback = "") {
  return author?.name || author?.user || fallback || author?.tenant || "";
}

export class People {
  constructor(id, hooks) {
    this.id = id;
    this.hooks = hooks;
    this.closed = false;
    this.generation = 0;
  }

  close() {
    this.closed = true;
    $("queue-box").hidden = true;
    $("watchers").textContent = "";
  }

  /** Shows the queue as the gateway has it now. */
  async refreshQueue() {
    const generation = ++this.generation;
    let queued;
    try {
      queued = await api.get(sessionPath(this.id, "/queue"));
    } catch (e) {
      $("session-error").textContent = e.message;
      return;
    }
    // Closed, or a newer refresh ran meanwhile: its answer is the one shown.
    if (this.closed || generation !== this.generation) return;
    const waiting = queued.filter((q) => !q.started);
    $("queue-box").hidden = waiting.length === 0;
    $("queue-list").replaceChildren(...waiting.map((q) => this.item(q)));
  }

  item(q) {
    const text = (q.prompt || []).map((b) => (b?.type === "text" ? b.text : `[${b?.type}]`)).join("");
    const li = el("li", q.interrupt ? "queued interrupt" : "queued");
    li.dataset.queueId = q.queueId;
    li.append(el("span", "who", who(q.author, "someone")), el("span", "body", text));
    const withdraw = el("button", "secondary", "Withdraw");
    withdraw.type = "button";
    withdraw.addEventListener("click", async () => {
      withdraw.disabled = true;
      try {
        await api.del(sessionPath(this.id, `/queue/${encodeURIComponent(q.queueId)}`));
      } catch (e) {
        $("session-error").textContent = e.message;
        withdraw.disabled = false;
      }
    });
    li.append(withdraw);
    return li;
  }

  /** Shows who is watching: `watchers` as the lifecycle stream told them, else asked for. */
  async showWatchers(watchers) {
    if (!watchers) {
      try {
        watchers = await api.get(sessionPath(this.id, "/watchers"));
      } catch {
        return;
      }
    }
    if (this.closed) return;
    const names = watchers.map((w) => (w.streams > 1 ? `${who(w)} (${w.streams})` : who(w)));
    $("watchers").textContent = names.length ? `Watching: ${names.join(", ")}` : "";
  }
}
