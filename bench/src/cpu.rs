//! What the kernel says about a process: CPU time (utime + stime of all
//! its threads, from `/proc/PID/stat`) and resident memory (`VmRSS`).

use std::fs;

/// Clock ticks per second of the `/proc` CPU counters.
pub fn ticks_per_s() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of a process in ticks, from the text of its stat file.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    // The command name may hold spaces and parentheses: fields are counted
    // after the last ')'. utime and stime are fields 14 and 15 of the line,
    // i.e. the 12th and 13th after the name.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

/// CPU seconds a process has used so far (all threads), or None if it is gone.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(parse_stat_ticks(&s)? as f64 / ticks_per_s())
}

/// CPU seconds of several processes together (a cluster's nodes).
pub fn cpu_secs_sum(pids: &[u32]) -> Option<f64> {
    pids.iter().map(|&p| cpu_secs(p)).sum()
}

/// CPU seconds this process has used.
pub fn own_cpu_secs() -> f64 {
    cpu_secs(std::process::id()).unwrap_or(0.0)
}

/// The host's (busy, total) CPU time in ticks over all CPUs, from the
/// first line of /proc/stat (idle and iowait count as not busy).
pub fn host_ticks() -> Option<(u64, u64)> {
    let s = fs::read_to_string("/proc/stat").ok()?;
    parse_host_ticks(s.lines().next()?)
}

pub fn parse_host_ticks(line: &str) -> Option<(u64, u64)> {
    let mut f = line.split_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is
    // already inside user).
    let v: Vec<u64> = f.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let total: u64 = v.iter().sum();
    let idle = v.get(3)? + v.get(4)?;
    Some((total - idle, total))
}

/// Resident memory of a process in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resident memory of several processes together.
pub fn rss_sum(pids: &[u32]) -> Option<u64> {
    pids.iter().map(|&p| rss_bytes(p)).sum()
}

/// The bytes a process has sent to storage: `write_bytes` less
/// `cancelled_write_bytes` of `/proc/PID/io` (readable for one's own
/// processes; root reads any).
pub fn written_bytes(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    let field = |name: &str| -> Option<u64> {
        s.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))?
            .trim()
            .parse()
            .ok()
    };
    Some(field("write_bytes")?.saturating_sub(field("cancelled_write_bytes")?))
}

/// Bytes several processes have sent to storage, together.
pub fn written_sum(pids: &[u32]) -> Option<u64> {
    pids.iter().map(|&p| written_bytes(p)).sum()
}

/// Puts the thread `tid` (0: the calling thread) on the given CPUs.
pub fn pin(tid: i32, cpus: &[usize]) -> bool {
    // SAFETY: cpu_set_t is plain data; the calls only read it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Puts every thread of process `pid` on the given CPUs.
pub fn pin_process(pid: u32, cpus: &[usize]) {
    if let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) {
        for e in dir.flatten() {
            if let Some(tid) = e.file_name().to_str().and_then(|t| t.parse().ok()) {
                pin(tid, cpus);
            }
        }
    }
}

/// All CPUs of the host.
pub fn all_cpus() -> Vec<usize> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..n.max(1)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_an_odd_name() {
        let line = "4242 (we (ird) name) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    731 96 0 0 20 0 3 0 5000 10000000 2000 rest";
        assert_eq!(parse_stat_ticks(line), Some(827));
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

    #[test]
    fn host_busy_time() {
        let line = "cpu  100 5 50 800 40 3 2 0 0 0";
        assert_eq!(parse_host_ticks(line), Some((160, 1000)));
        assert_eq!(parse_host_ticks("cpu0 1 2 3 4 5 6 7 8"), None);
        assert!(host_ticks().is_some());
    }

    #[test]
    fn own_process_is_readable() {
        assert!(cpu_secs(std::process::id()).is_some());
        assert!(rss_bytes(std::process::id()).unwrap() > 0);
    }
}
