//! Resource usage of this process, read from the kernel, for summaries and
//! the benchmark.

use std::time::Duration;

/// CPU time (user + system) this process has used so far.
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Opts this process out of transparent huge pages. A rebuild allocates
/// and frees many short-lived buffers; with THP set to `always`, each fresh
/// region costs a 2 MiB page to zero, which profiles showed as a fifth of
/// a rebuild's CPU. Harmless where THP is off.
pub fn disable_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// Raises the soft open-file limit to the hard one, so the HTTP
/// connection limit, not the descriptor table, decides how many clients
/// `serve` holds. Leaves the limit alone when it cannot be read.
pub fn raise_open_file_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Peak resident set size in bytes (VmHWM), when the kernel says.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_usage() {
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        assert!(super::cpu_time() > std::time::Duration::ZERO);
        assert!(super::peak_rss().unwrap_or(0) > 0);
    }
}
