//! Guards the frame decoder against losing, reordering or corrupting frames
//! when bytes arrive split at any point, against copying payloads out of the
//! receive buffer, and against hostile input: garbage, bad magic, bad CRC,
//! oversize lengths, unknown kinds or versions must each be refused with a
//! precise error, without panicking and without reserving the announced length.

use bytes::Bytes;
use cairn_net::frame::{
    encode_frame, encode_header, FrameDecoder, FrameError, FrameKind, HEADER_BYTES, MAGIC,
};
use proptest::prelude::*;

const MAX: u32 = 1 << 20;
const READ_BUFFER_BYTES: usize = 64 * 1024;

fn sample_frames() -> Vec<(FrameKind, u16, u32, Vec<u8>)> {
    vec![
        (FrameKind::Message, 0, 0, Vec::new()),
        (FrameKind::Message, 0xffff, u32::MAX, b"x".to_vec()),
        (
            FrameKind::Message,
            3,
            17,
            (0..1000u32).map(|i| i as u8).collect(),
        ),
        (FrameKind::StreamStart, 0, 2, vec![1; 12]),
        (FrameKind::StreamChunk, 0, 2, vec![7; 300]),
        (FrameKind::StreamEnd, 0, 2, vec![9; 20]),
        (FrameKind::Hello, 0, 0, vec![0; 28]),
    ]
}

fn encode_all(frames: &[(FrameKind, u16, u32, Vec<u8>)]) -> Vec<u8> {
    frames
        .iter()
        .flat_map(|(k, f, s, p)| encode_frame(*k, *f, *s, p))
        .collect()
}

fn drain(
    decoder: &mut FrameDecoder,
    out: &mut Vec<(FrameKind, u16, u32, Vec<u8>)>,
) -> Result<(), FrameError> {
    while let Some(frame) = decoder.decode()? {
        out.push((
            frame.kind,
            frame.flags,
            frame.shard_id,
            frame.payload.to_vec(),
        ));
    }
    Ok(())
}

#[test]
fn every_kind_round_trips() {
    let frames = sample_frames();
    let mut decoder = FrameDecoder::new(MAX, READ_BUFFER_BYTES);
    decoder.extend_from_slice(&encode_all(&frames));
    let mut out = Vec::new();
    drain(&mut decoder, &mut out).unwrap();
    assert_eq!(out, frames);
    assert_eq!(decoder.buffered_bytes(), 0);
}

#[test]
fn partial_reads_at_every_split_point() {
    let frames = sample_frames();
    let wire = encode_all(&frames);
    for split in 0..=wire.len() {
        let mut decoder = FrameDecoder::new(MAX, READ_BUFFER_BYTES);
        let mut out = Vec::new();
        decoder.extend_from_slice(&wire[..split]);
        drain(&mut decoder, &mut out).unwrap();
        decoder.extend_from_slice(&wire[split..]);
        drain(&mut decoder, &mut out).unwrap();
        assert_eq!(out, frames, "split at byte {split}");
    }
}

#[test]
fn one_byte_at_a_time() {
    let frames = sample_frames();
    let wire = encode_all(&frames);
    let mut decoder = FrameDecoder::new(MAX, READ_BUFFER_BYTES);
    let mut out = Vec::new();
    for byte in &wire {
        decoder.extend_from_slice(std::slice::from_ref(byte));
        drain(&mut decoder, &mut out).unwrap();
    }
    assert_eq!(out, frames);
}

#[test]
fn payloads_point_into_the_receive_buffer() {
    let wire = encode_all(&[
        (FrameKind::Message, 0, 1, vec![1; 100]),
        (FrameKind::Message, 0, 2, vec![2; 200]),
        (FrameKind::Message, 0, 3, vec![3; 50]),
    ]);
    let mut decoder = FrameDecoder::new(MAX, READ_BUFFER_BYTES);
    decoder.prepare_read();
    // Where the socket would write: the spare capacity of the receive buffer.
    let buffer_start = decoder.buffer_mut().as_ptr() as usize;
    let buffer_end = buffer_start + decoder.buffer_mut().capacity();
    decoder.extend_from_slice(&wire);
    assert_eq!(
        decoder.buffer_mut().as_ptr() as usize,
        buffer_start,
        "no reallocation for this test"
    );
    let mut expected_start = buffer_start;
    for len in [100usize, 200, 50] {
        let frame = decoder.decode().unwrap().unwrap();
        let payload_start = frame.payload.as_ptr() as usize;
        assert_eq!(
            payload_start,
            expected_start + HEADER_BYTES,
            "payload is the bytes right after its header"
        );
        assert!(
            payload_start + len <= buffer_end,
            "payload lies inside the receive buffer"
        );
        expected_start = payload_start + len;
    }
}

#[test]
fn multi_part_header_decodes_as_one_payload() {
    let parts = [
        Bytes::from_static(b"raft-msg:"),
        Bytes::from(vec![5u8; 1000]),
    ];
    let header = encode_header(FrameKind::Message, 1, 9, &parts);
    let mut decoder = FrameDecoder::new(MAX, READ_BUFFER_BYTES);
    decoder.extend_from_slice(&header);
    for part in &parts {
        decoder.extend_from_slice(part);
    }
    let frame = decoder.decode().unwrap().unwrap();
    assert_eq!(&frame.payload[..9], b"raft-msg:");
    assert_eq!(frame.payload.len(), 1009);
}

fn decode_error(wire: &[u8]) -> FrameError {
    let mut decoder = FrameDecoder::new(MAX, READ_BUFFER_BYTES);
    decoder.extend_from_slice(wire);
    loop {
        match decoder.decode() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("no error for {} bytes", wire.len()),
            Err(err) => {
                // The decoder stays failed: a broken stream cannot resynchronise.
                assert_eq!(decoder.decode().unwrap_err(), err);
                return err;
            }
        }
    }
}

#[test]
fn garbage_is_refused_at_its_first_byte() {
    let mut decoder = FrameDecoder::new(MAX, READ_BUFFER_BYTES);
    decoder.extend_from_slice(b"G");
    assert!(matches!(
        decoder.decode(),
        Err(FrameError::BadMagic { offset: 0, .. })
    ));
    let err = decode_error(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        matches!(err, FrameError::BadMagic { offset: 0, .. }),
        "{err}"
    );
}

#[test]
fn bad_magic_after_a_good_frame_names_its_offset() {
    let mut wire = encode_frame(FrameKind::Message, 0, 1, b"ok");
    let mut bad = encode_frame(FrameKind::Message, 0, 1, b"no");
    bad[0] = b'X';
    wire.extend_from_slice(&bad);
    let err = decode_error(&wire);
    assert_eq!(
        err,
        FrameError::BadMagic {
            offset: (HEADER_BYTES + 2) as u64,
            found: b"XRNF".to_vec()
        }
    );
}

#[test]
fn bad_crc_in_payload_or_header_is_refused() {
    let good = encode_frame(FrameKind::Message, 0, 4, b"payload");
    let mut payload_flip = good.clone();
    *payload_flip.last_mut().unwrap() ^= 1;
    assert!(matches!(
        decode_error(&payload_flip),
        FrameError::BadCrc { .. }
    ));
    let mut shard_flip = good.clone();
    shard_flip[8] ^= 1; // shard id, covered by the CRC too
    assert!(matches!(
        decode_error(&shard_flip),
        FrameError::BadCrc { .. }
    ));
    let mut crc_flip = good;
    crc_flip[HEADER_BYTES - 1] ^= 0x80;
    assert!(matches!(decode_error(&crc_flip), FrameError::BadCrc { .. }));
}

#[test]
fn oversize_length_is_refused_before_any_allocation() {
    let mut header = encode_frame(FrameKind::Message, 0, 0, b"")[..HEADER_BYTES].to_vec();
    header[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut decoder = FrameDecoder::new(MAX, READ_BUFFER_BYTES);
    decoder.extend_from_slice(&header);
    let err = decoder.decode().unwrap_err();
    assert_eq!(
        err,
        FrameError::Oversize {
            offset: 0,
            len_bytes: u32::MAX,
            max_bytes: MAX
        }
    );
    decoder.prepare_read();
    assert!(
        decoder.buffer_mut().capacity() <= 2 * READ_BUFFER_BYTES,
        "the announced 4 GiB was never reserved: capacity {}",
        decoder.buffer_mut().capacity()
    );
    // Exactly at the maximum is fine.
    let mut at_max = header.clone();
    at_max[12..16].copy_from_slice(&MAX.to_le_bytes());
    let mut decoder = FrameDecoder::new(MAX, READ_BUFFER_BYTES);
    decoder.extend_from_slice(&at_max);
    assert!(decoder.decode().unwrap().is_none());
}

#[test]
fn unknown_kind_version_and_flags_are_refused() {
    let mut kind = encode_frame(FrameKind::Message, 0, 0, b"");
    kind[5] = 200;
    assert_eq!(
        decode_error(&kind),
        FrameError::UnknownKind {
            offset: 0,
            kind: 200
        }
    );
    let mut version = encode_frame(FrameKind::Message, 0, 0, b"");
    version[4] = 9;
    assert_eq!(
        decode_error(&version),
        FrameError::UnsupportedVersion {
            offset: 0,
            found: 9
        }
    );
    let mut flags = encode_frame(FrameKind::StreamAck, 0, 0, &[0; 16]);
    flags[6] = 1;
    assert!(matches!(decode_error(&flags), FrameError::BadFlags { .. }));
}

#[test]
fn decoder_memory_is_bounded_by_its_largest_frame() {
    let wire = encode_all(&[
        (FrameKind::Message, 0, 1, vec![1; 200_000]),
        (FrameKind::Message, 0, 2, vec![2; 10]),
    ]);
    let mut decoder = FrameDecoder::new(MAX, READ_BUFFER_BYTES);
    let mut out = Vec::new();
    for chunk in wire.chunks(4096) {
        decoder.prepare_read();
        decoder.extend_from_slice(chunk);
        drain(&mut decoder, &mut out).unwrap();
        assert!(
            decoder.buffer_mut().capacity() <= 2 * (200_000 + HEADER_BYTES + READ_BUFFER_BYTES)
        );
    }
    assert_eq!(out.len(), 2);
}

fn arb_frame() -> impl Strategy<Value = (FrameKind, u16, u32, Vec<u8>)> {
    (
        prop_oneof![
            Just(FrameKind::Message),
            Just(FrameKind::StreamChunk),
            Just(FrameKind::StreamAck)
        ],
        any::<u16>(),
        any::<u32>(),
        prop::collection::vec(any::<u8>(), 0..600),
    )
        .prop_map(|(kind, flags, shard, payload)| {
            let flags = if kind == FrameKind::Message { flags } else { 0 };
            (kind, flags, shard, payload)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random bytes, fed in random pieces, never panic the decoder, never make it
    /// hold more than the bytes given plus one read buffer, and whatever it
    /// returns before failing carries a valid CRC.
    #[test]
    fn random_bytes_never_panic(
        mut bytes in prop::collection::vec(any::<u8>(), 0..4096),
        cuts in prop::collection::vec(1usize..512, 1..16),
        start_with_magic in any::<bool>(),
    ) {
        if start_with_magic && bytes.len() >= MAGIC.len() {
            bytes[..MAGIC.len()].copy_from_slice(&MAGIC);
            if bytes.len() > 4 { bytes[4] = 1; }
        }
        let mut decoder = FrameDecoder::new(4096, 4096);
        let mut fed = 0usize;
        let mut cut = cuts.iter().cycle();
        'feed: while fed < bytes.len() {
            let n = (*cut.next().unwrap()).min(bytes.len() - fed);
            decoder.prepare_read();
            decoder.extend_from_slice(&bytes[fed..fed + n]);
            fed += n;
            loop {
                match decoder.decode() {
                    Ok(Some(frame)) => prop_assert!(frame.payload.len() <= 4096),
                    Ok(None) => break,
                    Err(_) => break 'feed,
                }
            }
            prop_assert!(decoder.buffered_bytes() <= fed);
            prop_assert!(decoder.buffer_mut().capacity() <= 8 * (4096 + HEADER_BYTES));
        }
    }

    /// Valid frames, cut into random pieces, come out identical and in order.
    #[test]
    fn valid_streams_survive_any_cutting(
        frames in prop::collection::vec(arb_frame(), 0..20),
        cuts in prop::collection::vec(1usize..700, 1..20),
    ) {
        let wire = encode_all(&frames);
        let mut decoder = FrameDecoder::new(MAX, 1024);
        let mut out = Vec::new();
        let mut fed = 0usize;
        let mut cut = cuts.iter().cycle();
        while fed < wire.len() {
            let n = (*cut.next().unwrap()).min(wire.len() - fed);
            decoder.prepare_read();
            decoder.extend_from_slice(&wire[fed..fed + n]);
            fed += n;
            drain(&mut decoder, &mut out).unwrap();
        }
        prop_assert_eq!(out, frames);
        prop_assert_eq!(decoder.buffered_bytes(), 0);
    }

    /// Flipping any single bit of a valid stream is detected (CRC32 catches
    /// every single-bit error) or, in the header, refused outright.
    #[test]
    fn single_bit_flips_are_detected(
        frames in prop::collection::vec(arb_frame(), 1..5),
        bit in any::<prop::sample::Index>(),
    ) {
        let mut wire = encode_all(&frames);
        let bit = bit.index(wire.len() * 8);
        wire[bit / 8] ^= 1 << (bit % 8);
        let mut decoder = FrameDecoder::new(MAX, 1024);
        decoder.extend_from_slice(&wire);
        let mut out = Vec::new();
        let result = drain(&mut decoder, &mut out);
        // Either an error, or (a flipped length made a frame look longer) the
        // decoder waits for bytes that never come; never a wrong frame.
        prop_assert!(result.is_err() || decoder.buffered_bytes() > 0);
        for (i, frame) in out.iter().enumerate() {
            prop_assert_eq!(frame, &frames[i]);
        }
    }
}
