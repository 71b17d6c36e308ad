"""Smoke test of the Python client generated from openapi/openapi.json by openapi-python-client.

Run by scripts/clients.sh against a live gateway in front of the echo agent, with the generated
package (target/clients/python) on PYTHONPATH:
    python smoke.py http://127.0.0.1:PORT
Exits non-zero on the first mismatch.
"""

import sys
from http import HTTPStatus

from acp_gateway_client import Client
from acp_gateway_client.api.sessions import (
    create_session,
    delete_session,
    get_session,
    get_session_status,
    list_sessions,
    set_session_mode,
    set_session_model,
)
from acp_gateway_client.api.turns import prompt_session
from acp_gateway_client.api.webhooks import create_webhook, delete_webhook, list_webhooks
from acp_gateway_client.models import (
    Activity,
    CreateSession,
    CreateWebhook,
    Problem,
    PromptBody,
    SessionPage,
    SessionView,
    SetMode,
    SetModel,
    StateAt,
    Status,
    StatusView,
    TurnResult,
    WebhookView,
)


class Mismatch(Exception):
    pass


def check(ok: bool, what: str, got: object) -> None:
    if not ok:
        raise Mismatch(f"{what}: got {got!r}")
    print(f"  ok  {what}")


def listed_ids(client: Client) -> list[str]:
    # raise_on_unexpected_status: an undocumented status code fails here.
    resp = list_sessions.sync_detailed(client=client, limit=200)
    check(resp.status_code == HTTPStatus.OK, "listSessions answers 200", resp.status_code)
    check(isinstance(resp.parsed, SessionPage), "listSessions returns a SessionPage", resp.parsed)
    assert isinstance(resp.parsed, SessionPage)
    return [s.session_id for s in resp.parsed.sessions]


def run(base_url: str) -> str:
    # No token: a gateway without API keys on loopback needs no auth. The protected operations
    # accept a plain Client as well as an AuthenticatedClient.
    client = Client(base_url=base_url, raise_on_unexpected_status=True, timeout=30.0)

    # createSession
    resp = create_session.sync_detailed(client=client, body=CreateSession(cwd="/tmp"))
    check(resp.status_code == HTTPStatus.CREATED, "createSession answers 201", resp.status_code)
    session = resp.parsed
    check(isinstance(session, SessionView), "createSession returns a SessionView", session)
    assert isinstance(session, SessionView)
    sid = session.session_id
    check(bool(sid), "createSession returns a sessionId", sid)
    check(session.cwd == "/tmp", f"createSession {sid}: cwd is /tmp", session.cwd)
    check(session.status == Status.LIVE, f"createSession {sid}: status is live", session.status)
    check(
        resp.headers.get("location") == f"/sessions/{sid}",
        "createSession: Location names the session",
        resp.headers.get("location"),
    )

    # promptSession
    resp = prompt_session.sync_detailed(sid, client=client, body=PromptBody(text="hello"))
    check(resp.status_code == HTTPStatus.OK, "promptSession answers 200", (resp.status_code, resp.parsed))
    turn = resp.parsed
    check(isinstance(turn, TurnResult), "promptSession returns a TurnResult", turn)
    assert isinstance(turn, TurnResult)
    check(turn.stop_reason == "end_turn", "promptSession: stopReason is end_turn", turn.stop_reason)

    # promptSession with an Idempotency-Key, sent twice: one turn, the same answer replayed
    keyed = [
        prompt_session.sync_detailed(
            sid, client=client, body=PromptBody(text="once only"), idempotency_key=f"smoke-{sid}"
        )
        for _ in range(2)
    ]
    statuses = [r.status_code for r in keyed]
    check(statuses == [HTTPStatus.OK] * 2, "promptSession with an Idempotency-Key answers 200 twice", statuses)
    replayed = keyed[1].headers.get("idempotent-replayed")
    check(replayed == "true", "promptSession sent again with its Idempotency-Key is a replay", replayed)
    check(keyed[1].content == keyed[0].content, "the replay is the first answer", keyed[1].content)

    # setSessionMode, setSessionModel: the echo agent offers both (ECHO_AGENT_CONTROLS)
    resp = set_session_mode.sync_detailed(sid, client=client, body=SetMode(mode_id="code"))
    check(resp.status_code == HTTPStatus.OK, "setSessionMode answers 200", (resp.status_code, resp.parsed))
    check(isinstance(resp.parsed, StateAt), "setSessionMode returns a StateAt", resp.parsed)
    assert isinstance(resp.parsed, StateAt)
    state = resp.parsed.to_dict()["state"]
    check(state["modes"]["currentModeId"] == "code", "setSessionMode: the state's mode is code", state)
    resp = set_session_model.sync_detailed(sid, client=client, body=SetModel(model_id="echo-large"))
    check(resp.status_code == HTTPStatus.OK, "setSessionModel answers 200", (resp.status_code, resp.parsed))
    assert isinstance(resp.parsed, StateAt)
    state = resp.parsed.to_dict()["state"]
    check(state["models"]["currentModelId"] == "echo-large", "setSessionModel: the state's model is echo-large", state)
    resp = set_session_mode.sync_detailed(sid, client=client, body=SetMode(mode_id="no-such-mode"))
    check(resp.status_code == HTTPStatus.UNPROCESSABLE_ENTITY, "setSessionMode with a mode not offered answers 422", resp.status_code)

    # listSessions
    ids = listed_ids(client)
    check(sid in ids, f"listSessions lists {sid}", ids)

    # getSessionStatus
    resp = get_session_status.sync_detailed(sid, client=client)
    check(resp.status_code == HTTPStatus.OK, "getSessionStatus answers 200", resp.status_code)
    view = resp.parsed
    check(isinstance(view, StatusView), "getSessionStatus returns a StatusView", view)
    assert isinstance(view, StatusView)
    check(view.session_id == sid and view.status == Status.LIVE, "getSessionStatus: live", view)
    check(view.activity == Activity.IDLE, "getSessionStatus: activity idle after the turn", view.activity)

    # deleteSession
    resp = delete_session.sync_detailed(sid, client=client)
    check(resp.status_code == HTTPStatus.NO_CONTENT, "deleteSession answers 204", (resp.status_code, resp.parsed))

    # gone: getSessionStatus says not_found, getSession answers 404, listSessions no longer lists it
    resp = get_session_status.sync_detailed(sid, client=client)
    check(resp.status_code == HTTPStatus.OK, "getSessionStatus after delete answers 200", resp.status_code)
    after = resp.parsed
    check(
        isinstance(after, StatusView) and after.status == Status.NOT_FOUND and after.activity is None,
        "getSessionStatus after delete: not_found",
        after,
    )
    resp = get_session.sync_detailed(sid, client=client)
    check(resp.status_code == HTTPStatus.NOT_FOUND, "getSession after delete answers 404", resp.status_code)
    check(
        isinstance(resp.parsed, Problem) and resp.parsed.status == 404,
        "getSession after delete: a 404 problem",
        resp.parsed,
    )
    ids = listed_ids(client)
    check(sid not in ids, "listSessions after delete does not list it", ids)

    # createWebhook, listWebhooks, deleteWebhook; an unknown event kind is a 422 problem
    body = CreateWebhook(url="https://hooks.example/acp", events=["turn_ended"])
    resp = create_webhook.sync_detailed(client=client, body=body)
    check(resp.status_code == HTTPStatus.CREATED, "createWebhook answers 201", (resp.status_code, resp.parsed))
    hook = resp.parsed
    check(
        isinstance(hook, WebhookView) and isinstance(hook.secret, str) and hook.secret.startswith("whsec_"),
        "createWebhook: with its secret",
        hook,
    )
    assert isinstance(hook, WebhookView)
    hooks = list_webhooks.sync(client=client) or []
    check(any(h.id == hook.id for h in hooks if isinstance(h, WebhookView)), "listWebhooks lists it", hooks)
    bad = create_webhook.sync_detailed(client=client, body=CreateWebhook(url="https://hooks.example/acp", events=["no_such_kind"]))
    check(bad.status_code == HTTPStatus.UNPROCESSABLE_ENTITY, "createWebhook with an unknown kind: 422", bad.status_code)
    resp = delete_webhook.sync_detailed(hook.id, client=client)
    check(resp.status_code == HTTPStatus.NO_CONTENT, "deleteWebhook answers 204", resp.status_code)
    return sid


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: smoke.py BASE_URL", file=sys.stderr)
        return 2
    try:
        sid = run(sys.argv[1])
    except Exception as e:  # noqa: BLE001 - any failure, including a client exception, fails the run
        print(f"python client: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(
        "python client (openapi-python-client): OK: session "
        f"{sid} created, prompted (end_turn; a keyed prompt replayed), mode and model set, listed, status live, deleted, gone; "
        "a webhook created, listed, deleted"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
