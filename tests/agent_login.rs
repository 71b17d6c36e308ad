//! Signing an agent in and out. Its terminal login over a WebSocket (`GET /agents/{name}/login`), with the echo
//! agent's own login program (`echo_agent --login`: a device code, then a token typed in): the
//! agent advertises the method to the gateway, answers `auth_required` naming it until signed
//! in; the login runs in a real pseudo-terminal (the program refuses anything else), a wrong
//! token exits 1 and changes nothing, the right one exits 0 and the agent's members start
//! again signed in; only an admin may open it, and a client that goes away ends the login.
//! ACP `logout` (`POST /agents/{name}/logout`) signs every member out, and members that start
//! again stay out.

use crate::support;

use std::time::{Duration, Instant};

use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use support::*;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

const ADMIN: &str = "admin-key-0123456789";
const ANN: &str = "ann-key-0123456789ab";

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// Opens the login of `method` with `key` as a bearer header: the socket, or the HTTP status it
/// was refused with.
async fn open(gw: &Gateway, key: &str, method: &str) -> Result<Socket, u16> {
    connect(gw, Some(key), &format!("methodId={method}")).await
}

/// Opens the login with `query`, and `key` as a bearer header if given (a browser's WebSocket
/// cannot send one: it gives its key as `access_token`).
async fn connect(gw: &Gateway, key: Option<&str>, query: &str) -> Result<Socket, u16> {
    let url = gw
        .url(&format!("/agents/default/login?{query}"))
        .replacen("http://", "ws://", 1);
    let mut request = url.into_client_request().unwrap();
    if let Some(key) = key {
        let bearer = format!("Bearer {key}").parse().unwrap();
        request.headers_mut().insert("authorization", bearer);
    }
    let tcp = tokio::net::TcpStream::connect(gw.address()).await.unwrap();
    match tokio_tungstenite::client_async(request, tcp).await {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(answer)) => Err(answer.status().as_u16()),
        Err(e) => panic!("the login's WebSocket: {e}"),
    }
}

/// Reads the terminal until its text holds `wanted`; answers everything shown so far.
async fn screen_until(socket: &mut Socket, shown: &mut String, wanted: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !shown.contains(wanted) {
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = tokio::time::timeout(left, socket.next()).await;
        match frame {
            Ok(Some(Ok(Message::Binary(bytes)))) => {
                shown.push_str(&String::from_utf8_lossy(&bytes))
            }
            Ok(Some(Ok(other))) => panic!("{other:?} before {wanted:?}; the screen: {shown:?}"),
            _ => panic!("no {wanted:?} on the screen: {shown:?}"),
        }
    }
}

/// The exit frame that ends the login (after any last output).
async fn exit_code(socket: &mut Socket) -> Value {
    loop {
        let frame = tokio::time::timeout(PATIENCE, socket.next()).await.unwrap();
        match frame {
            Some(Ok(Message::Binary(_))) => continue,
            Some(Ok(Message::Text(text))) => {
                return serde_json::from_str::<Value>(&text).unwrap()["exit"].clone();
            }
            other => panic!("no exit frame: {other:?}"),
        }
    }
}

/// `opts` with the admin's key and Ann's, a tenant's.
fn keyed(opts: Options) -> Options {
    opts.args(&[
        "--admin-api-key",
        ADMIN,
        "--api-key",
        &format!("acme:{ANN}"),
    ])
}

async fn first_member(gw: &Gateway) -> Value {
    let (_, agent) = gw.with_key(Some(ADMIN)).get("/agent").await;
    agent["members"][0].clone()
}

async fn new_session(gw: &Gateway) -> (u16, Value) {
    gw.with_key(Some(ANN))
        .post("/sessions", json!({"cwd": "/tmp"}))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_login_signs_the_agent_in_over_a_websocket() {
    let opts = keyed(Options::default().env("ECHO_AGENT_TERMINAL_AUTH", "echo-login"));
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let admin = gw.with_key(Some(ADMIN));

    // Advertised to the gateway, and named when a session needs it.
    let (_, agent) = admin.get("/agents/default").await;
    let method = &agent["authMethods"][0];
    assert_eq!(
        (&method["type"], &method["id"]),
        (&json!("terminal"), &json!("echo-login")),
        "{agent}"
    );
    let (status, problem) = new_session(gw).await;
    assert_eq!(status, 503, "{problem}");
    assert_eq!(problem["authMethods"], json!(["echo-login"]), "{problem}");
    let body = json!({"methodId": "echo-login"});
    let (status, problem) = admin.post("/agents/default/authenticate", body).await;
    assert_eq!(
        status, 409,
        "a terminal login is not an ACP call: {problem}"
    );

    // This agent does not advertise ACP logout: it is not called.
    let (status, problem) = admin.post("/agents/default/logout", json!({})).await;
    assert_eq!(status, 501, "{problem}");

    // Only an admin, only over a WebSocket, only a terminal method the agent offers.
    assert_eq!(open(gw, ANN, "echo-login").await.err(), Some(403));
    let as_a_browser = |key: &str| format!("methodId=echo-login&access_token={key}");
    assert_eq!(connect(gw, None, &as_a_browser(ANN)).await.err(), Some(403));
    assert_eq!(
        connect(gw, None, "methodId=echo-login").await.err(),
        Some(401)
    );
    assert_eq!(open(gw, ADMIN, "nope").await.err(), Some(422));
    let (status, problem) = admin.get("/agents/default/login?methodId=echo-login").await;
    assert_eq!(status, 400, "{problem}");

    // A wrong token: the login says so and exits 1; the agent is still not signed in.
    let mut socket = open(gw, ADMIN, "echo-login").await.unwrap();
    let mut shown = String::new();
    screen_until(&mut socket, &mut shown, "paste the token here").await;
    assert!(shown.contains("WXYZ-1234"), "{shown}");
    socket
        .send(Message::Text(json!({"keys": "wrong\r"}).to_string().into()))
        .await
        .unwrap();
    screen_until(&mut socket, &mut shown, "not valid").await;
    assert_eq!(exit_code(&mut socket).await, 1);
    assert_eq!(new_session(gw).await.0, 503);

    // A client that goes away ends its login.
    let mut socket = open(gw, ADMIN, "echo-login").await.unwrap();
    screen_until(&mut socket, &mut String::new(), "paste the token here").await;
    drop(socket);
    let log = w.dir().join("gateway.log");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        if said
            .lines()
            .filter(|l| l.contains("terminal login ended"))
            .any(|l| l.contains("code=None"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "the abandoned login did not end");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The right token, typed as keys, in a login opened as a browser does: signed in, and the
    // agent's members start again so.
    let mut socket = connect(gw, None, &as_a_browser(ADMIN)).await.unwrap();
    let mut shown = String::new();
    screen_until(&mut socket, &mut shown, "paste the token here").await;
    socket
        .send(Message::Binary(b"token-ok\r".to_vec().into()))
        .await
        .unwrap();
    screen_until(&mut socket, &mut shown, "Signed in.").await;
    assert_eq!(exit_code(&mut socket).await, 0);
    gw.wait_until(|g| async move { new_session(g).await.0 == 201 })
        .await;
    w.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_logs_an_agent_out_and_it_stays_out() {
    let opts = keyed(
        Options::default()
            .env("ECHO_AGENT_AUTH", "echo-auth")
            .env("ECHO_AGENT_CAPS", "load,list,delete,resume,close,logout"),
    );
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let admin = gw.with_key(Some(ADMIN));
    assert_eq!(new_session(gw).await.0, 503);
    let body = json!({"methodId": "echo-auth"});
    let (status, signed) = admin.post("/agents/default/authenticate", body).await;
    assert_eq!(status, 200, "{signed}");
    assert_eq!(new_session(gw).await.0, 201);

    let tenant = gw.with_key(Some(ANN));
    let (status, problem) = tenant.post("/agents/default/logout", json!({})).await;
    assert_eq!(status, 403, "{problem}");
    let (status, body) = admin.post("/agents/default/logout", json!({})).await;
    assert_eq!(status, 204, "{body}");
    let (status, problem) = new_session(gw).await;
    assert_eq!(status, 503, "logged out: {problem}");
    assert_eq!(problem["authMethods"], json!(["echo-auth"]), "{problem}");

    // A member that starts again does not sign itself back in with the method of before.
    let pid = first_member(gw).await["pid"].clone();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid.as_i64().unwrap() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    gw.wait_until(|g| {
        let pid = pid.clone();
        async move {
            let now = first_member(g).await;
            now["state"] == "ready" && now["pid"] != pid
        }
    })
    .await;
    let (status, problem) = new_session(gw).await;
    assert_eq!(status, 503, "a new member stays logged out: {problem}");
    w.finish().await;
}
