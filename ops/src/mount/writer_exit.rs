//! Whether the process closing a file is ending because a signal killed it. The kernel closes the
//! files of a process killed by `kill -9` like those of one that called `close`, so without this
//! a killed writer would publish the half it had written. `/proc/<pid>/stat` tells: an exiting task
//! has `PF_EXITING` in its flags, and its exit code names the signal that killed it.

/// `PF_EXITING` of `include/linux/sched.h`.
const PF_EXITING: u64 = 0x4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closer {
    /// Running, or ending normally (`exit`, or the end of `main`): its close publishes.
    Alive,
    /// Ending because signal `n` killed it: nothing it wrote is published.
    Killed(i32),
    /// Gone already: whether it ended well cannot be known, so nothing is published.
    Gone,
}

/// The thread group (process) of the task `tid`, as the kernel reports tasks in FUSE requests.
pub fn tgid_of(tid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Tgid:").and_then(|v| v.trim().parse().ok())))
        .unwrap_or(tid)
}

pub fn closer(tid: u32) -> Closer {
    match std::fs::read_to_string(format!("/proc/{tid}/stat")) {
        Ok(stat) => parse_stat(&stat),
        Err(_) => Closer::Gone,
    }
}

/// Reads `/proc/<pid>/stat`: fields after the command (which is in parentheses and may hold
/// anything, so the text is cut at its last `)`): state is field 3, flags field 9, exit code 52.
fn parse_stat(stat: &str) -> Closer {
    let Some((_, rest)) = stat.rsplit_once(')') else { return Closer::Alive };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).copied();
    if field(3) == Some("Z") || field(3) == Some("X") {
        return exit_signal(field(52)).map_or(Closer::Gone, Closer::Killed);
    }
    let flags: u64 = field(9).and_then(|f| f.parse().ok()).unwrap_or(0);
    if flags & PF_EXITING == 0 {
        return Closer::Alive;
    }
    exit_signal(field(52)).map_or(Closer::Alive, Closer::Killed)
}

/// The killing signal in a wait status (its low 7 bits), if any.
fn exit_signal(code: Option<&str>) -> Option<i32> {
    let code: i32 = code?.parse().ok()?;
    let sig = code & 0x7f;
    (sig != 0).then_some(sig)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(comm: &str, state: &str, flags: u64, exit_code: i32) -> String {
        let mut f: Vec<String> = (3..=52).map(|_| "0".to_string()).collect();
        f[0] = state.into();
        f[9 - 3] = flags.to_string();
        f[52 - 3] = exit_code.to_string();
        format!("123 ({comm}) {}", f.join(" "))
    }

    #[test]
    fn a_killed_writer_is_told_from_one_that_exits() {
        assert_eq!(parse_stat(&stat("python3", "R", 0x400000, 0)), Closer::Alive);
        assert_eq!(parse_stat(&stat("a) b (c", "R", 0x400004, 0)), Closer::Alive, "exit(0) publishes");
        assert_eq!(parse_stat(&stat("dd", "D", 0x400004, 9)), Closer::Killed(9));
        assert_eq!(parse_stat(&stat("dd", "R", 0x400004, 15 | 0x80)), Closer::Killed(15));
        assert_eq!(parse_stat(&stat("dd", "Z", 0, 0)), Closer::Gone);
        assert_eq!(parse_stat(&stat("dd", "Z", 0, 9)), Closer::Killed(9));
    }

    #[test]
    fn this_process_is_alive() {
        let me = std::process::id();
        assert_eq!(closer(me), Closer::Alive);
        assert_eq!(tgid_of(me), me);
        assert_eq!(closer(u32::MAX - 1), Closer::Gone);
    }
}
