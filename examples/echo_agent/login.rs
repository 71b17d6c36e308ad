//! The echo agent's terminal login (`echo_agent --login`, what its `ECHO_AGENT_TERMINAL_AUTH`
//! method runs): it needs a terminal, shows a device code, asks for the token, and with
//! `token-ok` writes the credentials file that lets sessions start (exit 0); any other token
//! exits 1, no terminal exits 2.

use std::io::{self, BufRead as _, IsTerminal as _, Write as _};
use std::path::Path;

/// Runs the login; its exit code.
pub(super) fn run(credentials: &Path) -> i32 {
    let mut out = io::stdout();
    if !io::stdin().is_terminal() {
        let _ = writeln!(out, "echo-agent login: not a terminal");
        return 2;
    }
    let _ = write!(
        out,
        "To sign in, open https://login.example.invalid/device and enter WXYZ-1234\r\nThen paste the token here: "
    );
    let _ = out.flush();
    let mut token = String::new();
    if io::stdin().lock().read_line(&mut token).is_err() {
        return 1;
    }
    if token.trim() != "token-ok" {
        let _ = write!(out, "That token is not valid.\r\n");
        return 1;
    }
    if let Some(dir) = credentials.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if std::fs::write(credentials, "signed in\n").is_err() {
        let _ = write!(out, "Cannot save the credentials.\r\n");
        return 1;
    }
    let _ = write!(out, "Signed in.\r\n");
    0
}
