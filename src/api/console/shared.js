// A shared session, read-only: the page at /shared/TOKEN reads the link's session
// (GET /shared/TOKEN), its transcript a page at a time (/history), and, for a live link, its
// stream after the last event read (/events). It needs no key and can do nothing but read.

import { $, el } from "./dom.js";
import { renderMarkdown } from "./markdown.js";

const base = location.pathname.replace(/\/+$/, "");
let lastSeq = 0;
let answer = null; // the agent message being written
let answerText = "";

async function get(path) {
  const r = await fetch(base + path, { headers: { accept: "application/json" } });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.detail || `${r.status}`);
  return body;
}

function text(blocks) {
  return (blocks || []).map((b) => (b.type === "text" ? b.text : `(${b.type})`)).join("");
}

function show(e) {
  if (e.seq <= lastSeq) return;
  lastSeq = e.seq;
  const t = $("transcript");
  const d = e.data || {};
  const u = d.update || {};
  if (e.event === "agent_message_chunk") {
    if (!answer) {
      answer = el("div", "msg agent");
      answer.append(el("span", "who", "Agent"));
      answer.append(el("div", "body"));
      answerText = "";
      t.append(answer);
    }
    answerText += u.content && u.content.type === "text" ? u.content.text : "";
    answer.querySelector(".body").replaceChildren(renderMarkdown(answerText));
    return;
  }
  answer = null;
  if (e.event === "turn_started") {
    const who = d.author ? d.author.name || d.author.user || d.author.tenant : "someone";
    const m = el("div", "msg user");
    m.append(el("span", "who", who), el("p", "", text(d.prompt)));
    t.append(m);
  } else if (e.event === "tool_call") {
    t.append(el("p", "note", `Tool call: ${u.title || u.toolCallId} (${u.status || "pending"})`));
  } else if (e.event === "tool_call_update" && u.status) {
    t.append(el("p", "note", `Tool call ${u.toolCallId}: ${u.status}`));
  } else if (e.event === "permission_requested") {
    const call = (d.request && d.request.toolCall) || {};
    t.append(el("p", "note", `Permission asked: ${call.title || ""}`));
  } else if (e.event === "permission_resolved") {
    const chose = (d.outcome && (d.outcome.optionId || d.outcome.outcome)) || "";
    t.append(el("p", "note", `Permission answered: ${chose}`));
  } else if (e.event === "turn_ended") {
    t.append(el("p", "note", d.error ? `The turn failed: ${d.error.title}` : `Turn ended: ${d.stopReason || "end_turn"}`));
  } else if (e.event === "agent_exited") {
    t.append(el("p", "note", "The agent exited"));
  }
}

async function main() {
  const state = $("shared-state");
  try {
    const s = await get("");
    $("shared-title").textContent = s.title || "Shared session";
    document.title = `${s.title || "Shared session"} (shared)`;
    $("shared-about").textContent = `Agent ${s.agent}, read-only${s.live ? ", live" : ""}; this link expires ${new Date(s.expiresAt).toLocaleString()}.`;
    for (let after = 0; ; ) {
      const page = await get(`/history?after=${after}&limit=1000`);
      page.events.forEach(show);
      if (page.nextAfter === undefined) break;
      after = page.nextAfter;
    }
    state.textContent = s.live ? "live" : "transcript";
    if (s.live) {
      const stream = new EventSource(`${base}/events?after=${lastSeq}`);
      stream.onmessage = () => {};
      const names = ["turn_started", "agent_message_chunk", "tool_call", "tool_call_update", "permission_requested", "permission_resolved", "turn_ended", "agent_exited"];
      for (const name of names) {
        stream.addEventListener(name, (m) => show({ seq: Number(m.lastEventId), event: name, data: JSON.parse(m.data) }));
      }
      stream.onerror = () => { state.textContent = "reconnecting…"; };
      stream.onopen = () => { state.textContent = "live"; };
    }
  } catch (e) {
    state.textContent = "unavailable";
    $("shared-about").textContent = `This link does not open: ${e.message}`;
  }
}

main();
