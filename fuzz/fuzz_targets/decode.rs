//! Feed arbitrary bytes to the decoder in arbitrary chunks. Properties:
//! no panic; a poisoned decoder stays poisoned; every decoded frame
//! re-encodes and decodes to the same frame.
#![no_main]

use hull_protocol::{encode, Decoder};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte chooses the chunk size so splits are explored too.
    let (chunk, bytes) = match data.split_first() {
        Some((c, rest)) => (usize::from(*c).max(1), rest),
        None => return,
    };
    let mut d = Decoder::new();
    for piece in bytes.chunks(chunk) {
        if d.feed(piece).is_err() {
            break;
        }
        loop {
            match d.next_frame() {
                Ok(Some(frame)) => {
                    let again = encode(&frame.message, frame.id)
                        .expect("a decoded frame must re-encode");
                    let mut d2 = Decoder::new();
                    d2.feed(&again).expect("feed of one frame");
                    let back = d2.next_frame().expect("re-decode").expect("one frame");
                    assert_eq!(back, frame);
                }
                Ok(None) => break,
                Err(e) => {
                    assert_eq!(d.next_frame(), Err(e), "errors are sticky");
                    return;
                }
            }
        }
    }
});
