//! The client calls against a scripted endpoint: what they send, how they page, and
//! what they make of replies a memnode should never send.

use super::*;
use crate::fabric::RdmaOp;
use crate::protocol::MAX_CHUNKS_PER_REPLY;
use std::sync::Mutex;

/// Answers each call with the next scripted reply and records the requests.
struct Scripted {
    replies: Mutex<Vec<Response>>,
    sent: Mutex<Vec<Request>>,
}

impl Scripted {
    fn new(replies: Vec<Response>) -> Scripted {
        Scripted {
            replies: Mutex::new(replies.into_iter().rev().collect()),
            sent: Mutex::new(Vec::new()),
        }
    }

    fn sent(&self) -> Vec<Request> {
        self.sent.lock().expect("lock").clone()
    }
}

impl Endpoint for Scripted {
    fn execute(&self, ops: &mut [RdmaOp<'_>]) -> Vec<Result<(), FabricError>> {
        ops.iter()
            .map(|_| Err(FabricError::Invalid("no data path".into())))
            .collect()
    }

    fn call(&self, frame: &[u8]) -> Result<Vec<u8>, FabricError> {
        let req = Request::decode(frame).expect("the client sends valid frames");
        self.sent.lock().expect("lock").push(req);
        let reply = self.replies.lock().expect("lock").pop();
        Ok(reply.expect("a scripted reply is left").encode())
    }

    fn peer(&self) -> &str {
        "scripted"
    }

    fn is_connected(&self) -> bool {
        true
    }
}

fn chunk(addr: u64) -> Allocation {
    Allocation {
        addr,
        len: 4096,
        rkey: addr as u32,
    }
}

fn summary(name: &str) -> VolumeSummary {
    VolumeSummary {
        name: name.as_bytes().to_vec(),
        volume_id: 1,
        bytes: 4096,
        chunks: 1,
        holder: 0,
    }
}

#[test]
fn volume_chunks_pages_from_the_last_address() {
    let first: Vec<Allocation> = (1..=MAX_CHUNKS_PER_REPLY as u64)
        .map(|i| chunk(i << 12))
        .collect();
    let last = first.last().map_or(0, |c| c.addr);
    let ep = Scripted::new(vec![
        Response::ChunkList {
            chunks: first.clone(),
            more: true,
        },
        Response::ChunkList {
            chunks: vec![chunk(last + 4096)],
            more: false,
        },
    ]);
    let got = volume_chunks(&ep).expect("pages");
    assert_eq!(got.len(), MAX_CHUNKS_PER_REPLY + 1);
    assert_eq!(
        ep.sent(),
        vec![
            Request::VolumeChunks { after: 0 },
            Request::VolumeChunks { after: last }
        ]
    );
}

#[test]
fn volume_list_pages_from_the_last_name() {
    let ep = Scripted::new(vec![
        Response::VolumeListing {
            volumes: vec![summary("a"), summary("b")],
            more: true,
        },
        Response::VolumeListing {
            volumes: vec![summary("c")],
            more: false,
        },
    ]);
    let got: Vec<Vec<u8>> = volume_list(&ep)
        .expect("pages")
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(got, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
    assert_eq!(
        ep.sent(),
        vec![
            Request::VolumeList { after: vec![] },
            Request::VolumeList {
                after: b"b".to_vec()
            }
        ]
    );
}

#[test]
fn pages_that_would_loop_are_refused() {
    let cases: Vec<(&str, Vec<Response>)> = vec![
        (
            "an empty chunk page with more",
            vec![Response::ChunkList {
                chunks: vec![],
                more: true,
            }],
        ),
        (
            "chunks out of order",
            vec![Response::ChunkList {
                chunks: vec![chunk(0x2000), chunk(0x1000)],
                more: false,
            }],
        ),
        (
            "a chunk page repeating the last one",
            vec![
                Response::ChunkList {
                    chunks: vec![chunk(0x2000)],
                    more: true,
                },
                Response::ChunkList {
                    chunks: vec![chunk(0x2000)],
                    more: true,
                },
            ],
        ),
    ];
    for (what, replies) in cases {
        let ep = Scripted::new(replies);
        assert!(
            matches!(volume_chunks(&ep), Err(ControlError::Unexpected { .. })),
            "{what}"
        );
    }
    let cases: Vec<(&str, Vec<Response>)> = vec![
        (
            "an empty volume page with more",
            vec![Response::VolumeListing {
                volumes: vec![],
                more: true,
            }],
        ),
        (
            "names out of order",
            vec![Response::VolumeListing {
                volumes: vec![summary("b"), summary("a")],
                more: false,
            }],
        ),
        (
            "a volume page repeating the last one",
            vec![
                Response::VolumeListing {
                    volumes: vec![summary("b")],
                    more: true,
                },
                Response::VolumeListing {
                    volumes: vec![summary("b")],
                    more: true,
                },
            ],
        ),
    ];
    for (what, replies) in cases {
        let ep = Scripted::new(replies);
        assert!(
            matches!(volume_list(&ep), Err(ControlError::Unexpected { .. })),
            "{what}"
        );
    }
}

#[test]
fn volume_calls_send_what_they_say_and_map_refusals() {
    let info = VolumeInfo {
        volume_id: 9,
        created: true,
        root: chunk(0x1000),
        chunks: 1,
        bytes: 4096,
    };
    let ep = Scripted::new(vec![
        Response::VolumeOpened(info),
        Response::error(ErrorCode::Busy, "held by client 0x2"),
        Response::error(ErrorCode::Fenced, "taken over"),
        Response::error(ErrorCode::NotFound, "no volume"),
        Response::VolumeClosed,
        Response::VolumeDestroyed { bytes: 8192 },
        Response::Freed,
    ]);
    assert_eq!(volume_open(&ep, "v", true, false), Ok(info));
    let busy = volume_open(&ep, "v", false, false).expect_err("busy");
    assert!(busy.is_busy() && !busy.is_fenced() && !busy.is_not_found());
    assert!(busy.to_string().contains("0x2"), "{busy}");
    assert!(volume_close(&ep).expect_err("fenced").is_fenced());
    assert!(volume_destroy(&ep, "w")
        .expect_err("missing")
        .is_not_found());
    assert_eq!(volume_close(&ep), Ok(()));
    assert_eq!(volume_destroy(&ep, "v"), Ok(8192));
    assert!(matches!(
        volume_close(&ep),
        Err(ControlError::Unexpected { .. })
    ));
    assert_eq!(
        ep.sent()[..2],
        [
            Request::VolumeOpen {
                name: b"v".to_vec(),
                create: true,
                takeover: false
            },
            Request::VolumeOpen {
                name: b"v".to_vec(),
                create: false,
                takeover: false
            }
        ]
    );
    for bad in ["", "..", "a/b", &"x".repeat(65)] {
        assert_eq!(
            volume_open(&ep, bad, true, true),
            Err(ControlError::Protocol(ProtocolError::BadField(
                "volume name"
            )))
        );
    }
    assert_eq!(ep.sent().len(), 7, "bad names are never sent");
}
