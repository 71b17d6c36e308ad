// A small Markdown renderer that never turns text into HTML: it builds DOM nodes and puts every
// piece of the agent's text in with textContent / createTextNode. Blocks: fenced code, headings,
// lists (- * 1.), block quotes, paragraphs. Inline: `code`, **strong**, *em*, [links](http…).
// Links keep only http, https and mailto URLs; anything else stays text.

const INLINE = /(`+)([^`]+?)\1|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*|\[([^\]]+)\]\(([^)\s]+)\)/g;

function el(tag, className) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  return e;
}

function safeHref(url) {
  try {
    const u = new URL(url);
    return ["http:", "https:", "mailto:"].includes(u.protocol) ? u.href : null;
  } catch {
    return null;
  }
}

/** Appends `text`'s inline Markdown to `parent` as nodes. */
export function renderInline(parent, text) {
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) parent.append(document.createTextNode(text.slice(last, m.index)));
    if (m[2] !== undefined) {
      const c = el("code");
      c.textContent = m[2];
      parent.append(c);
    } else if (m[3] !== undefined) {
      const s = el("strong");
      renderInline(s, m[3]);
      parent.append(s);
    } else if (m[4] !== undefined) {
      const s = el("em");
      renderInline(s, m[4]);
      parent.append(s);
    } else {
      const href = safeHref(m[6]);
      if (href) {
        const a = el("a");
        a.href = href;
        a.rel = "noopener noreferrer";
        a.target = "_blank";
        a.textContent = m[5];
        parent.append(a);
      } else {
        parent.append(document.createTextNode(m[0]));
      }
    }
    last = m.index + m[0].length;
  }
  if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
}

/** `text` as a fragment of DOM nodes. */
export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = text.split("\n");
  let para = [];
  let list = null;
  const flushPara = () => {
    if (para.length) {
      const p = el("p");
      para.forEach((l, i) => {
        if (i) p.append(el("br"));
        renderInline(p, l);
      });
      out.append(p);
      para = [];
    }
  };
  const endList = () => {
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*(```|~~~)\s*([\w+-]*)/);
    if (fence) {
      flushPara();
      endList();
      const code = [];
      i++;
      while (i < lines.length && !lines[i].trimStart().startsWith(fence[1])) code.push(lines[i++]);
      const pre = el("pre");
      const c = el("code");
      if (fence[2]) c.dataset.lang = fence[2];
      c.textContent = code.join("\n");
      pre.append(c);
      out.append(pre);
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      flushPara();
      endList();
      const h = el(`h${Math.min(6, heading[1].length + 2)}`);
      renderInline(h, heading[2]);
      out.append(h);
      continue;
    }
    const item = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
    if (item) {
      flushPara();
      const ordered = /\d/.test(item[1]);
      if (!list || list.ordered !== ordered) {
        list = { ordered, node: el(ordered ? "ol" : "ul") };
        out.append(list.node);
      }
      const li = el("li");
      renderInline(li, item[2]);
      list.node.append(li);
      continue;
    }
    const quote = line.match(/^>\s?(.*)$/);
    if (quote) {
      flushPara();
      endList();
      const q = el("blockquote");
      renderInline(q, quote[1]);
      out.append(q);
      continue;
    }
    if (!line.trim()) {
      flushPara();
      endList();
      continue;
    }
    endList();
    para.push(line);
  }
  flushPara();
  return out;
}
