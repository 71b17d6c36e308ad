// An elicitation as a form: one labelled control per property of its requestedSchema (string,
// number, integer, boolean, enum), Accept / Decline / Cancel; URL mode shows the link instead.

import { el } from "./dom.js";

let seq = 0;

function field(name, schema, required) {
  const id = `elicit-${++seq}-${name.replace(/[^\w-]/g, "_")}`;
  const wrap = el("div");
  const label = el("label", schema.type === "boolean" ? "check" : "", `${schema.title || name}${required ? " (required)" : ""}`);
  label.htmlFor = id;
  let input;
  const options = schema.enum || schema.oneOf?.map((o) => o.const);
  if (options) {
    input = el("select");
    if (!required) input.append(el("option", null, ""));
    for (const v of options) {
      const o = el("option", null, String(v));
      o.value = String(v);
      input.append(o);
    }
  } else if (schema.type === "boolean") {
    input = el("input");
    input.type = "checkbox";
  } else {
    input = el("input");
    input.type = schema.type === "integer" || schema.type === "number" ? "number" : "text";
    if (schema.type === "integer") input.step = "1";
    if (schema.minimum != null) input.min = String(schema.minimum);
    if (schema.maximum != null) input.max = String(schema.maximum);
    if (schema.pattern) input.pattern = schema.pattern;
    if (schema.minLength != null) input.minLength = schema.minLength;
  }
  input.id = id;
  input.name = name;
  input.required = required && schema.type !== "boolean";
  if (schema.description) input.title = schema.description;
  if (schema.type === "boolean") {
    label.prepend(input);
    wrap.append(label);
  } else {
    wrap.append(label, input);
  }
  return {
    wrap,
    value() {
      if (schema.type === "boolean") return input.checked;
      if (input.value === "") return undefined;
      if (schema.type === "integer") return parseInt(input.value, 10);
      if (schema.type === "number") return Number(input.value);
      return input.value;
    },
  };
}

/** The form of an `elicitation_requested` event; `answer(body)` posts it. */
export function elicitationForm(data, answer) {
  const req = data.request || {};
  const box = el("form", "request elicitation");
  box.setAttribute("aria-label", "Input requested");
  box.noValidate = false;
  box.append(el("h3", null, "Input requested"));
  box.append(el("p", null, req.message || ""));
  const fields = [];
  if (req.mode === "url") {
    const a = el("a", null, req.url);
    try {
      const u = new URL(req.url);
      if (u.protocol === "https:" || u.protocol === "http:") a.href = u.href;
    } catch {
      /* shown as text */
    }
    a.target = "_blank";
    a.rel = "noopener noreferrer";
    box.append(a);
  } else {
    const schema = req.requestedSchema || {};
    const required = new Set(schema.required || []);
    for (const [name, s] of Object.entries(schema.properties || {})) {
      const f = field(name, s, required.has(name));
      fields.push([name, f]);
      box.append(f.wrap);
    }
  }
  const row = el("div", "row");
  const accept = el("button", null, "Accept");
  accept.type = "submit";
  const decline = el("button", "secondary", "Decline");
  decline.type = "button";
  const cancel = el("button", "danger", "Cancel");
  cancel.type = "button";
  row.append(accept, decline, cancel);
  box.append(row);
  box.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (req.mode === "url") return answer({ action: "accept" });
    const content = {};
    for (const [name, f] of fields) {
      const v = f.value();
      if (v !== undefined) content[name] = v;
    }
    answer({ action: "accept", content });
  });
  decline.addEventListener("click", () => answer({ action: "decline" }));
  cancel.addEventListener("click", () => answer({ action: "cancel" }));
  return box;
}
