// An OpenID Connect provider for the tests (tests/oidc.rs): the npm `oidc-provider` (certified
// by the OpenID Foundation) on a loopback port, issuing real JWT access tokens.
//
// Clients (client_credentials, secret "secret"): `acme` and `globex` (their `tenant` claim),
// `acme-brief` (tenant acme, tokens of BRIEF_TTL seconds), `ops` (roles: ["admin"]), `nobody`
// (no tenant). Tokens last 300 s; a token request may name its `resource` (the audience,
// default AUDIENCE).
//
// The console's client (`console`, public, authorization code with PKCE, refresh tokens; its
// users' login names are their tenants; access tokens of CONSOLE_TTL seconds) is registered by
// POST /test/console {redirectUri}, once the gateway's address is known; its sign-in pages are
// the provider's development ones (any login and password).
//
// Test-only routes beside the provider's:
// - POST /test/rotate: a new signing key, published first in the JWKS; the old one stays listed.
// - POST /test/forge {header, claims, sign}: a token signed with the current private key
//   (sign "key"), with the public key's PEM as an HMAC secret ("hmac-public"), or unsigned
//   ("none"), for what no real provider issues (a wrong issuer, a future nbf, alg none).
//
// Prints one JSON line when it listens: {"issuer": "...", "audience": "..."}.

import crypto from 'node:crypto';
import http from 'node:http';
import Provider from 'oidc-provider';

const AUDIENCE = process.env.AUDIENCE || 'urn:acp-gateway';
const BRIEF_TTL = Number(process.env.BRIEF_TTL || 4);
const CONSOLE_TTL = Number(process.env.CONSOLE_TTL || 10);
let consoleRedirect = null;
const TENANTS = { acme: 'acme', 'acme-brief': 'acme', globex: 'globex' };
const ROLES = { ops: ['admin'] };

let keys = [];
let provider;
let issuer;

function newKey() {
  const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  const kid = `k${keys.length + 1}`;
  return { kid, privateKey, jwk: { ...privateKey.export({ format: 'jwk' }), kid, alg: 'RS256', use: 'sig' } };
}

function build() {
  const clients = ['acme', 'acme-brief', 'globex', 'ops', 'nobody'].map((id) => ({
    client_id: id,
    client_secret: 'secret',
    grant_types: ['client_credentials'],
    redirect_uris: [],
    response_types: [],
  }));
  if (consoleRedirect) {
    clients.push({
      client_id: 'console',
      token_endpoint_auth_method: 'none',
      grant_types: ['authorization_code', 'refresh_token'],
      redirect_uris: [consoleRedirect],
      response_types: ['code'],
    });
  }
  const p = new Provider(issuer, {
    clients,
    clientBasedCORS: () => true,
    issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
    findAccount: (ctx, id) => ({ accountId: id, claims: () => ({ sub: id }) }),
    jwks: { keys: keys.map((k) => k.jwk) },
    features: {
      devInteractions: { enabled: true },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => AUDIENCE,
        useGrantedResource: () => true,
        getResourceServerInfo: (ctx, resource, client) => ({
          scope: 'api',
          audience: resource,
          accessTokenFormat: 'jwt',
          accessTokenTTL: { 'acme-brief': BRIEF_TTL, console: CONSOLE_TTL }[client.clientId] || 300,
        }),
      },
    },
    extraTokenClaims: (ctx, token) => {
      const claims = {};
      if (TENANTS[token.clientId]) claims.tenant = TENANTS[token.clientId];
      if (token.clientId === 'console' && token.accountId) claims.tenant = token.accountId;
      if (ROLES[token.clientId]) claims.roles = ROLES[token.clientId];
      return claims;
    },
  });
  p.on('server_error', (ctx, err) => console.error('provider error', err));
  return p;
}

const b64 = (v) => Buffer.from(typeof v === 'string' ? v : JSON.stringify(v)).toString('base64url');

function forge({ header = {}, claims = {}, sign = 'key' }) {
  const current = keys[0];
  const now = Math.floor(Date.now() / 1000);
  const body = { iss: issuer, aud: AUDIENCE, iat: now, exp: now + 300, tenant: 'acme', ...claims };
  const alg = { none: 'none', 'hmac-public': 'HS256', key: 'RS256' }[sign];
  const input = `${b64({ typ: 'at+jwt', kid: current.kid, ...header, alg })}.${b64(body)}`;
  if (sign === 'none') return `${input}.`;
  if (sign === 'hmac-public') {
    const pem = crypto.createPublicKey(current.privateKey).export({ type: 'spki', format: 'pem' });
    return `${input}.${crypto.createHmac('sha256', pem).update(input).digest('base64url')}`;
  }
  return `${input}.${crypto.sign('sha256', Buffer.from(input), current.privateKey).toString('base64url')}`;
}

async function readJson(req) {
  let text = '';
  for await (const chunk of req) text += chunk;
  return text ? JSON.parse(text) : {};
}

const server = http.createServer(async (req, res) => {
  if (req.url === '/test/rotate' && req.method === 'POST') {
    keys = [newKey(), ...keys];
    provider = build();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ kid: keys[0].kid }));
    return;
  }
  if (req.url === '/test/console' && req.method === 'POST') {
    consoleRedirect = (await readJson(req)).redirectUri;
    provider = build();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end('{}');
    return;
  }
  if (req.url === '/test/forge' && req.method === 'POST') {
    const token = forge(await readJson(req));
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ token }));
    return;
  }
  provider.callback()(req, res);
});

server.listen(0, '127.0.0.1', () => {
  issuer = `http://127.0.0.1:${server.address().port}`;
  keys = [newKey()];
  provider = build();
  console.log(JSON.stringify({ issuer, audience: AUDIENCE }));
});

process.on('SIGTERM', () => server.close(() => process.exit(0)));
