// Sign-in with the OpenID provider the gateway names (/console/sign-in): the authorization
// code flow with PKCE, as a public client whose redirect URI is this page. The access token is
// the console's key (api.js, this tab's sessionStorage), kept with its refresh token and
// expiry, and refreshed before it expires; without a refresh token the provider is asked again
// (it answers at once while its own sign-in lasts). A refresh reopens the streams with the
// fresh token ("acp-console-token"), before the gateway ends those of the old one.

import { api } from "./api.js";

const FLOW = "acp-console.oidc-flow";
const GRANT = "acp-console.oidc";

let config = null;
let timer = null;

const b64url = (bytes) =>
  btoa(String.fromCharCode(...new Uint8Array(bytes)))
    .replace(/\+/g, "-")
    .replace(/\//g, "_")
    .replace(/=+$/, "");
const random = (n) => b64url(crypto.getRandomValues(new Uint8Array(n)));
const stored = (name) => JSON.parse(sessionStorage.getItem(name) || "null");
const redirectUri = () => `${location.origin}/`;

/** The provider the console signs in with, or null (then it asks for an API key). */
export async function provider() {
  try {
    config = (await api.get("/console/sign-in")).oidc;
  } catch {
    config = null;
  }
  return config;
}

/** Goes to the provider's sign-in page. */
export async function begin() {
  const verifier = random(32);
  const state = random(16);
  sessionStorage.setItem(FLOW, JSON.stringify({ state, verifier }));
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier));
  const url = new URL(config.authorizationEndpoint);
  url.search = new URLSearchParams({
    response_type: "code",
    client_id: config.clientId,
    redirect_uri: redirectUri(),
    scope: config.scope,
    state,
    code_challenge: b64url(digest),
    code_challenge_method: "S256",
    resource: config.resource,
  }).toString();
  location.assign(url.toString());
}

/** Completes the sign-in the provider came back with (`?code=…&state=…`); false if none. */
export async function complete() {
  const q = new URLSearchParams(location.search);
  if (!q.has("code") && !q.has("error")) return false;
  const flow = stored(FLOW);
  sessionStorage.removeItem(FLOW);
  history.replaceState(null, "", `${location.pathname}${location.hash}`);
  if (q.has("error")) throw new Error(q.get("error_description") || q.get("error"));
  if (!flow || q.get("state") !== flow.state) throw new Error("The sign-in did not match this tab's: sign in again.");
  await token({
    grant_type: "authorization_code",
    code: q.get("code"),
    redirect_uri: redirectUri(),
    code_verifier: flow.verifier,
  });
  return true;
}

async function token(params) {
  const res = await fetch(config.tokenEndpoint, {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({ client_id: config.clientId, resource: config.resource, ...params }),
  });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(body.error_description || body.error || `The provider answered ${res.status}.`);
  api.setKey(body.access_token);
  // The streams move to the fresh token now, before the old one's end closes them.
  if (params.grant_type === "refresh_token") window.dispatchEvent(new Event("acp-console-token"));
  sessionStorage.setItem(
    GRANT,
    JSON.stringify({
      refreshToken: body.refresh_token || stored(GRANT)?.refreshToken,
      expiresAt: Date.now() + (body.expires_in || 300) * 1000,
    }),
  );
  keepFresh();
}

/** Refreshes the token before it expires: a minute before, or halfway when it is short. */
export function keepFresh() {
  clearTimeout(timer);
  const grant = stored(GRANT);
  if (!grant || !config) return;
  const left = grant.expiresAt - Date.now();
  timer = setTimeout(refresh, Math.max(left > 120_000 ? left - 60_000 : left / 2, 0));
}

async function refresh() {
  const grant = stored(GRANT);
  if (grant?.refreshToken) {
    try {
      await token({ grant_type: "refresh_token", refresh_token: grant.refreshToken });
      return;
    } catch (e) {
      console.warn("the token could not be refreshed:", e.message);
    }
  }
  begin();
}

/** Signs out of the console (not of the provider). */
export function forget() {
  clearTimeout(timer);
  sessionStorage.removeItem(GRANT);
}
