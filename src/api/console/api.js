// The gateway's API as the console calls it: same origin, the API key (if any) from this tab's
// sessionStorage as a bearer header, and as `access_token` for EventSource, which cannot set
// headers. A 401 asks the page to sign in (onUnauthorized).

const KEY = "acp-console.key";

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

export const api = {
  onUnauthorized: () => {},

  key() {
    return sessionStorage.getItem(KEY);
  },
  setKey(key) {
    if (key) sessionStorage.setItem(KEY, key);
    else sessionStorage.removeItem(KEY);
  },

  /** The response to `method` `path` (the key as a bearer header), whatever its status. */
  async raw(method, path, headers = {}, body = undefined) {
    const key = this.key();
    if (key) headers = { ...headers, authorization: `Bearer ${key}` };
    const res = await fetch(path, { method, headers, body });
    if (res.status === 401) this.onUnauthorized();
    return res;
  },

  /** `body`: JSON, or a FormData sent as multipart. A problem answer throws an ApiError. */
  async call(method, path, body, extra = {}) {
    const headers = { accept: "application/json", ...extra };
    const form = body instanceof FormData;
    if (body !== undefined && !form) headers["content-type"] = "application/json";
    const sent = body === undefined || form ? body : JSON.stringify(body);
    const res = await this.raw(method, path, headers, sent);
    if (res.status === 204) return null;
    const text = await res.text();
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch {
      json = { detail: text };
    }
    if (!res.ok) throw new ApiError(res.status, json);
    return json;
  },
  get(path) {
    return this.call("GET", path);
  },
  post(path, body, extra) {
    return this.call("POST", path, body ?? {}, extra);
  },
  put(path, body) {
    return this.call("PUT", path, body);
  },
  patch(path, body) {
    return this.call("PATCH", path, body);
  },
  del(path) {
    return this.call("DELETE", path);
  },

  /** An EventSource on `path` with `params` (and the key as access_token). */
  stream(path, params = {}) {
    const q = new URLSearchParams(params);
    const key = this.key();
    if (key) q.set("access_token", key);
    const s = q.toString();
    return new EventSource(s ? `${path}?${s}` : path);
  },
};

export function sessionPath(id, rest = "") {
  return `/sessions/${encodeURIComponent(id)}${rest}`;
}
