//! The control protocol's decoders (SEND/RECV: hello, alloc, free, stats, volumes)
//! on arbitrary frames: an error or a message, never a panic; and a message that
//! decodes encodes back to a frame that decodes to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmemfs_common::protocol::{Request, Response};

fuzz_target!(|frame: &[u8]| {
    if let Ok(req) = Request::decode(frame) {
        let again = Request::decode(&req.encode()).expect("a re-encoded request decodes");
        assert_eq!(again, req);
    }
    if let Ok(resp) = Response::decode(frame) {
        let again = Response::decode(&resp.encode()).expect("a re-encoded response decodes");
        assert_eq!(again, resp);
    }
});
