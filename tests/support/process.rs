//! What Linux's `/proc` says about a process (alive, its environment, memory, CPU time),
//! pinning one to cores, and where a server the tests spawn listens: the tests check that no
//! process outlives the gateway, the benches measure and place them.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStdout;

use super::PATIENCE;

/// The address a server (`who`: the gateway, the webhook receiver) prints as its first line,
/// `listening on ADDR`, waited for within [`PATIENCE`]; the rest of its stdout is drained from
/// then on, so that it never blocks on it.
pub async fn listening_on(stdout: ChildStdout, who: &str) -> String {
    listening_or_ended(stdout, who)
        .await
        .unwrap_or_else(|| panic!("{who} printed nothing (see its stderr)"))
}

/// As [`listening_on`], or `None` when the server's stdout ends before it says where it
/// listens (it exited: its stderr says why).
pub async fn listening_or_ended(stdout: ChildStdout, who: &str) -> Option<String> {
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("{who} says where it listens within PATIENCE"))
        .unwrap()?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let address = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("not a listening line from {who}: {first:?}"));
    Some(address.to_owned())
}

/// True if a process with this pid is running (a zombie waiting for a reaper is not).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Pids of live processes whose environment contains `needle` (e.g. a test's unique agent
/// directory): every process a test's gateway started, children and grandchildren alike.
pub fn processes_with_env(needle: &str) -> Vec<u32> {
    let mut out = vec![];
    for (pid, dir) in processes() {
        let Ok(env) = std::fs::read(dir.join("environ")) else {
            continue;
        };
        if pid_alive(pid) && String::from_utf8_lossy(&env).contains(needle) {
            out.push(pid);
        }
    }
    out
}

/// Every process's pid and `/proc` directory.
fn processes() -> impl Iterator<Item = (u32, std::path::PathBuf)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| Some((entry.file_name().to_str()?.parse().ok()?, entry.path())))
}

/// Resident set size of a process, in KiB (`VmRSS` of `/proc/PID/status`).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The time a process's live threads have run so far, to the nanosecond (the sum of
/// `/proc/PID/task/*/schedstat`), where [`cpu_time`] counts 10 ms ticks: for windows too short
/// for ticks, in which no thread that ran ends.
pub fn run_time(pid: u32) -> Duration {
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process runs");
    threads
        .filter_map(|t| schedstat_run_time(&t.ok()?.path().join("schedstat")))
        .sum()
}

/// The time the calling thread has run so far, to the nanosecond.
pub fn thread_run_time() -> Duration {
    schedstat_run_time(Path::new("/proc/thread-self/schedstat")).expect("a schedstat")
}

/// The first field of a `schedstat` file: time on a CPU.
fn schedstat_run_time(path: &Path) -> Option<Duration> {
    let stat = std::fs::read_to_string(path).ok()?;
    Some(Duration::from_nanos(
        stat.split_whitespace().next()?.parse().ok()?,
    ))
}

/// CPU time (user + system) a process has used so far.
pub fn cpu_time(pid: u32) -> Duration {
    cpu_time_if_running(pid).unwrap_or_else(|| panic!("no CPU time for pid {pid}"))
}

/// As [`cpu_time`], or `None` when the process has gone (or is no process).
pub fn cpu_time_if_running(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may contain spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // In clock ticks: USER_HZ, which Linux fixes at 100 for this interface.
    Some(Duration::from_millis(ticks * 10))
}

/// Pins every thread of `pid` to `cpus` (a taskset list such as "0" or "0-1").
pub fn pin(pid: u32, cpus: &str) {
    let status = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("taskset (util-linux) runs");
    assert!(status.success(), "taskset pins pid {pid} to {cpus}");
}

/// The number of cores this process may use (0 when unknown).
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0)
}

/// Pid and command name (`comm`) of each live child of `pid`.
pub fn children(pid: u32) -> Vec<(u32, String)> {
    let mut out = vec![];
    for (child, dir) in processes() {
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; the name may contain spaces and parentheses.
        let (Some((_, rest)), Some(open), Some(close)) =
            (stat.rsplit_once(')'), stat.find('('), stat.rfind(')'))
        else {
            continue;
        };
        let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        if ppid == Some(pid) && pid_alive(child) {
            out.push((child, stat[open + 1..close].to_owned()));
        }
    }
    out
}

/// The TCP port `pid` listens on (the first, IPv4 or IPv6), found through its sockets in
/// `/proc`: for a server told to listen on port 0 that does not say which port it got.
pub fn listening_port(pid: u32) -> Option<u16> {
    let sockets: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    ["tcp", "tcp6"].into_iter().find_map(|table| {
        let table = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).ok()?;
        // `sl local_address rem_address st … uid timeout inode …`, addresses as HEX:PORT;
        // state 0A is LISTEN.
        table.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let listening = fields.get(3) == Some(&"0A");
            let ours = fields
                .get(9)
                .is_some_and(|inode| sockets.iter().any(|s| s == inode));
            if !(listening && ours) {
                return None;
            }
            u16::from_str_radix(fields[1].rsplit_once(':')?.1, 16).ok()
        })
    })
}
