//! How the benches write their figures (durations in ms and µs, a p50 / p99 pair) and read
//! their settings (an environment variable or its default; the machine's load average).

use std::time::Duration;

use super::percentile;

/// A duration in ms (two decimals below 10 ms).
pub fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

/// `total` over `per` in µs ("—" for none).
pub fn us(total: Duration, per: usize) -> String {
    if per == 0 {
        return "—".into();
    }
    format!("{:.1} µs", total.as_secs_f64() * 1e6 / per as f64)
}

/// The p50 / p99 of `sorted` ("—" for none).
pub fn pair(sorted: &[Duration]) -> String {
    if sorted.is_empty() {
        return "—".into();
    }
    format!(
        "{} / {}",
        ms(percentile(sorted, 0.5)),
        ms(percentile(sorted, 0.99))
    )
}

/// Environment variable `name`, parsed (panics when it does not parse), else `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v} is not valid"))
        })
        .unwrap_or(default)
}

/// The one-minute load average (`/proc/loadavg`).
pub fn load_average() -> String {
    let avg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    avg.split_whitespace().next().unwrap_or("?").to_owned()
}
