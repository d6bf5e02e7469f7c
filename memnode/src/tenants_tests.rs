//! Tests of the tenants file and of finding a client's tenant by its token.

use super::*;

/// `printf %s TOKEN | sha256sum`, as an administrator writes it.
fn sha(token: &str) -> String {
    token_key(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn two() -> String {
    format!(
        r#"
[[tenant]]
name = "alice"
token_sha256 = "{}"
quota_bytes = "64M"
quota_volumes = 4

[[tenant]]
name = "bob"
token_sha256 = "{}"
quota_bytes = 1048576
"#,
        sha("alice-token"),
        sha("bob-token").to_uppercase()
    )
}

#[test]
fn a_file_gives_each_tenant_its_token_and_quota() {
    let t = Tenants::parse(&two()).expect("parses");
    assert!(!t.is_open());
    assert_eq!(t.len(), 2);
    let alice = t.find_by_token(b"alice-token").expect("alice's token");
    let bob = t
        .find_by_token(b"bob-token")
        .expect("bob's token (hex in capitals)");
    assert_eq!((t.name(alice), t.name(bob)), ("alice", "bob"));
    assert_eq!(
        t.quota(alice),
        Quota {
            bytes: Some(64 << 20),
            volumes: Some(4)
        }
    );
    assert_eq!(
        t.quota(bob),
        Quota {
            bytes: Some(1 << 20),
            volumes: None
        }
    );
    for wrong in [&b""[..], b"alice", b"alice-token\n", b"carol-token"] {
        assert_eq!(t.find_by_token(wrong), None, "{wrong:?}");
    }
    let keys: Vec<TenantId> = t.keys().map(|(id, _)| id).collect();
    assert_eq!(keys, vec![alice, bob]);
    assert!(
        !format!("{t:?}").contains(&sha("alice-token")[..16]),
        "no key in Debug"
    );
}

#[test]
fn a_token_file_is_read_for_its_key() {
    let dir = std::env::temp_dir().join(format!("memnode-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("carol.token");
    std::fs::write(&token, "carol's secret, long enough\n").unwrap();
    let text = format!(
        "[[tenant]]\nname = \"carol\"\ntoken_file = {:?}\n",
        token.display().to_string()
    );
    let file = dir.join("tenants.toml");
    std::fs::write(&file, &text).unwrap();
    let t = Tenants::load(&file).expect("loads");
    assert_eq!(t.find_by_token(b"carol's secret, long enough"), Some(0));
    assert_eq!(t.quota(0), Quota::default(), "no quota: no limit");

    // A short token in the file is refused, as `--token-file` refuses it.
    std::fs::write(&token, "short\n").unwrap();
    let err = Tenants::load(&file).unwrap_err();
    for want in ["\"carol\"", "token_file", "5 bytes", "too easily guessed"] {
        assert!(err.contains(want), "{err:?} should say {want}");
    }

    let missing = dir.join("nope.toml");
    let err = Tenants::load(&missing).unwrap_err();
    assert!(err.contains(&missing.display().to_string()), "{err}");
    std::fs::remove_file(&token).unwrap();
    let err = Tenants::load(&file).unwrap_err();
    for want in [
        &file.display().to_string(),
        "\"carol\"",
        "token_file",
        "carol.token",
    ] {
        assert!(err.contains(want), "{err:?} should name {want}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn mistakes_are_refused_naming_the_tenant_and_the_field() {
    let key = sha("t");
    let other = sha("u");
    let cases: Vec<(String, &[&str])> = vec![
        ("".into(), &["names no tenant"]),
        ("[[tenant]]\ntoken_sha256 = \"x\"\n".into(), &["tenant #1", "no name"]),
        (
            format!("[[tenant]]\nname = \"a\"\ntoken_sha256 = \"{key}\"\nquota_byte = \"1G\"\n"),
            &["\"a\"", "quota_byte"],
        ),
        (
            format!("[[tenant]]\nname = \"a\"\ntoken_sha256 = \"{key}\"\nquota_bytes = \"1X\"\n"),
            &["\"a\"", "quota_bytes", "1X"],
        ),
        (
            format!("[[tenant]]\nname = \"a\"\ntoken_sha256 = \"{key}\"\nquota_bytes = -5\n"),
            &["\"a\"", "quota_bytes", "below zero"],
        ),
        (
            format!("[[tenant]]\nname = \"a\"\ntoken_sha256 = \"{key}\"\nquota_bytes = true\n"),
            &["\"a\"", "quota_bytes"],
        ),
        (
            format!("[[tenant]]\nname = \"a\"\ntoken_sha256 = \"{key}\"\nquota_volumes = \"4\"\n"),
            &["\"a\"", "quota_volumes"],
        ),
        (
            format!("[[tenant]]\nname = \"a\"\ntoken_sha256 = \"{key}\"\nquota_volumes = -1\n"),
            &["\"a\"", "quota_volumes"],
        ),
        (
            "[[tenant]]\nname = \"a\"\ntoken_sha256 = \"abc\"\n".into(),
            &["\"a\"", "token_sha256", "64 hex digits"],
        ),
        (
            format!("[[tenant]]\nname = \"a\"\ntoken_sha256 = \"{}zz\"\n", &key[..62]),
            &["\"a\"", "token_sha256", "not hex"],
        ),
        ("[[tenant]]\nname = \"a\"\n".into(), &["\"a\"", "no token_sha256 or token_file"]),
        (
            format!("[[tenant]]\nname = \"a\"\ntoken_sha256 = \"{key}\"\ntoken_file = \"/x\"\n"),
            &["\"a\"", "token_sha256 and token_file"],
        ),
        (
            format!("[[tenant]]\nname = \"a b\"\ntoken_sha256 = \"{key}\"\n"),
            &["\"a b\"", "name"],
        ),
        (
            format!(
                "[[tenant]]\nname = \"a\"\ntoken_sha256 = \"{key}\"\n[[tenant]]\nname = \"a\"\ntoken_sha256 = \"{other}\"\n"
            ),
            &["\"a\"", "listed twice"],
        ),
        (
            format!(
                "[[tenant]]\nname = \"a\"\ntoken_sha256 = \"{key}\"\n[[tenant]]\nname = \"b\"\ntoken_sha256 = \"{key}\"\n"
            ),
            &["\"b\"", "\"a\"", "token"],
        ),
        (
            format!("quota = 1\n[[tenant]]\nname = \"a\"\ntoken_sha256 = \"{key}\"\n"),
            &["unknown key `quota`"],
        ),
        ("[tenant]\nname = \"a\"\n".into(), &["[[tenant]]"]),
        ("[[tenant]\nname = \"a\"\n".into(), &["line 1"]),
    ];
    for (text, wants) in cases {
        let err = Tenants::parse(&text).expect_err(&text);
        for want in wants {
            assert!(err.contains(want), "{text:?}: {err:?} should say {want:?}");
        }
    }
}

#[test]
fn no_token_is_one_open_tenant_and_one_token_one_tenant() {
    let open = Tenants::open();
    assert!(open.is_open());
    assert_eq!(open.find_by_token(b"anything"), Some(0));
    assert_eq!(open.name(0), DEFAULT_TENANT);
    assert_eq!(open.keys().count(), 0, "no key admits the open tenant");
    let one = Tenants::single(b"s3cret");
    assert!(!one.is_open());
    assert_eq!(one.find_by_token(b"s3cret"), Some(0));
    assert_eq!(one.find_by_token(b"s3cre"), None);
    assert_eq!(one.name(0), DEFAULT_TENANT);
    assert_eq!(one.keys().next(), Some((0, &token_key(b"s3cret"))));
}

#[test]
fn a_removed_tenant_is_named_but_admitted_by_no_token() {
    let mut t = Tenants::parse(&two()).unwrap();
    assert_eq!(t.add_removed("alice"), 0, "a listed tenant stays as it is");
    let gone = t.add_removed("dave");
    assert_eq!((t.name(gone), t.is_listed(gone)), ("dave", false));
    assert!(t.is_listed(0));
    assert_eq!(t.keys().count(), 2, "dave has no key");
    assert_eq!(t.quota(gone), Quota::default());
    let mut open = Tenants::open();
    let gone = open.add_removed("alice");
    assert_eq!(
        open.find_by_token(b"x"),
        Some(0),
        "the open tenant, never alice"
    );
    assert_ne!(gone, 0);
}
