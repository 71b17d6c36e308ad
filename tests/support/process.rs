//! What Linux's `/proc` says about a process (alive, its environment, memory, CPU time), and
//! pinning one to cores: the tests check that no process outlives the gateway, the benches
//! measure and place them.

use std::process::Stdio;
use std::time::Duration;

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
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if pid_alive(pid) && String::from_utf8_lossy(&env).contains(needle) {
            out.push(pid);
        }
    }
    out
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

/// CPU time (user + system) a process has used so far.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which is in parentheses and may contain spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // In clock ticks: USER_HZ, which Linux fixes at 100 for this interface.
    Duration::from_millis(ticks * 10)
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
