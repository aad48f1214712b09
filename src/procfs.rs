//! The process table as Linux's `/proc` shows it: names, parents, CPU ticks, memory,
//! environment and command line of processes, and the tree below one. The one place the crate
//! and gpumem-kernel read `/proc` (the simulated device's process table, a record's child
//! processes and their ranks, Jupyter's `usage_request`). Everything here is best effort: a
//! process can end between two reads, so what cannot be read is `None` or left out, never an
//! error.

use std::collections::HashMap;

/// The text of a `/proc` file, `None` where it cannot be read.
pub fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The name of process `pid` (`/proc/<pid>/comm`), empty where unknown.
pub fn process_name(pid: u32) -> String {
    read(&format!("/proc/{pid}/comm")).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Whether process `pid` exists.
pub fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// One process of `/proc`: its parent and CPU ticks (user + system).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proc {
    /// The parent's pid.
    pub ppid: u32,
    /// CPU ticks (user + system) so far.
    pub ticks: u64,
}

/// Parses `/proc/<pid>/stat` (the command name, in parentheses, may hold spaces and parens).
pub fn parse_stat(stat: &str) -> Option<Proc> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) … utime(14) stime(15), numbered as in proc(5).
    let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some(Proc { ppid: field(4)? as u32, ticks: field(14)? + field(15)? })
}

/// Every process of `/proc` by pid.
pub fn processes() -> HashMap<u32, Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return HashMap::new() };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            Some((pid, parse_stat(&read(&format!("/proc/{pid}/stat"))?)?))
        })
        .collect()
}

/// Every process below `root` in `table` (children, their children, …), parents before
/// children.
pub fn descendants_in(root: u32, table: &HashMap<u32, Proc>) -> Vec<u32> {
    let mut out = Vec::new();
    let mut queue = vec![root];
    while let Some(p) = queue.pop() {
        let mut children: Vec<u32> = table.iter().filter(|(_, q)| q.ppid == p).map(|(&c, _)| c).collect();
        children.sort_unstable();
        out.extend(&children);
        queue.extend(children);
    }
    out
}

/// Every process below `root` now, by pid: each thread's `children` list where the kernel has
/// them (cheap), else every process's parent ([`processes`]).
pub fn descendants(root: u32) -> Vec<u32> {
    let mut found = if std::path::Path::new(&format!("/proc/{root}/task/{root}/children")).exists() {
        let mut found = Vec::new();
        let mut todo = vec![root];
        while let Some(p) = todo.pop() {
            for task in std::fs::read_dir(format!("/proc/{p}/task")).into_iter().flatten().flatten() {
                let Ok(list) = std::fs::read_to_string(task.path().join("children")) else { continue };
                for c in list.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
                    found.push(c);
                    todo.push(c);
                }
            }
        }
        found
    } else {
        descendants_in(root, &processes())
    };
    found.sort_unstable();
    found.dedup();
    found
}

/// The environment process `pid` was started with (`/proc/<pid>/environ`: `NAME=value` entries
/// separated by NUL bytes), in order; empty where it cannot be read (a process that ended, or
/// another user's). What a process set in its own environment after it started is not there.
pub fn environ(pid: u32) -> Vec<(String, String)> {
    std::fs::read(format!("/proc/{pid}/environ")).map(|b| parse_environ(&b)).unwrap_or_default()
}

/// `/proc/<pid>/environ`'s bytes as `(NAME, value)` pairs (an entry without `=` or not UTF-8 is
/// left out).
pub fn parse_environ(bytes: &[u8]) -> Vec<(String, String)> {
    bytes
        .split(|&b| b == 0)
        .filter_map(|e| {
            let (name, value) = std::str::from_utf8(e).ok()?.split_once('=')?;
            (!name.is_empty()).then(|| (name.to_string(), value.to_string()))
        })
        .collect()
}

/// The command line of process `pid` (`/proc/<pid>/cmdline`), one argument per entry; empty
/// where it cannot be read.
pub fn cmdline(pid: u32) -> Vec<String> {
    let Ok(bytes) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return Vec::new() };
    let bytes = bytes.strip_suffix(&[0]).unwrap_or(&bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
}

/// A `kB` field of a `/proc` text (`Pss:`, `VmRSS:`, `MemTotal:` …), in bytes.
pub fn kb_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(':')))?;
    let kb: u64 = line[name.len() + 1..].split_whitespace().next()?.parse().ok()?;
    Some(kb * 1024)
}

/// A process's proportional set size (what ipykernel reports where psutil has it), else its
/// resident set size, in bytes.
pub fn process_memory(pid: u32) -> Option<u64> {
    read(&format!("/proc/{pid}/smaps_rollup"))
        .and_then(|t| kb_field(&t, "Pss"))
        .or_else(|| read(&format!("/proc/{pid}/status")).and_then(|t| kb_field(&t, "VmRSS")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_and_kb_fields_are_read_as_proc5_says() {
        let p = parse_stat("42 (a (b) c) S 7 42 42 0 -1 4194304 101 0 0 0 250 50 3 4 20 0 1 0").unwrap();
        assert_eq!(p, Proc { ppid: 7, ticks: 300 });
        assert!(parse_stat("garbage").is_none());
        assert_eq!(kb_field("Pss:  238 kB\nPss_Dirty: 1 kB", "Pss"), Some(238 * 1024));
        assert_eq!(kb_field("Pss_Dirty: 1 kB", "Pss"), None);
        let mut t = HashMap::new();
        for (pid, ppid) in [(1, 0), (2, 1), (3, 2), (4, 1), (5, 9)] {
            t.insert(pid, Proc { ppid, ticks: 0 });
        }
        let d = descendants_in(1, &t);
        assert_eq!(d.len(), 3);
        assert!(d.iter().position(|&p| p == 2) < d.iter().position(|&p| p == 3), "parents before children: {d:?}");
        let mut d = d;
        d.sort_unstable();
        assert_eq!(d, vec![2, 3, 4]);
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri cannot start processes")]
    fn a_child_process_is_a_descendant_and_named() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let me = std::process::id();
        assert!(descendants(me).contains(&child.id()));
        assert!(descendants_in(me, &processes()).contains(&child.id()));
        assert_eq!(process_name(child.id()), "sleep");
        assert!(alive(child.id()));
        assert!(process_memory(me).is_some_and(|m| m > 0));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!descendants(me).contains(&child.id()), "a process that ended is no longer below");
    }

    #[test]
    fn environ_entries_are_split_at_nul_and_the_first_equals_sign() {
        let env = parse_environ(b"RANK=1\0LOCAL_RANK=0\0EMPTY=\0X=a=b\0junk\0=nameless\0\0");
        let want = [("RANK", "1"), ("LOCAL_RANK", "0"), ("EMPTY", ""), ("X", "a=b")];
        assert_eq!(env, want.map(|(k, v)| (k.to_string(), v.to_string())));
        assert!(parse_environ(b"").is_empty());
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri cannot start processes")]
    fn a_child_process_has_the_environment_and_arguments_it_was_started_with() {
        let mut child = std::process::Command::new("sleep").arg("5").env("GPUMEM_PROCFS_TEST", "7").spawn().unwrap();
        // Just after its start a process's environment can read empty for a moment (its exec is
        // under way): wait for it.
        let t = std::time::Instant::now();
        let mut env = environ(child.id());
        while env.is_empty() && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(10));
            env = environ(child.id());
        }
        assert!(env.contains(&("GPUMEM_PROCFS_TEST".into(), "7".into())), "{env:?}");
        assert_eq!(cmdline(child.id()), ["sleep", "5"]);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(environ(child.id()).is_empty() && cmdline(child.id()).is_empty(), "gone: nothing, no error");
    }
}
