//! What a wave costs the machines behind it: a server process's CPU time
//! and Redis's own accounting, each read before and after.
//!
//! A process's CPU time comes from `/proc/PID/stat` (user + system, in
//! clock ticks of 10 ms) and, where the kernel shows it, from each thread's
//! `/proc/PID/task/TID/sched` (`se.sum_exec_runtime`, to the nanosecond),
//! which a wave of a few hundred milliseconds needs. Redis is asked with
//! `INFO`: its process CPU (`used_cpu_user` + `used_cpu_sys`, and the main
//! thread's, which is the one core that runs every command) and
//! `commandstats` (calls and microseconds per command). Commands a script
//! runs are counted there too, and their time is inside their script's as
//! well, so "Redis time" here is the time of what clients sent that does
//! the work: script calls and change-log reads. The command count keeps
//! the commands inside scripts (it is what Redis executed); the tool's own
//! `INFO` is left out of both.

use std::collections::BTreeMap;

use serde::Serialize;

/// A process's CPU time so far, in microseconds: the precise per-thread
/// sum when available, and the `/proc/PID/stat` figure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ProcessCpu {
    pub precise_us: Option<f64>,
    pub stat_us: Option<f64>,
}

impl ProcessCpu {
    pub fn read(pid: u32) -> Self {
        Self {
            precise_us: threads_runtime_us(pid),
            stat_us: stat_cpu_us(pid),
        }
    }

    /// The CPU time spent between two readings, the precise one if both
    /// have it.
    pub fn since(&self, before: &Self) -> Option<f64> {
        let stat = self
            .stat_us
            .zip(before.stat_us)
            .map(|(after, before)| after - before);
        match (self.precise_us, before.precise_us) {
            (Some(a), Some(b)) => {
                let precise = a - b;
                // The per-thread sum loses the time of threads that ended
                // between the readings (a runtime's blocking threads, a
                // test process's other tests); `stat` keeps it, to a tick.
                match stat {
                    Some(s) if precise < 0.0 || precise < s - 2.0 * TICK_US => Some(s),
                    _ => Some(precise),
                }
            }
            _ => stat,
        }
    }

    /// Several processes' CPU together.
    pub fn sum(all: impl IntoIterator<Item = Self>) -> Self {
        all.into_iter().fold(
            Self {
                precise_us: Some(0.0),
                stat_us: Some(0.0),
            },
            |acc, p| Self {
                precise_us: acc.precise_us.zip(p.precise_us).map(|(a, b)| a + b),
                stat_us: acc.stat_us.zip(p.stat_us).map(|(a, b)| a + b),
            },
        )
    }
}

/// `utime + stime` of `/proc/PID/stat`, in microseconds.
fn stat_cpu_us(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_ticks(&stat).map(|ticks| ticks as f64 * 1e6 / USER_HZ)
}

/// The unit of `stat` times: Linux's USER_HZ, 100 on every architecture
/// this runs on.
const USER_HZ: f64 = 100.0;
/// One clock tick of `stat`, in microseconds.
const TICK_US: f64 = 1e6 / USER_HZ;

/// `utime + stime` (fields 14 and 15) of a `stat` line; the command name
/// (field 2) may hold spaces and parentheses, so fields count from its end.
fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The sum over the process's threads of `se.sum_exec_runtime` (ms, with
/// ns digits), in microseconds; `None` without the scheduler's debug files.
fn threads_runtime_us(pid: u32) -> Option<f64> {
    let mut total_ms = 0.0;
    let mut found = false;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(task) = task else { continue };
        let Ok(sched) = std::fs::read_to_string(task.path().join("sched")) else {
            continue;
        };
        if let Some(ms) = parse_sched_runtime_ms(&sched) {
            total_ms += ms;
            found = true;
        }
    }
    found.then_some(total_ms * 1000.0)
}

fn parse_sched_runtime_ms(sched: &str) -> Option<f64> {
    sched
        .lines()
        .find(|l| l.trim_start().starts_with("se.sum_exec_runtime"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()
}

/// Redis's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RedisStats {
    /// The process's user + system CPU, in microseconds.
    pub cpu_us: f64,
    /// The main thread's user + system CPU (Redis 6.2 and later).
    pub main_cpu_us: Option<f64>,
    /// Per command: calls and microseconds.
    pub commands: BTreeMap<String, (u64, u64)>,
}

/// What Redis did between two readings.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RedisCost {
    pub cpu_ms: f64,
    /// The main thread's CPU, when Redis reports it.
    pub main_cpu_ms: Option<f64>,
    /// Every command run, those run inside scripts included (the tool's own
    /// `INFO` left out).
    pub calls: u64,
    /// Script calls, log appends and log reads: what clients sent as
    /// commands that do work (the rest are their insides, or bookkeeping).
    pub evalsha: u64,
    pub xadd: u64,
    pub xread: u64,
    /// Microseconds Redis spent in those script calls, appends and reads
    /// (`commandstats`; a script's time includes the commands it ran).
    pub time_us: u64,
    /// Microseconds of every command summed, the commands inside scripts
    /// counted a second time.
    pub usec_all: u64,
    /// Calls per command, those that ran at all.
    pub by_command: BTreeMap<String, u64>,
}

/// Commands whose time holds the work a client asked for: scripts (their
/// inner commands' time included), appends to a log and reads of one.
/// (An `XADD` run by a script is counted again, as scripts run none in
/// the deployments measured here.)
fn is_work(name: &str) -> bool {
    matches!(
        name,
        "evalsha" | "eval" | "evalsha_ro" | "eval_ro" | "fcall" | "fcall_ro"
    ) || is_log_read(name)
        || name == "xadd"
}

fn is_log_read(name: &str) -> bool {
    matches!(name, "xread" | "xreadgroup")
}

/// The probe's own commands, not the measured servers'.
fn is_probe(name: &str) -> bool {
    name == "info"
}

impl RedisStats {
    /// Parse `INFO cpu` and `INFO commandstats` output (together or not).
    pub fn parse(info: &str) -> Self {
        let mut s = Self::default();
        for line in info.lines() {
            let line = line.trim();
            if let Some(v) = line
                .strip_prefix("used_cpu_user_main_thread:")
                .or_else(|| line.strip_prefix("used_cpu_sys_main_thread:"))
            {
                *s.main_cpu_us.get_or_insert(0.0) += v.parse::<f64>().unwrap_or(0.0) * 1e6;
            } else if let Some(v) = line
                .strip_prefix("used_cpu_user:")
                .or_else(|| line.strip_prefix("used_cpu_sys:"))
            {
                s.cpu_us += v.parse::<f64>().unwrap_or(0.0) * 1e6;
            } else if let Some(rest) = line.strip_prefix("cmdstat_") {
                let Some((name, fields)) = rest.split_once(':') else {
                    continue;
                };
                let field = |k: &str| -> u64 {
                    fields
                        .split(',')
                        .find_map(|f| f.strip_prefix(k)?.strip_prefix('='))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0)
                };
                s.commands
                    .insert(name.to_owned(), (field("calls"), field("usec")));
            }
        }
        s
    }

    pub fn since(&self, before: &Self) -> RedisCost {
        let mut cost = RedisCost {
            cpu_ms: (self.cpu_us - before.cpu_us) / 1000.0,
            main_cpu_ms: match (self.main_cpu_us, before.main_cpu_us) {
                (Some(a), Some(b)) => Some((a - b) / 1000.0),
                _ => None,
            },
            ..RedisCost::default()
        };
        for (name, &(calls, usec)) in &self.commands {
            if is_probe(name) {
                continue;
            }
            let (was_calls, was_usec) = before.commands.get(name).copied().unwrap_or((0, 0));
            let delta = calls.saturating_sub(was_calls);
            if delta == 0 {
                continue;
            }
            let delta_us = usec.saturating_sub(was_usec);
            cost.calls += delta;
            cost.usec_all += delta_us;
            if is_work(name) {
                cost.time_us += delta_us;
                if is_log_read(name) {
                    cost.xread += delta;
                } else if name == "xadd" {
                    cost.xadd += delta;
                } else {
                    cost.evalsha += delta;
                }
            }
            cost.by_command.insert(name.clone(), delta);
        }
        cost
    }
}

/// A cost spread over `n` things (joins, changes, instances), and with the
/// background taken out: what Redis did while nothing was measured, scaled
/// to the same length of time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PerUnit {
    pub time_us: f64,
    pub calls: f64,
    pub evalsha: f64,
    pub xadd: f64,
    pub xread: f64,
    pub cpu_us: f64,
    pub main_cpu_us: Option<f64>,
}

impl RedisCost {
    /// This cost less `idle` scaled by `scale` (e.g. the wave's length
    /// over the idle sample's), divided by `n`; never below zero.
    pub fn per_unit(&self, idle: Option<&RedisCost>, scale: f64, n: f64) -> PerUnit {
        let zero = RedisCost::default();
        let idle = idle.unwrap_or(&zero);
        let net = |a: f64, b: f64| ((a - b * scale).max(0.0)) / n.max(1e-9);
        PerUnit {
            time_us: net(self.time_us as f64, idle.time_us as f64),
            calls: net(self.calls as f64, idle.calls as f64),
            evalsha: net(self.evalsha as f64, idle.evalsha as f64),
            xadd: net(self.xadd as f64, idle.xadd as f64),
            xread: net(self.xread as f64, idle.xread as f64),
            cpu_us: net(self.cpu_ms * 1000.0, idle.cpu_ms * 1000.0),
            main_cpu_us: match (self.main_cpu_ms, idle.main_cpu_ms) {
                (Some(a), Some(b)) => Some(net(a * 1000.0, b * 1000.0)),
                (Some(a), None) => Some(net(a * 1000.0, 0.0)),
                _ => None,
            },
        }
    }
}

/// Read Redis's counters (a connection of its own, loopback only).
pub async fn redis_stats(url: &str) -> anyhow::Result<RedisStats> {
    let client = redis::Client::open(url)?;
    let mut con = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .arg("commandstats")
        .query_async(&mut con)
        .await?;
    Ok(RedisStats::parse(&info))
}

/// A Redis URL this tool may talk to: `redis://` on a loopback address.
pub fn parse_redis_url(s: &str) -> Result<String, String> {
    let rest = s
        .strip_prefix("redis://")
        .ok_or_else(|| format!("{s:?}: give a redis:// URL"))?;
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let host = host.split(['/', '?']).next().unwrap_or("");
    let addr: std::net::SocketAddr = host
        .parse()
        .map_err(|_| format!("{s:?}: give the address as IP:port"))?;
    if !addr.ip().is_loopback() {
        return Err(format!("{s:?}: the tool only talks to this machine"));
    }
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_since_keeps_the_time_of_threads_that_ended_between_readings() {
        let cpu = |precise: f64, stat: f64| ProcessCpu {
            precise_us: Some(precise),
            stat_us: Some(stat),
        };
        // Threads came and went: the live threads' sum shrank, the
        // process's total grew by 80 ms.
        let spent = cpu(50_000.0, 180_000.0).since(&cpu(100_000.0, 100_000.0));
        assert_eq!(spent, Some(80_000.0));
        // Nothing ended: the precise figure, finer than a tick.
        let spent = cpu(103_500.0, 100_000.0).since(&cpu(100_000.0, 100_000.0));
        assert_eq!(spent, Some(3_500.0));
        let both = ProcessCpu::sum([cpu(1.0, 2.0), cpu(3.0, 4.0)]);
        assert_eq!(both, cpu(4.0, 6.0));
    }

    #[test]
    fn stat_times_count_from_the_end_of_the_name() {
        let stat =
            "1234 (narabu (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 5 0";
        assert_eq!(parse_stat_ticks(stat), Some(325));
        assert_eq!(parse_stat_ticks("garbage"), None);
        let sched = "narabu (1234, #threads: 9)\n---\nse.exec_start  :  1.0\nse.sum_exec_runtime                          :          1523.456789\n";
        assert_eq!(parse_sched_runtime_ms(sched), Some(1523.456789));
    }

    #[test]
    fn redis_counters_are_read_and_subtracted() {
        let before = RedisStats::parse(
            "# CPU\r\nused_cpu_sys:1.000000\r\nused_cpu_user:2.500000\r\n# Commandstats\r\ncmdstat_evalsha:calls=10,usec=500,usec_per_call=50.00,rejected_calls=0,failed_calls=0\r\ncmdstat_xadd:calls=4,usec=8,usec_per_call=2.00\r\n",
        );
        assert_eq!(before.cpu_us, 3_500_000.0);
        let after = RedisStats::parse(
            "used_cpu_sys:1.001000\nused_cpu_user:2.503000\ncmdstat_evalsha:calls=12,usec=600\ncmdstat_xadd:calls=4,usec=8\ncmdstat_xread:calls=3,usec=30\n",
        );
        let cost = after.since(&before);
        assert!((cost.cpu_ms - 4.0).abs() < 1e-6);
        assert_eq!((cost.calls, cost.evalsha, cost.xread), (5, 2, 3));
        assert_eq!(cost.by_command.len(), 2, "unchanged commands are left out");
        // The scripts' 100 µs and the log reads' 30 µs.
        assert_eq!((cost.time_us, cost.usec_all), (130, 130));
        assert_eq!(cost.main_cpu_ms, None);
    }

    #[test]
    fn commands_inside_scripts_count_as_calls_but_not_twice_as_time() {
        let before = RedisStats::parse(
            "used_cpu_sys:0.0\nused_cpu_user:0.0\nused_cpu_sys_main_thread:0.5\nused_cpu_user_main_thread:0.5\ncmdstat_info:calls=3,usec=60\n",
        );
        assert_eq!(before.main_cpu_us, Some(1_000_000.0));
        let after = RedisStats::parse(
            "used_cpu_sys:0.0\nused_cpu_user:0.0\nused_cpu_sys_main_thread:0.5\nused_cpu_user_main_thread:0.502\ncmdstat_info:calls=4,usec=80\ncmdstat_evalsha:calls=10,usec=400\ncmdstat_hset:calls=20,usec=40\ncmdstat_zadd:calls=10,usec=30\n",
        );
        let cost = after.since(&before);
        assert_eq!(
            cost.calls, 40,
            "inner commands counted, the probe's INFO not"
        );
        assert_eq!(cost.time_us, 400, "inner time is inside the script's");
        assert_eq!(cost.usec_all, 470);
        assert!((cost.main_cpu_ms.unwrap() - 2.0).abs() < 1e-6);
        // Ten joins: 40 µs and 4 commands each.
        let per = cost.per_unit(None, 1.0, 10.0);
        assert_eq!((per.time_us, per.calls, per.evalsha), (40.0, 4.0, 1.0));
        // With a background of 100 µs and 8 calls per second, over half a
        // second of wave: 350 µs and 36 calls remain.
        let idle = RedisCost {
            time_us: 100,
            calls: 8,
            ..RedisCost::default()
        };
        let per = cost.per_unit(Some(&idle), 0.5, 1.0);
        assert_eq!((per.time_us, per.calls), (350.0, 36.0));
        // Never below zero.
        assert_eq!(cost.per_unit(Some(&idle), 100.0, 1.0).time_us, 0.0);
    }

    #[test]
    fn only_loopback_redis() {
        assert!(parse_redis_url("redis://127.0.0.1:6390").is_ok());
        assert!(parse_redis_url("redis://:pw@127.0.0.1:6390/0").is_ok());
        assert!(parse_redis_url("redis://10.0.0.1:6379").is_err());
        assert!(parse_redis_url("http://127.0.0.1:6379").is_err());
    }
}
