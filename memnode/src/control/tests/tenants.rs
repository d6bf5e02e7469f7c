//! Tenants in the control service, fed frames directly (no sockets): each tenant's
//! volumes are its own, its memory counts against its quota, and the ledger always
//! agrees with the books.

use super::*;
use crate::tenants::Tenants;

const ALICE: &[u8] = b"alice-token";
const BOB: &[u8] = b"bob-token";

fn sha(token: &[u8]) -> String {
    rmemfs_common::auth::token_key(token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// alice: `pages` pages and one volume at most; bob: no quota.
fn file(pages: u64) -> String {
    format!(
        "[[tenant]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\nquota_bytes = {}\nquota_volumes = 1\n\
         [[tenant]]\nname = \"bob\"\ntoken_sha256 = \"{}\"\n",
        sha(ALICE),
        pages * system_page_size(),
        sha(BOB)
    )
}

fn service_on(region: &Arc<Region>, tenants: Tenants) -> ControlService {
    let pool = Arc::new(ChunkPool::new(region.clone(), Arc::new(TcpRegistry::new())));
    ControlService::new(
        pool,
        Arc::new(tenants),
        0xfeed,
        Duration::from_secs(10),
        Duration::from_secs(60),
    )
}

/// A service of 32 pages with alice (quota: 4 pages, 1 volume) and bob.
fn two_tenants() -> (ControlService, Arc<Region>) {
    let region = Arc::new(Region::reserve(32 * system_page_size(), false).expect("reserve"));
    let s = service_on(&region, Tenants::parse(&file(4)).expect("parses"));
    (s, region)
}

/// A connection that said Hello as `client` with `token`.
fn client(s: &ControlService, conn_id: u64, client: u64, token: &[u8]) -> ConnectionState {
    let mut c = conn(conn_id);
    let (resp, close) = hello(s, &mut c, client, token);
    assert!(!close, "Hello of {client:#x} refused: {resp:?}");
    c
}

fn ledger_ok(s: &ControlService) {
    if let Err(e) = s.check_ledger() {
        panic!("the ledger disagrees with the books: {e}");
    }
}

fn open_req(name: &str, create: bool, takeover: bool) -> Request {
    Request::VolumeOpen {
        name: name.as_bytes().to_vec(),
        create,
        takeover,
    }
}

fn message(resp: &Response, want: ErrorCode) -> String {
    match resp {
        Response::Error { code, message } if *code == want => message.clone(),
        other => panic!("expected {want:?}, got {other:?}"),
    }
}

fn names(s: &ControlService, c: &mut ConnectionState) -> Vec<String> {
    match ask(s, c, &Request::VolumeList { after: vec![] }).0 {
        Response::VolumeListing { volumes, .. } => volumes
            .iter()
            .map(|v| String::from_utf8_lossy(&v.name).into_owned())
            .collect(),
        other => panic!("VolumeList: {other:?}"),
    }
}

#[test]
fn a_tenant_at_its_quota_is_refused_while_another_still_allocates() {
    let (s, _region) = two_tenants();
    let page = system_page_size();
    let mut a = client(&s, 1, 0xa, ALICE);
    let mut b = client(&s, 2, 0xb, BOB);
    let first = alloc_on(&s, &mut a, 3 * page);
    alloc_on(&s, &mut a, 1);
    ledger_ok(&s);
    assert_eq!(s.usage(0).bytes, 4 * page, "rounded up to pages");
    let resp = ask(&s, &mut a, &Request::Alloc { bytes: 1 }).0;
    let msg = message(&resp, ErrorCode::OverQuota);
    for want in ["\"alice\"", "16.0 KiB", "4.0 KiB more"] {
        let want = want.replace("16.0 KiB", &rmemfs_common::size::format_size(4 * page));
        let want = want.replace("4.0 KiB", &rmemfs_common::size::format_size(page));
        assert!(msg.contains(&want), "{msg:?} should say {want:?}");
    }
    // Bob, on the same memnode, is not held back by alice's quota.
    alloc_on(&s, &mut b, 8 * page);
    // Freeing gives alice room again.
    let (resp, _) = ask(
        &s,
        &mut a,
        &Request::Free {
            addr: first.addr,
            rkey: first.rkey,
        },
    );
    assert_eq!(resp, Response::Freed);
    alloc_on(&s, &mut a, 2 * page);
    ledger_ok(&s);
    // A refused Alloc too large for the memnode takes back its charge.
    let (resp, _) = ask(&s, &mut b, &Request::Alloc { bytes: 1 << 40 });
    assert_eq!(code(&resp), Some(ErrorCode::NoSpace));
    ledger_ok(&s);
    assert_eq!(s.usage(0).refused, 1);
    // The end of alice's session gives its memory back to her tenant.
    ask(&s, &mut a, &Request::SessionEnd);
    s.disconnected(&a);
    assert_eq!(s.usage(0).bytes, 0);
    ledger_ok(&s);
    let known = rmemfs_common::sync::lock(&s.client_tenants);
    assert!(
        !known.contains_key(&0xa),
        "the session's tenant went with it"
    );
    assert_eq!(known.get(&0xb), Some(&1), "bob's is still known");
}

#[test]
fn volumes_count_against_their_tenant_and_destroying_one_gives_it_back() {
    let (s, _region) = two_tenants();
    let page = system_page_size();
    let mut a = client(&s, 1, 0xa, ALICE);
    let Response::VolumeOpened(_) = ask(&s, &mut a, &open_req("data", true, false)).0 else {
        panic!("alice creates her volume")
    };
    alloc_on(&s, &mut a, 3 * page);
    ledger_ok(&s);
    assert_eq!(
        (s.usage(0).bytes, s.usage(0).volumes),
        (4 * page, 1),
        "the root and the volume's chunk"
    );
    let resp = ask(&s, &mut a, &Request::Alloc { bytes: 1 }).0;
    message(&resp, ErrorCode::OverQuota);
    ask(&s, &mut a, &Request::VolumeClose);
    let mut a2 = client(&s, 2, 0xa2, ALICE);
    let resp = ask(&s, &mut a2, &open_req("more", true, false)).0;
    let msg = message(&resp, ErrorCode::OverQuota);
    assert!(msg.contains("1 volumes of its 1"), "{msg}");
    assert!(
        names(&s, &mut a2) == ["data"],
        "the refused create made nothing"
    );
    let (resp, _) = ask(
        &s,
        &mut a2,
        &Request::VolumeDestroy {
            name: b"data".to_vec(),
        },
    );
    assert!(matches!(resp, Response::VolumeDestroyed { .. }), "{resp:?}");
    assert_eq!(
        s.usage(0),
        crate::quota::Usage {
            refused: 2,
            ..Default::default()
        }
    );
    let Response::VolumeOpened(_) = ask(&s, &mut a2, &open_req("more", true, false)).0 else {
        panic!("room for a volume again")
    };
    ledger_ok(&s);
}

#[test]
fn a_tenant_cannot_list_open_take_over_or_destroy_anothers_volume() {
    let (s, _region) = two_tenants();
    let mut a = client(&s, 1, 0xa, ALICE);
    let mut b = client(&s, 2, 0xb, BOB);
    let alices = match ask(&s, &mut a, &open_req("data", true, false)).0 {
        Response::VolumeOpened(v) => v,
        other => panic!("alice creates \"data\": {other:?}"),
    };
    ask(&s, &mut a, &Request::VolumeClose);
    assert_eq!(
        names(&s, &mut b),
        Vec::<String>::new(),
        "bob sees none of alice's"
    );
    for (what, req) in [
        ("open", open_req("data", false, false)),
        ("take over", open_req("data", false, true)),
        (
            "destroy",
            Request::VolumeDestroy {
                name: b"data".to_vec(),
            },
        ),
    ] {
        let resp = ask(&s, &mut b, &req).0;
        let msg = message(&resp, ErrorCode::NotFound);
        assert!(
            msg.contains("no volume named \"data\""),
            "bob's {what}: {msg:?} reads as a volume that does not exist"
        );
    }
    // Bob's "data" is his own, beside alice's.
    let bobs = match ask(&s, &mut b, &open_req("data", true, true)).0 {
        Response::VolumeOpened(v) => v,
        other => panic!("bob creates his own \"data\": {other:?}"),
    };
    assert!(bobs.created);
    assert_ne!(bobs.volume_id, alices.volume_id);
    assert_eq!(names(&s, &mut b), vec!["data"]);
    let mut a2 = client(&s, 3, 0xa2, ALICE);
    let again = match ask(&s, &mut a2, &open_req("data", false, false)).0 {
        Response::VolumeOpened(v) => v,
        other => panic!("alice opens her own \"data\" again: {other:?}"),
    };
    assert_eq!(again.volume_id, alices.volume_id, "alice's, untouched");
    assert_eq!(s.volumes_summary().len(), 2, "the memnode holds both");
    ledger_ok(&s);
}

#[test]
fn a_session_is_its_tenants_whatever_another_tenant_knows_of_it() {
    let (s, _region) = two_tenants();
    let mut a = conn(1);
    let (_, _, secret) = greet(&s, &mut a, 0xa, ALICE, SessionSecret::NONE);
    // Bob with alice's client id and even her secret is refused, as a stranger is.
    let mut b = conn(2);
    let (resp, close, _) = greet(&s, &mut b, 0xa, BOB, secret);
    assert_eq!(code(&resp), Some(ErrorCode::AuthFailed), "{resp:?}");
    assert!(close);
    assert_eq!(b.client, None);
    let Response::Error { message, .. } = &resp else {
        unreachable!()
    };
    assert!(
        !message.contains("alice"),
        "no tenant is named to another: {message}"
    );
    // Alice joins with her own token and the secret.
    let mut a2 = conn(3);
    let (resp, _, _) = greet(&s, &mut a2, 0xa, ALICE, secret);
    assert!(resumed(&resp));
}

#[test]
fn ownership_survives_a_restart_and_a_removed_tenants_volume_waits_unseen() {
    let region = Arc::new(Region::reserve(32 * system_page_size(), false).expect("reserve"));
    let page = system_page_size();
    let saved = {
        let s = service_on(&region, Tenants::parse(&file(8)).unwrap());
        let mut a = client(&s, 1, 0xa, ALICE);
        ask(&s, &mut a, &open_req("data", true, false));
        alloc_on(&s, &mut a, 2 * page);
        let mut b = client(&s, 2, 0xb, BOB);
        alloc_on(&s, &mut b, page);
        s.books()
    };
    assert_eq!(
        saved
            .volumes
            .iter()
            .map(|v| v.tenant.as_str())
            .collect::<Vec<_>>(),
        ["alice"]
    );
    // Restarted with bob only: alice's volume is kept, out of everyone's reach.
    let only_bob = format!(
        "[[tenant]]\nname = \"bob\"\ntoken_sha256 = \"{}\"\n",
        sha(BOB)
    );
    {
        let mut s = service_on(&region, Tenants::parse(&only_bob).unwrap());
        s.restore(&saved).expect("restores");
        ledger_ok(&s);
        let alice = s.tenants().by_name("alice").expect("kept as removed");
        assert!(!s.tenants().is_listed(alice));
        assert_eq!(
            s.usage(alice).bytes,
            3 * page,
            "her volume's memory is kept"
        );
        assert_eq!(s.usage(alice).volumes, 1);
        let mut refused = conn(1);
        let (resp, _) = hello(&s, &mut refused, 0xa1, ALICE);
        assert_eq!(
            code(&resp),
            Some(ErrorCode::AuthFailed),
            "no token is alice's now"
        );
        let mut b = client(&s, 2, 0xb2, BOB);
        assert!(names(&s, &mut b).is_empty());
        let resp = ask(&s, &mut b, &open_req("data", false, true)).0;
        message(&resp, ErrorCode::NotFound);
        let views = s.tenant_views();
        assert!(views.iter().any(|v| v.name == "alice" && v.removed));
        // Bob's resumed session is still his, with his chunk.
        assert_eq!(s.usage(0).bytes, page);
    }
    // Listed again, alice has her volume back whole.
    let s = {
        let mut s = service_on(&region, Tenants::parse(&file(8)).unwrap());
        s.restore(&saved).expect("restores");
        s
    };
    ledger_ok(&s);
    let mut a = client(&s, 1, 0xa3, ALICE);
    assert_eq!(names(&s, &mut a), vec!["data"]);
    let mut b = client(&s, 2, 0xb3, BOB);
    assert!(names(&s, &mut b).is_empty(), "still alice's only");
}

#[test]
fn tenants_show_in_the_metrics() {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;
    let (s, _region) = two_tenants();
    let page = system_page_size();
    let s = Arc::new(s);
    let mut a = client(&s, 1, 0xa, ALICE);
    ask(&s, &mut a, &open_req("data", true, false));
    alloc_on(&s, &mut a, 3 * page);
    message(
        &ask(&s, &mut a, &Request::Alloc { bytes: 1 }).0,
        ErrorCode::OverQuota,
    );
    let mut b = client(&s, 2, 0xb, BOB);
    ask(&s, &mut b, &open_req("data", true, false));
    let mut reg = Registry::default();
    reg.register_collector(Box::new(crate::metrics::MemnodeCollector { control: s }));
    let mut out = String::new();
    encode(&mut out, &reg).unwrap();
    for line in [
        format!("memnode_tenant_used_bytes{{tenant=\"alice\"}} {}", 4 * page),
        format!("memnode_tenant_used_bytes{{tenant=\"bob\"}} {page}"),
        format!(
            "memnode_tenant_quota_bytes{{tenant=\"alice\"}} {}",
            4 * page
        ),
        "memnode_tenant_volumes{tenant=\"alice\"} 1".into(),
        "memnode_tenant_quota_volumes{tenant=\"alice\"} 1".into(),
        "memnode_tenant_clients{tenant=\"bob\"} 1".into(),
        "memnode_tenant_removed{tenant=\"bob\"} 0".into(),
        "memnode_tenant_over_quota_total{tenant=\"alice\"} 1".into(),
        "memnode_control_refused_total{reason=\"over_quota\"} 1".into(),
        format!(
            "memnode_volume_bytes{{tenant=\"alice\",volume=\"data\"}} {}",
            4 * page
        ),
        format!("memnode_volume_bytes{{tenant=\"bob\",volume=\"data\"}} {page}"),
    ] {
        assert!(
            out.lines().any(|l| l == line),
            "no line {line:?} in:\n{out}"
        );
    }
    assert!(
        !out.contains("memnode_tenant_quota_bytes{tenant=\"bob\"}"),
        "no quota, no quota line"
    );
    let parsed = crate::metrics::tenant_usage(&out).expect("parses");
    assert_eq!(parsed.len(), 2);
    assert_eq!(parsed[0].name, "alice");
    assert_eq!(parsed[0].quota_bytes, Some(4 * page));
    assert_eq!(parsed[1].used_bytes, page);
}
