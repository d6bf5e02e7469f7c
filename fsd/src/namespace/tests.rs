use super::*;

fn ns() -> Namespace {
    Namespace::new(0, 0)
}

fn new(kind: FileKind) -> NewInode {
    NewInode {
        kind,
        perm: 0o644,
        uid: 1,
        gid: 2,
        rdev: 0,
        target: None,
        xattrs: Default::default(),
    }
}

fn names(ns: &Namespace, dir: Ino) -> Vec<String> {
    ns.readdir(dir, 0, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|e| e.name.to_string_lossy().into_owned())
        .collect()
}

fn nlink(ns: &Namespace, ino: Ino) -> u32 {
    ns.get(ino).unwrap().meta().attr.nlink
}

#[test]
fn created_entries_are_found_and_listed() {
    let ns = ns();
    let f = ns
        .create(ROOT_INO, "a".as_ref(), new(FileKind::File))
        .unwrap();
    assert_eq!(ns.lookup(ROOT_INO, "a".as_ref()).unwrap().ino, f.ino);
    assert_eq!(names(&ns, ROOT_INO), vec![".", "..", "a"]);
    assert_eq!(
        ns.create(ROOT_INO, "a".as_ref(), new(FileKind::File)).err(),
        Some(FsError::Exists)
    );
}

#[test]
fn directory_link_counts_follow_subdirectories() {
    let ns = ns();
    let d = ns
        .create(ROOT_INO, "d".as_ref(), new(FileKind::Dir))
        .unwrap();
    assert_eq!(nlink(&ns, ROOT_INO), 3);
    assert_eq!(nlink(&ns, d.ino), 2);
    ns.create(d.ino, "e".as_ref(), new(FileKind::Dir)).unwrap();
    assert_eq!(nlink(&ns, d.ino), 3);
    assert_eq!(
        ns.rmdir(ROOT_INO, "d".as_ref()).err(),
        Some(FsError::NotEmpty)
    );
    ns.rmdir(d.ino, "e".as_ref()).unwrap();
    ns.rmdir(ROOT_INO, "d".as_ref()).unwrap();
    assert_eq!(nlink(&ns, ROOT_INO), 2);
}

#[test]
fn names_longer_than_255_bytes_are_refused() {
    let ns = ns();
    let long = "x".repeat(256);
    assert_eq!(
        ns.create(ROOT_INO, long.as_ref(), new(FileKind::File))
            .err(),
        Some(FsError::NameTooLong)
    );
    let ok = "y".repeat(255);
    assert!(ns
        .create(ROOT_INO, ok.as_ref(), new(FileKind::File))
        .is_ok());
}

#[test]
fn hard_links_share_the_inode_and_count() {
    let ns = ns();
    let f = ns
        .create(ROOT_INO, "f".as_ref(), new(FileKind::File))
        .unwrap();
    ns.link(f.ino, ROOT_INO, "g".as_ref()).unwrap();
    assert_eq!(nlink(&ns, f.ino), 2);
    ns.unlink(ROOT_INO, "f".as_ref()).unwrap();
    assert_eq!(nlink(&ns, f.ino), 1);
    assert_eq!(ns.lookup(ROOT_INO, "g".as_ref()).unwrap().ino, f.ino);
}

#[test]
fn rename_replaces_files_and_refuses_bad_targets() {
    let ns = ns();
    let a = ns
        .create(ROOT_INO, "a".as_ref(), new(FileKind::File))
        .unwrap();
    let b = ns
        .create(ROOT_INO, "b".as_ref(), new(FileKind::File))
        .unwrap();
    let d = ns
        .create(ROOT_INO, "d".as_ref(), new(FileKind::Dir))
        .unwrap();
    let m = RenameMode::default();
    let replaced = ns
        .rename(ROOT_INO, "a".as_ref(), ROOT_INO, "b".as_ref(), m)
        .unwrap();
    assert_eq!(replaced.map(|i| i.ino), Some(b.ino));
    assert_eq!(nlink(&ns, b.ino), 0);
    assert_eq!(ns.lookup(ROOT_INO, "b".as_ref()).unwrap().ino, a.ino);
    assert_eq!(
        ns.rename(ROOT_INO, "b".as_ref(), ROOT_INO, "d".as_ref(), m)
            .err(),
        Some(FsError::IsDir)
    );
    assert_eq!(
        ns.rename(ROOT_INO, "d".as_ref(), ROOT_INO, "b".as_ref(), m)
            .err(),
        Some(FsError::NotDir)
    );
    let no_replace = RenameMode {
        no_replace: true,
        exchange: false,
        whiteout: None,
    };
    ns.create(ROOT_INO, "c".as_ref(), new(FileKind::File))
        .unwrap();
    assert_eq!(
        ns.rename(ROOT_INO, "b".as_ref(), ROOT_INO, "c".as_ref(), no_replace)
            .err(),
        Some(FsError::Exists)
    );
    let _ = d;
}

#[test]
fn a_directory_cannot_move_into_its_own_subtree() {
    let ns = ns();
    let d = ns
        .create(ROOT_INO, "d".as_ref(), new(FileKind::Dir))
        .unwrap();
    let e = ns.create(d.ino, "e".as_ref(), new(FileKind::Dir)).unwrap();
    let m = RenameMode::default();
    assert_eq!(
        ns.rename(ROOT_INO, "d".as_ref(), e.ino, "x".as_ref(), m)
            .err(),
        Some(FsError::Invalid)
    );
    // Moving it elsewhere fixes the link counts of both parents.
    let f = ns
        .create(ROOT_INO, "f".as_ref(), new(FileKind::Dir))
        .unwrap();
    ns.rename(d.ino, "e".as_ref(), f.ino, "e".as_ref(), m)
        .unwrap();
    assert_eq!(nlink(&ns, d.ino), 2);
    assert_eq!(nlink(&ns, f.ino), 3);
    let dotdot = ns.readdir(e.ino, 0, 2).unwrap()[1].ino;
    assert_eq!(dotdot, f.ino);
}

#[test]
fn exchange_swaps_two_entries() {
    let ns = ns();
    let a = ns
        .create(ROOT_INO, "a".as_ref(), new(FileKind::File))
        .unwrap();
    let d = ns
        .create(ROOT_INO, "d".as_ref(), new(FileKind::Dir))
        .unwrap();
    let x = RenameMode {
        no_replace: false,
        exchange: true,
        whiteout: None,
    };
    ns.rename(ROOT_INO, "a".as_ref(), ROOT_INO, "d".as_ref(), x)
        .unwrap();
    assert_eq!(ns.lookup(ROOT_INO, "a".as_ref()).unwrap().ino, d.ino);
    assert_eq!(ns.lookup(ROOT_INO, "d".as_ref()).unwrap().ino, a.ino);
}

#[test]
fn listing_continues_correctly_while_entries_are_removed() {
    let ns = ns();
    for i in 0..100 {
        ns.create(ROOT_INO, format!("f{i}").as_ref(), new(FileKind::File))
            .unwrap();
    }
    // Read in pages of 10, deleting everything seen so far, as `rm -r` does.
    let mut offset = 0;
    let mut seen = 0;
    loop {
        let page = ns.readdir(ROOT_INO, offset, 10).unwrap();
        if page.is_empty() {
            break;
        }
        for e in &page {
            if e.name != "." && e.name != ".." {
                ns.unlink(ROOT_INO, &e.name).unwrap();
                seen += 1;
            }
        }
        offset = page.last().unwrap().offset;
    }
    assert_eq!(seen, 100, "every entry listed exactly once");
    assert_eq!(names(&ns, ROOT_INO), vec![".", ".."]);
}

#[test]
fn rename_whiteout_leaves_a_character_device_0_0_where_the_source_was() {
    let ns = ns();
    let a = ns
        .create(ROOT_INO, "a".as_ref(), new(FileKind::File))
        .unwrap();
    let m = RenameMode {
        whiteout: Some((7, 8)),
        ..RenameMode::default()
    };
    ns.rename(ROOT_INO, "a".as_ref(), ROOT_INO, "b".as_ref(), m)
        .unwrap();
    assert_eq!(ns.lookup(ROOT_INO, "b".as_ref()).unwrap().ino, a.ino);
    let w = ns.lookup(ROOT_INO, "a".as_ref()).expect("a whiteout at a");
    assert_ne!(w.ino, a.ino);
    let attr = w.meta().attr.clone();
    assert_eq!(
        (attr.kind, attr.rdev, attr.perm, attr.nlink, attr.uid, attr.gid),
        (FileKind::CharDevice, 0, 0, 1, 7, 8)
    );
    assert_eq!(names(&ns, ROOT_INO), vec![".", "..", "b", "a"]);
    // With exchange it is refused, as renameat2(2) does.
    let x = RenameMode {
        exchange: true,
        whiteout: Some((0, 0)),
        ..RenameMode::default()
    };
    assert_eq!(
        ns.rename(ROOT_INO, "a".as_ref(), ROOT_INO, "b".as_ref(), x)
            .err(),
        Some(FsError::Invalid)
    );
}

#[test]
fn renaming_each_entry_read_and_back_ends_the_listing() {
    // What xfstests generic/736 does: read one entry at a time and rename it to a
    // temporary name and back. Were the renamed entry given a new place at the end,
    // the listing would meet it again, forever.
    let ns = ns();
    let files = 200;
    for i in 0..files {
        ns.create(ROOT_INO, format!("{i}").as_ref(), new(FileKind::File))
            .unwrap();
    }
    let (mut offset, mut listed) = (0, 0);
    while let Some(e) = ns.readdir(ROOT_INO, offset, 1).unwrap().into_iter().next() {
        offset = e.offset;
        listed += 1;
        assert!(listed <= files + 2, "the listing does not end");
        if e.name == "." || e.name == ".." {
            continue;
        }
        let m = RenameMode::default();
        ns.rename(ROOT_INO, &e.name, ROOT_INO, "TEMPFILE".as_ref(), m)
            .unwrap();
        ns.rename(ROOT_INO, "TEMPFILE".as_ref(), ROOT_INO, &e.name, m)
            .unwrap();
    }
    assert_eq!(listed, files + 2, "each entry listed once, with . and ..");
}

#[test]
fn a_name_replaced_by_rename_keeps_its_place_in_a_listing_under_way() {
    let ns = ns();
    for i in 0..50 {
        ns.create(ROOT_INO, format!("f{i:02}").as_ref(), new(FileKind::File))
            .unwrap();
    }
    // Read in pages of 10; after each page, replace a name already listed (as a
    // program saving a file through a temporary name does) and one not yet listed.
    let mut offset = 0;
    let mut seen: Vec<String> = Vec::new();
    let mut round = 0;
    loop {
        let page = ns.readdir(ROOT_INO, offset, 10).unwrap();
        if page.is_empty() {
            break;
        }
        seen.extend(page.iter().map(|e| e.name.to_string_lossy().into_owned()));
        offset = page.last().unwrap().offset;
        for target in [round * 9, 49 - round] {
            let tmp = format!("tmp{round}-{target}");
            ns.create(ROOT_INO, tmp.as_ref(), new(FileKind::File))
                .unwrap();
            let m = RenameMode::default();
            ns.rename(
                ROOT_INO,
                tmp.as_ref(),
                ROOT_INO,
                format!("f{target:02}").as_ref(),
                m,
            )
            .unwrap();
        }
        round += 1;
    }
    let mut want: Vec<String> = vec![".".into(), "..".into()];
    want.extend((0..50).map(|i| format!("f{i:02}")));
    seen.sort();
    want.sort();
    assert_eq!(seen, want, "every name listed exactly once");
}

#[test]
fn dot_and_dotdot_find_an_inode_and_a_parent_for_file_handles() {
    let ns = ns();
    let d = ns
        .create(ROOT_INO, "d".as_ref(), new(FileKind::Dir))
        .unwrap();
    let f = ns.create(d.ino, "f".as_ref(), new(FileKind::File)).unwrap();
    let before = f.meta().lookups;
    assert_eq!(ns.lookup(f.ino, ".".as_ref()).unwrap().ino, f.ino);
    assert_eq!(
        f.meta().lookups,
        before + 1,
        "a kernel reference, as any lookup"
    );
    assert_eq!(ns.lookup(d.ino, "..".as_ref()).unwrap().ino, ROOT_INO);
    assert_eq!(ns.lookup(ROOT_INO, "..".as_ref()).unwrap().ino, ROOT_INO);
    let err = |parent, name: &str| ns.lookup(parent, name.as_ref()).err();
    assert_eq!(err(f.ino, ".."), Some(FsError::NotDir));
    // Unlinked (still referenced): its handle is stale.
    ns.unlink(d.ino, "f".as_ref()).unwrap();
    assert_eq!(err(f.ino, "."), Some(FsError::NotFound));
    assert_eq!(err(9999, "."), Some(FsError::NotFound));
}

#[test]
fn forget_drops_an_unlinked_inode_only_when_unreferenced() {
    let ns = ns();
    let f = ns
        .create(ROOT_INO, "f".as_ref(), new(FileKind::File))
        .unwrap();
    ns.lookup(ROOT_INO, "f".as_ref()).unwrap(); // lookups = 2
    ns.unlink(ROOT_INO, "f".as_ref()).unwrap();
    assert!(ns.forget(f.ino, 1).is_none());
    assert!(ns.get(f.ino).is_ok());
    assert!(ns.forget(f.ino, 1).is_some());
    assert_eq!(ns.get(f.ino).err(), Some(FsError::NotFound));
}
