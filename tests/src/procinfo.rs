//! What processes and threads are waiting in, from /proc: the evidence a hung test
//! leaves before it is killed (see [`crate::command::run_within_watching`]).
//!
//! For each task: its name, state (R running, S sleeping, D uninterruptible...),
//! wchan (the kernel function it sleeps in) and, where readable (as root), its
//! kernel stack. Read at the moment of the hang; a task that ends meanwhile is
//! skipped.

use std::fs;
use std::path::Path;

/// The fields of /proc/PID/stat after the name: state first, then the parent's
/// pid, then the process group.
fn stat_fields(dir: &Path) -> Option<Vec<String>> {
    let text = fs::read_to_string(dir.join("stat")).ok()?;
    // The name is in parentheses and may hold spaces or parentheses itself.
    let after = text.get(text.rfind(')')? + 1..)?;
    Some(after.split_whitespace().map(str::to_string).collect())
}

/// One line for a task (a process or thread directory of /proc), then its kernel
/// stack indented.
fn task_report(dir: &Path, label: &str) -> String {
    let read = |f: &str| {
        fs::read_to_string(dir.join(f))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let state = stat_fields(dir)
        .and_then(|f| f.first().cloned())
        .unwrap_or_else(|| "?".into());
    let mut out = format!(
        "  {label} {}: state {state}, wchan {}\n",
        read("comm"),
        match read("wchan").as_str() {
            "" | "0" => "-".to_string(),
            w => w.to_string(),
        }
    );
    for frame in read("stack").lines() {
        out += &format!("      {frame}\n");
    }
    out
}

/// The numbered entries of a /proc directory (pids or tids), in order; `None` when
/// it cannot be read.
fn ids_in(dir: &Path) -> Option<Vec<u32>> {
    let mut ids: Vec<u32> = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    ids.sort_unstable();
    Some(ids)
}

/// Every process of process group `pgid` (a hung program and all it forked).
pub fn group_report(pgid: u32) -> String {
    let mut out = format!("processes of group {pgid}:\n");
    let proc = Path::new("/proc");
    let Some(pids) = ids_in(proc) else {
        return out + "  (/proc unreadable)\n";
    };
    for pid in pids {
        let dir = proc.join(pid.to_string());
        let in_group = stat_fields(&dir).and_then(|f| f.get(2).and_then(|g| g.parse::<u32>().ok()))
            == Some(pgid);
        if in_group {
            out += &task_report(&dir, &format!("pid {pid}"));
        }
    }
    out
}

/// Every thread of process `pid`.
pub fn threads_report(pid: u32) -> String {
    let tasks = Path::new("/proc").join(pid.to_string()).join("task");
    let mut out = format!("threads of process {pid}:\n");
    let Some(tids) = ids_in(&tasks) else {
        return out + "  (gone)\n";
    };
    for tid in tids {
        out += &task_report(&tasks.join(tid.to_string()), &format!("tid {tid}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    #[test]
    fn a_sleeping_group_is_reported_with_its_state_and_this_process_with_its_threads() {
        let mut child = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .expect("sleep");
        let pid = child.id();
        // Until it has exec'd and gone to sleep, it may still be running.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let report = loop {
            let r = group_report(pid);
            if r.contains("sleep: state S") || std::time::Instant::now() > deadline {
                break r;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            report.contains(&format!("pid {pid} sleep: state S")),
            "the group's sleeping process should be named with its state:\n{report}"
        );
        let mine = threads_report(std::process::id());
        assert!(
            mine.contains(&format!("tid {} ", std::process::id())),
            "this process's main thread should be listed:\n{mine}"
        );
    }
}
