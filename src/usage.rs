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

/// CPU time (user + system) every running process whose command name is
/// `comm` has used so far, summed (`/proc/*/stat`): the benchmark's view of
/// the servers beside it (`redis-server`, `secantusd-rs`), each instance
/// and replica included. Processes that exit meanwhile are not counted.
pub fn cpu_time_of(comm: &str) -> Duration {
    // SAFETY: sysconf takes a plain integer name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let Ok(dir) = std::fs::read_dir("/proc") else { return Duration::ZERO };
    let ticks: u64 = dir
        .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path().join("stat")).ok())
        .filter_map(|stat| stat_ticks(&stat, comm))
        .sum();
    Duration::from_secs_f64(ticks as f64 / hz)
}

/// `utime + stime` of one `/proc/PID/stat` line when its command is
/// `comm`. The command sits in parentheses and may hold spaces or
/// parentheses itself, so the fields are counted from the last `)`.
fn stat_ticks(stat: &str, comm: &str) -> Option<u64> {
    let (head, rest) = stat.rsplit_once(')')?;
    if head.split_once('(')?.1 != comm {
        return None;
    }
    // After the command: state (field 3), ..., utime (14), stime (15).
    let mut fields = rest.split_whitespace().skip(11);
    Some(fields.next()?.parse::<u64>().ok()? + fields.next()?.parse::<u64>().ok()?)
}

/// CPU time the calling thread has used so far: what a piece of work run
/// in place on it costs, whatever the other threads do meanwhile.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes into the struct we pass.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The CPU time the global rayon pool's threads have used so far, each
/// asked on itself.
pub fn pool_cpu_time() -> Duration {
    rayon::broadcast(|_| thread_cpu_time()).into_iter().sum()
}

/// The allocator settings a process starts with: transparent huge pages
/// off (unless `CACHEWRIGHT_THP` is set), and for a long-running watcher
/// (`watch`, `serve`) freed memory returned at once. `cachewright-dev
/// bench` starts the same way as what it measures, so its watcher figures
/// are the product's (without this its watcher zeroed a 2 MiB page for
/// each fresh region: a seventh of a 2M drain's profile, though no
/// change in speed showed through the benchmark's spread).
pub fn configure_process(long_running: bool) {
    if std::env::var_os("CACHEWRIGHT_THP").is_none() {
        disable_transparent_huge_pages();
    }
    if long_running {
        return_freed_memory_promptly();
    }
}

/// Opts this process out of transparent huge pages. A rebuild allocates
/// and frees many short-lived buffers; with THP set to `always`, each fresh
/// region costs a 2 MiB page to zero, which profiles showed as a fifth of
/// a rebuild's CPU. Harmless where THP is off.
fn disable_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// mimalloc's `mi_option_purge_delay` (`mi_option_e` in `mimalloc.h`; the
/// Rust binding names no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Makes the allocator give freed memory back to the system at once
/// instead of after its default delay (a second in mimalloc 3, ten for
/// whole arenas; unless `MIMALLOC_PURGE_DELAY` says
/// otherwise). For the long-running commands: the watcher's load and a
/// scheduled job free what they read, and returned promptly it no longer
/// stays resident beside the compact state (about 15 MiB of a watcher's
/// 127 MiB at 500K videos). A one-shot rebuild keeps the default: purging
/// at once costs it about 8% more CPU in fresh pages.
fn return_freed_memory_promptly() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: mi_option_set takes an option index and a value; an index
    // out of range is ignored by mimalloc.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
}

/// Gives back to the system what the calling thread and every rayon
/// worker freed and still keep in their allocator pages. A worker that
/// goes idle after a burst (the watcher's load decodes on them) keeps its
/// free pages committed until it allocates again; the watcher's load
/// calls this once at its end.
pub fn collect_freed_memory() {
    // SAFETY: mi_collect only walks the calling thread's own heap.
    let collect = || unsafe { libmimalloc_sys::mi_collect(true) };
    rayon::broadcast(|_| collect());
    collect();
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
        assert!(super::thread_cpu_time() > std::time::Duration::ZERO);
        // `/proc` counts CPU in clock ticks (10 ms here): spin until this
        // process has used several, so a fresh test process cannot read 0.
        while super::cpu_time() < std::time::Duration::from_millis(50) {
            x = x.wrapping_add(x.rotate_left(7));
        }
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
        assert!(super::cpu_time_of(comm.trim()) > std::time::Duration::ZERO, "this process is among {comm:?} ({x})");
        assert_eq!(super::cpu_time_of("no such command"), std::time::Duration::ZERO);
    }

    /// The fields are counted from the command's last parenthesis, so a
    /// command holding one does not shift them.
    #[test]
    fn stat_lines_are_read_past_the_command() {
        let line = "42 (a) b) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0";
        assert_eq!(super::stat_ticks(line, "a) b"), Some(300));
        assert_eq!(super::stat_ticks(line, "a"), None);
    }

    /// The index names the purge delay in the linked mimalloc: its default
    /// reads back (1000 ms in mimalloc 3, 10 ms in 2), and the setting
    /// takes.
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        let get = || unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert!([10, 1000].contains(&get()), "mimalloc's default purge delay, not {}", get());
        super::return_freed_memory_promptly();
        assert_eq!(get(), 0);
    }
}
