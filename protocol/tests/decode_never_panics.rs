//! I6: decoding arbitrary bytes is bounded and never panics.

use memarts_protocol::{frame, Limits, Request, Response};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]
    #[test]
    fn arbitrary_frames_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut r: &[u8] = &bytes;
        let _ = frame::read_sync::<Request, _>(&mut r, Limits::REQUEST);
        let mut r: &[u8] = &bytes;
        let _ = frame::read_sync::<Response, _>(&mut r, Limits::RESPONSE);
        let _ = frame::decode_message::<Request>(&bytes);
        let _ = frame::decode_message::<Response>(&bytes);
    }
}
