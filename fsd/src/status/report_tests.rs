use super::*;
use crate::status::tests::sample;

fn set(s: &mut StatusFile, key: &str, v: u64) {
    s.counters.insert(key.to_string(), v);
}

#[test]
fn a_healthy_mount_says_so_first_and_lists_its_memnodes() {
    let s = sample();
    let r = Report::new(&s, Duration::from_millis(400));
    assert_eq!(r.health, Health::Healthy);
    assert!(r.is_fine());
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let text = r.to_text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "/mnt/rmemfs: healthy", "{text}");
    assert!(
        lines[1].starts_with("  volume mine; 2 copies, 64.0 KiB blocks; fsd pid 4242"),
        "{text}"
    );
    assert!(text.contains("memnodes: 2 of 2 up"), "{text}");
    assert!(
        lines
            .iter()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["10.0.0.2:7070", "up", "1.0", "GiB", "4.0", "GiB", "100"]),
        "{text}"
    );
    assert!(
        text.contains("cache          640.0 KiB of 256.0 MiB (0%)"),
        "{text}"
    );
    assert!(
        text.contains("blocks         100 (0 degraded, 0 lost)"),
        "{text}"
    );
    assert!(
        text.contains("re-replication idle: every block has its 2 copies"),
        "{text}"
    );
    assert!(
        !text.contains('['),
        "no progress bar when nothing is under way: {text}"
    );
}

#[test]
fn a_memnode_down_with_degraded_blocks_shows_the_rereplication_bar() {
    let mut s = sample();
    // fsd reports no usage for a memnode that is down.
    s.memnodes[1] = MemnodeEntry {
        up: false,
        capacity: None,
        used: None,
        held_free: None,
        ..s.memnodes[1].clone()
    };
    s.memnodes.push(MemnodeEntry {
        name: "10.0.0.4:7070".into(),
        up: true,
        copies: 40,
        capacity: None,
        used: None,
        held_free: None,
        unreachable_secs: None,
    });
    set(&mut s, "blocks_degraded", 60);
    set(&mut s, "rereplicated_blocks", 40);
    let r = Report::new(&s, Duration::ZERO);
    assert_eq!(r.health, Health::Degraded);
    assert!(!r.is_fine());
    assert_eq!(r.rereplication.state, "running");
    assert_eq!(
        r.problems,
        vec![
            "memnode 10.0.0.3:7070 is down".to_string(),
            "60 blocks have fewer than 2 copies".to_string()
        ]
    );
    let text = r.to_text();
    assert!(
        text.starts_with("/mnt/rmemfs: DEGRADED\n  ! memnode 10.0.0.3:7070 is down\n"),
        "{text}"
    );
    let bar_line = text
        .lines()
        .find(|l| l.starts_with("re-replication"))
        .expect("a re-replication line");
    assert_eq!(
        bar_line,
        "re-replication [############------------------]  40% 40 of 100 blocks have 2 copies; \
         40 copies restored"
    );
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["10.0.0.3:7070", "DOWN", "-", "-", "100"]),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["10.0.0.4:7070", "up", "-", "-", "40"]),
        "a memnode not heard from yet shows no usage: {text}"
    );
}

#[test]
fn too_few_memnodes_for_the_copies_is_waiting_not_running() {
    let mut s = sample();
    s.memnodes[0].up = false;
    set(&mut s, "blocks_degraded", 100);
    let r = Report::new(&s, Duration::ZERO);
    assert_eq!(r.rereplication.state, "waiting");
    assert!(
        r.to_text().contains("(waiting: 1 memnode up, 2 needed)"),
        "{}",
        r.to_text()
    );
}

#[test]
fn lost_blocks_and_a_stale_status_are_problems() {
    let mut s = sample();
    set(&mut s, "blocks_lost", 3);
    let r = Report::new(&s, STALE_AFTER + Duration::from_secs(5));
    assert_eq!(r.health, Health::DataLost);
    assert!(r.stale);
    let text = r.to_text();
    assert!(text.starts_with("/mnt/rmemfs: DATA LOST\n"), "{text}");
    assert!(text.contains("  ! 3 blocks have no copy left (reading them fails with EIO)"));
    assert!(text.contains("  ! fsd has not updated its status for 10 s: it may be stuck"));
}

#[test]
fn a_scrub_pass_under_way_shows_its_bar() {
    let mut s = sample();
    set(&mut s, "scrub_passes", 2);
    set(&mut s, "scrub_pass_blocks", 25);
    set(&mut s, "scrub_bytes", 3 << 20);
    let text = Report::new(&s, Duration::ZERO).to_text();
    assert!(
        text.contains(
            "scrub          pass 3 [#######-----------------------]  25% 25 of 100 blocks; \
             3.0 MiB read, 0 bad pages"
        ),
        "{text}"
    );
    set(&mut s, "scrub_pass_blocks", 0);
    let text = Report::new(&s, Duration::ZERO).to_text();
    assert!(
        text.contains("scrub          2 passes done; 3.0 MiB read, 0 bad pages"),
        "{text}"
    );
}

#[test]
fn the_json_report_carries_the_verdict_the_memnodes_and_every_counter() {
    let mut s = sample();
    s.memnodes[0].up = false;
    set(&mut s, "blocks_degraded", 7);
    let json = Report::new(&s, Duration::ZERO).to_json();
    let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    assert_eq!(v["health"], "degraded");
    assert_eq!(v["memnodes_up"], 1);
    assert_eq!(v["memnodes"][0]["up"], false);
    assert_eq!(v["memnodes"][1]["used"], 1u64 << 30);
    assert_eq!(v["blocks_degraded"], 7);
    assert_eq!(v["rereplication"]["state"], "waiting");
    assert_eq!(v["counters"]["remote_write_bytes"], 1 << 20);
    assert_eq!(v["cache"]["capacity_bytes"], 4096u64 * 65536);
}

#[test]
fn bars_fill_in_proportion_and_never_overflow() {
    assert_eq!(bar(0, 10), format!("[{}]   0%", "-".repeat(BAR)));
    assert_eq!(bar(10, 10), format!("[{}] 100%", "#".repeat(BAR)));
    assert_eq!(bar(15, 10), format!("[{}] 100%", "#".repeat(BAR)));
    assert_eq!(bar(1, 0), format!("[{}] 100%", "#".repeat(BAR)));
    assert_eq!(
        bar(u64::MAX / 2, u64::MAX),
        format!("[{}{}]  49%", "#".repeat(14), "-".repeat(16))
    );
}

#[test]
fn mountinfo_names_the_mount_and_its_type() {
    let info = "\
22 1 0:21 / /mnt/a\\040b rw,relatime - tmpfs tmpfs rw
40 22 0:40 / /mnt/a\\040b rw,nosuid,nodev,relatime shared:1 - fuse.rmemfs rmemfs rw,user_id=0
41 1 0:41 / /mnt/root rw - fuse rmemfs rw
42 1 0:42 / /mnt/other rw - fuse sshfs rw
";
    let e = |p: &str| mount_entry(info, Path::new(p));
    assert_eq!(
        e("/mnt/a b"),
        Some(("fuse.rmemfs".into(), "rmemfs".into())),
        "the last mount on a point wins"
    );
    assert!(e("/mnt/a b").is_some_and(|(t, s)| is_rmemfs(&t, &s)));
    assert!(e("/mnt/root").is_some_and(|(t, s)| is_rmemfs(&t, &s)));
    assert!(e("/mnt/other").is_some_and(|(t, s)| !is_rmemfs(&t, &s)));
    assert_eq!(e("/mnt/none"), None);
}
