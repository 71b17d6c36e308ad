// The console's entry point: sign-in when the API asks for a key (or with the OpenID provider
// the gateway names: oidc.js), the session list, the create form, the open session (the URL's
// #/s/<id>, so a reload comes back to it), the Usage page (#/usage: usage-page.js) and the
// Agents page (#/agents: agents-page.js), the header's navigation between them.

import { api, sessionPath } from "./api.js";
import * as oidc from "./oidc.js";
import { SessionList } from "./sessions.js";
import { SessionView } from "./session.js";
import { UsagePage } from "./usage-page.js";
import { AgentsPage } from "./agents-page.js";

const $ = (id) => document.getElementById(id);

let view = null;
let list = null;
let usagePage = null;
let agentsPage = null;
let started = false;

function connection(state) {
  const c = $("connection");
  c.textContent = state;
  c.className = `badge ${state}`;
}

function showSignIn(message) {
  view?.close();
  view = null;
  list?.source?.close();
  started = false;
  $("app").hidden = true;
  $("nav").hidden = true;
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = message || "";
  $("oidc-sign-in").hidden = !signInWith;
  if (signInWith) $("oidc-sign-in").textContent = `Sign in with ${new URL(signInWith.issuer).host}`;
  (signInWith ? $("oidc-sign-in") : $("api-key")).focus();
}

let signInWith = null;

api.onUnauthorized = () => showSignIn(api.key() ? "That key was not accepted." : "");

/** A small modal: a question, optionally a text input; resolves to the input, true, or null. */
function ask(text, { input, okLabel = "OK", danger = false } = {}) {
  const d = $("confirm");
  $("confirm-text").textContent = text;
  const field = $("confirm-input");
  field.hidden = $("confirm-input-label").hidden = input === undefined;
  field.value = input ?? "";
  $("confirm-ok").textContent = okLabel;
  $("confirm-ok").className = danger ? "danger" : "";
  return new Promise((resolve) => {
    const done = (ok) => {
      d.close();
      $("confirm-ok").onclick = $("confirm-cancel").onclick = d.oncancel = null;
      resolve(ok ? (input === undefined ? true : field.value) : null);
    };
    $("confirm-ok").onclick = (e) => {
      e.preventDefault();
      done(true);
    };
    $("confirm-cancel").onclick = (e) => {
      e.preventDefault();
      done(false);
    };
    d.oncancel = () => done(false);
    d.showModal();
    (input === undefined ? $("confirm-cancel") : field).focus();
  });
}

async function start() {
  let agents;
  try {
    agents = await api.get("/agents");
  } catch (e) {
    if (e.status === 401) return;
    connection("offline");
    setTimeout(start, 2000);
    return;
  }
  started = true;
  $("sign-in").hidden = true;
  $("app").hidden = false;
  $("nav").hidden = false;
  $("sign-out").hidden = !api.key();
  connection("online");
  const opts = (withAny) => {
    const o = agents.map((a) => {
      const op = document.createElement("option");
      op.value = a.name;
      op.textContent = a.default ? `${a.name} (default)` : a.name;
      return op;
    });
    if (withAny) {
      const any = document.createElement("option");
      any.value = "";
      any.textContent = "any";
      o.unshift(any);
    }
    return o;
  };
  $("create-agent").replaceChildren(...opts(false));
  $("filter-agent").replaceChildren(...opts(true));
  list = new SessionList({
    updated: (s) => view && view.id === s.sessionId && view.update(s),
    watchers: (id, watchers) => view?.id === id && view.people?.showWatchers(watchers),
    budget: (alert) => usagePage.alert(alert),
    deleted: (id) => {
      if (view?.id === id) location.hash = "#/";
    },
    connection,
  });
  list.follow();
  await route();
}

async function route() {
  if (!started) return;
  const usage = location.hash.match(/^#\/usage(?:\?(.*))?$/);
  const agents = location.hash === "#/agents";
  $("session").hidden = !!usage || agents;
  $("usage-page").hidden = !usage;
  $("agents-page").hidden = !agents;
  document.body.classList.toggle("on-usage", !!usage);
  document.body.classList.toggle("on-agents", agents);
  const links = [["nav-sessions", !usage && !agents], ["nav-usage", !!usage], ["nav-agents", agents]];
  for (const [link, current] of links) {
    if (current) $(link).setAttribute("aria-current", "page");
    else $(link).removeAttribute("aria-current");
  }
  if (!agents) agentsPage.hide();
  if (usage || agents) {
    view?.close();
    view = null;
    list.select(null);
    document.body.classList.remove("has-session");
  }
  if (agents) {
    await agentsPage.show();
    return;
  }
  if (usage) {
    try {
      await usagePage.show(new URLSearchParams(usage[1] || ""));
    } catch (e) {
      $("usage-error").textContent = e.message;
    }
    return;
  }
  const m = location.hash.match(/^#\/s\/(.+)$/);
  const id = m ? decodeURIComponent(m[1]) : null;
  if (view && view.id === id) return;
  view?.close();
  view = null;
  list.select(id);
  document.body.classList.toggle("has-session", !!id);
  $("empty").hidden = !!id;
  $("session-view").hidden = !id;
  if (!id) return;
  const v = new SessionView(id, {
    connection,
    activity: (sid, a) => list.activity(sid, a),
    deleted: () => list.remove(id),
    ask,
  });
  view = v;
  try {
    await v.open();
  } catch (e) {
    if (view === v) $("session-error").textContent = `Could not open the session: ${e.message}`;
  }
}

function suggestions() {
  const box = $("suggestions");
  const text = $("prompt").value;
  const m = text.match(/^\/(\S*)$/);
  const cmds = m && view ? view.commands().filter((c) => c.name.startsWith(m[1])) : [];
  box.replaceChildren(
    ...cmds.map((c, i) => {
      const li = document.createElement("li");
      li.setAttribute("role", "option");
      li.id = `suggestion-${i}`;
      li.dataset.name = c.name;
      li.setAttribute("aria-selected", i === 0 ? "true" : "false");
      const b = document.createElement("strong");
      b.textContent = `/${c.name}`;
      li.append(b, ` ${c.description || ""}`);
      li.addEventListener("mousedown", (e) => {
        e.preventDefault();
        pick(c.name);
      });
      return li;
    }),
  );
  box.hidden = cmds.length === 0;
  $("prompt").setAttribute("aria-expanded", String(!box.hidden));
}

function pick(name) {
  $("prompt").value = `/${name} `;
  suggestions();
  $("prompt").focus();
}

function moveSuggestion(delta) {
  const items = [...$("suggestions").children];
  const i = items.findIndex((li) => li.getAttribute("aria-selected") === "true");
  const next = (i + delta + items.length) % items.length;
  items.forEach((li, j) => li.setAttribute("aria-selected", String(j === next)));
  $("prompt").setAttribute("aria-activedescendant", items[next].id);
}

/** Sends the prompt: at once when the session is free, else into its queue (`interrupt`: first,
 * cancelling the running turn). */
async function send(interrupt = false) {
  const text = $("prompt").value;
  if (!view || !text.trim()) return;
  const running = view.activity && view.activity !== "idle";
  const prefer = interrupt ? "interrupt" : running ? "queue" : "respond-async";
  $("send").disabled = true;
  try {
    await api.post(sessionPath(view.id, "/prompt"), { text }, { prefer });
    // A prompt sent at once keeps Send disabled until its turn's activity comes in.
    if (prefer !== "respond-async") $("send").disabled = false;
    $("prompt").value = "";
    suggestions();
    $("session-error").textContent = "";
  } catch (e) {
    $("session-error").textContent = e.message;
    $("send").disabled = false;
  }
}

function wire() {
  usagePage = new UsagePage();
  agentsPage = new AgentsPage({ ask });
  $("sign-in").addEventListener("submit", (e) => {
    e.preventDefault();
    api.setKey($("api-key").value.trim());
    $("api-key").value = "";
    start();
  });
  $("oidc-sign-in").addEventListener("click", () => oidc.begin());
  $("sign-out").addEventListener("click", () => {
    oidc.forget();
    api.setKey(null);
    showSignIn("Signed out.");
  });
  $("create").addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { agent: $("create-agent").value };
    const kind = $("create-workspace").value;
    if (kind !== "scratch") body.cwd = $("create-cwd").value.trim();
    if (kind) body.workspace = { kind };
    if (kind === "worktree" && $("create-ref").value.trim()) body.workspace.ref = $("create-ref").value.trim();
    if ($("create-mode").value.trim()) body.mode = $("create-mode").value.trim();
    if ($("create-model").value.trim()) body.model = $("create-model").value.trim();
    $("create-submit").disabled = true;
    try {
      const s = await api.post("/sessions", body);
      $("create-error").textContent = "";
      list.upsert(s, true);
      location.hash = `#/s/${encodeURIComponent(s.sessionId)}`;
    } catch (err) {
      $("create-error").textContent = err.message;
    } finally {
      $("create-submit").disabled = false;
    }
  });
  $("create-workspace").addEventListener("change", (e) => {
    const kind = e.target.value;
    $("create-ref").hidden = $("create-ref-label").hidden = kind !== "worktree";
    $("create-cwd").required = kind !== "scratch";
    $("create-cwd").disabled = kind === "scratch";
  });
  $("filters").addEventListener("submit", (e) => {
    e.preventDefault();
    list.filter = {
      cwd: $("filter-cwd").value.trim(),
      agent: $("filter-agent").value,
      archived: $("filter-archived").checked,
    };
    list.reload().catch((err) => ($("list-error").textContent = err.message));
  });
  $("more").addEventListener("click", () => list.more());
  $("prompt-form").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("prompt").addEventListener("input", suggestions);
  $("prompt").addEventListener("keydown", (e) => {
    const open = !$("suggestions").hidden;
    if (open && (e.key === "ArrowDown" || e.key === "ArrowUp")) {
      e.preventDefault();
      moveSuggestion(e.key === "ArrowDown" ? 1 : -1);
    } else if (open && (e.key === "Tab" || e.key === "Enter") && !e.shiftKey) {
      e.preventDefault();
      const sel = $("suggestions").querySelector('[aria-selected="true"]');
      if (sel) pick(sel.dataset.name);
    } else if (open && e.key === "Escape") {
      $("suggestions").hidden = true;
    } else if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      if (!$("send").disabled) send();
    }
  });
  $("interrupt").addEventListener("click", () => send(true));
  $("cancel").addEventListener("click", async () => {
    if (!view) return;
    try {
      await api.post(sessionPath(view.id, "/cancel"));
    } catch (e) {
      $("session-error").textContent = e.message;
    }
  });
  $("mode-select").addEventListener("change", (e) => view?.setChoice("mode", e.target.value));
  $("model-select").addEventListener("change", (e) => view?.setChoice("model", e.target.value));
  $("rename").addEventListener("click", async () => {
    if (!view) return;
    const title = await ask("Rename this session", { input: view.session?.title || "", okLabel: "Rename" });
    if (title === null) return;
    try {
      const s = await api.patch(sessionPath(view.id), { title: title.trim() || null });
      view.update(s);
      list.upsert(s, false);
    } catch (e) {
      $("session-error").textContent = e.message;
    }
  });
  $("archive").addEventListener("click", async () => {
    if (!view?.session) return;
    const archived = view.session.archived;
    try {
      await api.post(sessionPath(view.id, archived ? "/unarchive" : "/archive"));
      const s = await api.get(sessionPath(view.id));
      view.update(s);
      list.upsert(s, false);
    } catch (e) {
      $("session-error").textContent = e.message;
    }
  });
  $("delete").addEventListener("click", async () => {
    if (!view) return;
    const id = view.id;
    const ok = await ask(`Delete “${view.session?.title || id}”? Its history goes with it.`, {
      okLabel: "Delete",
      danger: true,
    });
    if (!ok) return;
    try {
      await api.del(sessionPath(id));
      list.remove(id);
      location.hash = "#/";
    } catch (e) {
      $("session-error").textContent = e.message;
    }
  });
  window.addEventListener("hashchange", route);
  // A file dropped beside the Files panel's drop zone is not opened in place of the console.
  for (const type of ["dragover", "drop"]) {
    window.addEventListener(type, (e) => e.dataTransfer?.types?.includes("Files") && e.preventDefault());
  }
  window.addEventListener("acp-console-token", () => {
    if (!started) return;
    list?.follow();
    view?.renew();
  });
}

async function boot() {
  wire();
  signInWith = await oidc.provider();
  if (signInWith) {
    try {
      await oidc.complete();
      oidc.keepFresh();
    } catch (e) {
      showSignIn(e.message);
      return;
    }
  }
  start();
}

boot();
