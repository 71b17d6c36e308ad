// Smoke test of the TypeScript client generated from openapi/openapi.json: `openapi-typescript`
// turns the spec into types (target/clients/ts/schema.d.ts) and `openapi-fetch` makes typed
// requests with them. Run by scripts/clients.sh against a live gateway in front of the echo agent:
//   node target/clients/ts/build/smoke.js http://127.0.0.1:PORT
// Exits non-zero on the first mismatch.
import createClient from "openapi-fetch";
import type { operations, paths } from "acp-gateway-schema";

// Response bodies named by operationId, so a renamed operation fails the type check.
type Json<Op extends keyof operations, Status extends number> =
  operations[Op]["responses"] extends Record<Status, { content: { "application/json": infer T } }>
    ? T
    : never;
type Created = Json<"createSession", 201>;
type Turn = Json<"promptSession", 200>;
type Page = Json<"listSessions", 200>;
type StatusView = Json<"getSessionStatus", 200>;
type Webhook = Json<"createWebhook", 201>;

const baseUrl = process.argv[2];
if (!baseUrl) {
  console.error("usage: node smoke.js BASE_URL");
  process.exit(2);
}

function check(ok: boolean, what: string, got: unknown): void {
  if (!ok) {
    throw new Error(`${what}: got ${JSON.stringify(got)}`);
  }
  console.log(`  ok  ${what}`);
}

const client = createClient<paths>({ baseUrl });

async function main(): Promise<string> {
  // createSession
  const created = await client.POST("/sessions", { body: { cwd: "/tmp" } });
  check(created.response.status === 201, "createSession answers 201", created.response.status);
  const session: Created | undefined = created.data;
  check(session !== undefined && session.sessionId.length > 0, "createSession returns a sessionId", created.data ?? created.error);
  const id = session!.sessionId;
  check(session!.cwd === "/tmp", `createSession ${id}: cwd is /tmp`, session!.cwd);
  check(session!.status === "live", `createSession ${id}: status is live`, session!.status);
  check(
    created.response.headers.get("location") === `/sessions/${id}`,
    "createSession: Location names the session",
    created.response.headers.get("location"),
  );

  // promptSession
  const prompted = await client.POST("/sessions/{id}/prompt", {
    params: { path: { id } },
    body: { text: "hello" },
  });
  check(prompted.response.status === 200, "promptSession answers 200", prompted.error ?? prompted.response.status);
  // A 200 is the turn's result; the 202 of a queued prompt (Prefer: queue) is the queued prompt.
  const turn: Turn | undefined = prompted.data && "stopReason" in prompted.data ? prompted.data : undefined;
  check(turn?.stopReason === "end_turn", "promptSession: stopReason is end_turn", turn);

  // promptSession with an Idempotency-Key, sent twice: one turn, the same answer replayed
  const keyed = () =>
    client.POST("/sessions/{id}/prompt", {
      params: { path: { id }, header: { "Idempotency-Key": `smoke-${id}` } },
      body: { text: "once only" },
    });
  const first = await keyed();
  check(first.response.status === 200, "promptSession with an Idempotency-Key answers 200", first.error ?? first.response.status);
  const again = await keyed();
  check(
    again.response.status === 200 && again.response.headers.get("idempotent-replayed") === "true",
    "promptSession sent again with its Idempotency-Key is a replay",
    [again.response.status, again.response.headers.get("idempotent-replayed")],
  );
  check(JSON.stringify(again.data) === JSON.stringify(first.data), "the replay is the first answer", again.data);

  // setSessionMode, setSessionModel: the echo agent offers both (ECHO_AGENT_CONTROLS)
  const mode = await client.PUT("/sessions/{id}/mode", {
    params: { path: { id } },
    body: { modeId: "code" },
  });
  check(mode.response.status === 200, "setSessionMode answers 200", mode.error ?? mode.response.status);
  const modes = mode.data?.state.modes as unknown as { currentModeId?: string } | null | undefined;
  check(modes?.currentModeId === "code", "setSessionMode: the state's mode is code", mode.data);
  const model = await client.PUT("/sessions/{id}/model", {
    params: { path: { id } },
    body: { modelId: "echo-large" },
  });
  check(model.response.status === 200, "setSessionModel answers 200", model.error ?? model.response.status);
  const models = model.data?.state.models as unknown as { currentModelId?: string } | null | undefined;
  check(models?.currentModelId === "echo-large", "setSessionModel: the state's model is echo-large", model.data);
  const refused = await client.PUT("/sessions/{id}/mode", {
    params: { path: { id } },
    body: { modeId: "no-such-mode" },
  });
  check(refused.response.status === 422, "setSessionMode with a mode not offered answers 422", refused.response.status);

  // listSessions
  const listed = await client.GET("/sessions", { params: { query: { limit: 200 } } });
  check(listed.response.status === 200, "listSessions answers 200", listed.error ?? listed.response.status);
  const page: Page | undefined = listed.data;
  check(page?.sessions.some((s) => s.sessionId === id) === true, `listSessions lists ${id}`, page?.sessions.map((s) => s.sessionId));

  // getSessionStatus
  const status = await client.GET("/sessions/{id}/status", { params: { path: { id } } });
  check(status.response.status === 200, "getSessionStatus answers 200", status.error ?? status.response.status);
  const view: StatusView | undefined = status.data;
  check(view?.sessionId === id && view.status === "live", "getSessionStatus: live", view);
  check(view?.activity === "idle", "getSessionStatus: activity idle after the turn", view?.activity);

  // deleteSession
  const deleted = await client.DELETE("/sessions/{id}", { params: { path: { id } } });
  check(deleted.response.status === 204, "deleteSession answers 204", deleted.error ?? deleted.response.status);

  // gone: getSessionStatus says not_found, getSession answers 404, listSessions no longer lists it
  const after = await client.GET("/sessions/{id}/status", { params: { path: { id } } });
  check(after.response.status === 200, "getSessionStatus after delete answers 200", after.response.status);
  check(after.data?.status === "not_found" && after.data.activity == null, "getSessionStatus after delete: not_found", after.data);
  const got = await client.GET("/sessions/{id}", { params: { path: { id } } });
  check(got.response.status === 404, "getSession after delete answers 404", got.response.status);
  check(got.error?.status === 404 && typeof got.error.detail === "string", "getSession after delete: a 404 problem", got.error);
  const relisted = await client.GET("/sessions", { params: { query: { limit: 200 } } });
  check(
    relisted.data?.sessions.every((s) => s.sessionId !== id) === true,
    "listSessions after delete does not list it",
    relisted.data?.sessions.map((s) => s.sessionId),
  );

  // createWebhook, listWebhooks, deleteWebhook; an unknown event kind is a 422 problem
  const made = await client.POST("/webhooks", { body: { url: "https://hooks.example/acp", events: ["turn_ended"] } });
  check(made.response.status === 201, "createWebhook answers 201", made.error ?? made.response.status);
  const hook: Webhook | undefined = made.data;
  check(hook?.secret?.startsWith("whsec_") === true && hook.enabled, "createWebhook: enabled, with its secret", hook);
  const hooks = await client.GET("/webhooks");
  check(hooks.data?.some((h) => h.id === hook?.id && h.secret == null) === true, "listWebhooks lists it, without the secret", hooks.data);
  const bad = await client.POST("/webhooks", { body: { url: "https://hooks.example/acp", events: ["no_such_kind"] } });
  check(bad.response.status === 422 && bad.error?.status === 422, "createWebhook with an unknown kind: 422", bad.error);
  const gone = await client.DELETE("/webhooks/{id}", { params: { path: { id: hook?.id ?? "" } } });
  check(gone.response.status === 204, "deleteWebhook answers 204", gone.response.status);
  return id;
}

main().then(
  (id) => console.log(`typescript client (openapi-typescript + openapi-fetch): OK: session ${id} created, prompted (end_turn; a keyed prompt replayed), mode and model set, listed, status live, deleted, gone; a webhook created, listed, deleted`),
  (err: unknown) => {
    console.error(`typescript client: FAILED: ${err instanceof Error ? err.message : String(err)}`);
    process.exit(1);
  },
);
