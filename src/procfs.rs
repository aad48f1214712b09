//! The process table as Linux's `/proc` shows it: names, parents, CPU ticks and memory of
//! processes, and the tree below one. The one place the crate and gpumem-kernel read `/proc`
//! (the simulated device's process table, a record's child processes, Jupyter's
//! `usage_request`). Everything here is best effort: a process can end between two reads, so
//! what cannot be read is `None` or left out, never an error.

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
}
