// What every module of the console builds the page with: an element by id, and a new element
// whose text (never HTML) is set.

export const $ = (id) => document.getElementById(id);

/** A new `tag` element with `className` and, if given, `text` as its text content. */
export function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}
