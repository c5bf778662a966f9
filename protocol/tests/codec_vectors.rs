//! Test vectors of the safekeeper protocol: exact frames (length prefix
//! included) for a few messages, as listed in `docs/safekeeper-protocol.md`.
//! Spaces in the hex strings separate fields and mean nothing.

use strata_formats::Lsn;
use strata_protocol::decoded_wal::StreamFormat;
use strata_protocol::safekeeper::codec::{
    decode_acceptor, decode_consumer, decode_proposer, decode_stream, encode_acceptor, encode_consumer,
    encode_proposer, encode_stream, split_frame, CodecError,
};
use strata_protocol::safekeeper::{
    AcceptorGreeting, AcceptorMessage, AppendRequest, AppendResponse, ConsumerMessage, DecodedWal, ErrorCode,
    ErrorMessage, Member, Membership, OnAsyncLag, Placement, ProposerElected, ProposerGreeting, ProposerMessage,
    StandbyFeedback, StartStreaming, StreamMessage, TermHistory, TermLsn, TimelineIdentity, VoteRequest, VoteResponse,
    WalData,
};
use strata_protocol::shard::{ShardIndex, DEFAULT_STRIPE_BLOCKS};
use strata_protocol::{NodeId, TenantId, TimelineId, Token};

fn history(entries: &[(u64, u64)]) -> TermHistory {
    TermHistory(entries.iter().map(|&(term, lsn)| TermLsn { term, lsn: Lsn(lsn) }).collect())
}

fn unhex(spaced: &str) -> Vec<u8> {
    let compact: String = spaced.split_whitespace().collect();
    hex::decode(compact).expect("valid hex in a test vector")
}

/// Checks that `frame` splits off whole and, tag and payload, decodes with `decode` to `expected`.
fn check_decode<T: PartialEq + std::fmt::Debug, E: std::fmt::Debug>(
    frame: &[u8],
    decode: fn(&[u8]) -> Result<T, E>,
    expected: &T,
) {
    let (consumed, body) = split_frame(frame).unwrap().expect("a whole frame");
    assert_eq!(consumed, frame.len());
    assert_eq!(&decode(body).unwrap(), expected);
}

fn proposer(msg: ProposerMessage, vector: &str) {
    let mut out = Vec::new();
    encode_proposer(&msg, &mut out);
    assert_eq!(hex::encode(&out), hex::encode(unhex(vector)), "{msg:?}");
    check_decode(&unhex(vector), decode_proposer, &msg);
}

fn acceptor(msg: AcceptorMessage, vector: &str) {
    let mut out = Vec::new();
    encode_acceptor(&msg, &mut out);
    assert_eq!(hex::encode(&out), hex::encode(unhex(vector)), "{msg:?}");
    check_decode(&unhex(vector), decode_acceptor, &msg);
}

fn consumer(msg: ConsumerMessage, vector: &str) {
    let mut out = Vec::new();
    encode_consumer(&msg, &mut out);
    assert_eq!(hex::encode(&out), hex::encode(unhex(vector)), "{msg:?}");
    check_decode(&unhex(vector), decode_consumer, &msg);
}

fn stream(msg: StreamMessage, vector: &str) {
    let mut out = Vec::new();
    encode_stream(&msg, &mut out);
    assert_eq!(hex::encode(&out), hex::encode(unhex(vector)), "{msg:?}");
    check_decode(&unhex(vector), decode_stream, &msg);
}

fn member(id: u64, address: &str) -> Member {
    Member::new(NodeId(id), address)
}

#[test]
fn proposer_greeting() {
    proposer(
        ProposerMessage::Greeting(ProposerGreeting {
            protocol_version: 7,
            proposer_id: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
            timeline: TimelineIdentity {
                tenant_id: TenantId([0x11; 16]),
                timeline_id: TimelineId([0x22; 16]),
                system_id: 0x0102_0304_0506_0708,
                pg_version: 15,
                wal_segment_size: 16 << 20,
            },
            membership: Membership::default(),
            token: Some(Token::new("tok".into())),
        }),
        "55000000 01 07000000 000102030405060708090a0b0c0d0e0f
         11111111111111111111111111111111 22222222222222222222222222222222
         0807060504030201 0f000000 00000001
         00000000 0000 00 00 00 03000000 746f6b",
    );
}

#[test]
fn standby_feedback() {
    acceptor(
        AcceptorMessage::StandbyFeedback(StandbyFeedback { xmin: (2 << 32) | 731, catalog_xmin: 0 }),
        "11000000 84 db02000002000000 0000000000000000",
    );
}

#[test]
fn a_version_2_greeting_is_reported_as_an_unsupported_version() {
    // The version 2 layout had no token: it reads short, and the version says why.
    let v2 = unhex(
        "4c000000 01 02000000 000102030405060708090a0b0c0d0e0f
         11111111111111111111111111111111 22222222222222222222222222222222
         0807060504030201 0f000000 00000001
         00000000 0000 00",
    );
    let err = decode_proposer(&v2[4..]).unwrap_err();
    assert!(matches!(err, CodecError::UnsupportedVersion { version: 2, .. }), "{err:?}");
}

#[test]
fn vote_request() {
    proposer(ProposerMessage::VoteRequest(VoteRequest { term: 5 }), "09000000 02 0500000000000000");
}

#[test]
fn proposer_elected() {
    proposer(
        ProposerMessage::Elected(ProposerElected {
            term: 5,
            start_streaming_at: Lsn(0x2800),
            term_history: history(&[(1, 0x1000), (5, 0x3000)]),
            timeline_start_lsn: Lsn(0x1000),
        }),
        "3d000000 03 0500000000000000 0028000000000000 0010000000000000
         02000000 0100000000000000 0010000000000000 0500000000000000 0030000000000000",
    );
}

#[test]
fn append_request() {
    proposer(
        ProposerMessage::Append(AppendRequest {
            term: 5,
            begin_lsn: Lsn(0x3000),
            commit_lsn: Lsn(0x2f00),
            truncate_lsn: Lsn(0x1000),
            wal: vec![1, 2, 3, 4, 5],
        }),
        "26000000 04 0500000000000000 0030000000000000 002f000000000000 0010000000000000 0102030405",
    );
}

#[test]
fn acceptor_greeting() {
    acceptor(
        AcceptorMessage::Greeting(AcceptorGreeting {
            protocol_version: 2,
            node_id: NodeId(7),
            term: 4,
            membership: Membership {
                generation: 3,
                members: vec![member(1, "a:1"), member(2, "b:2")],
                new_members: Some(vec![member(1, "a:1"), member(4, "d:4")]),
                ..Default::default()
            },
        }),
        "6c000000 81 02000000 0700000000000000 0400000000000000
         03000000 0200 0100000000000000 03000000 613a31 00000000 0200000000000000 03000000 623a32 00000000
         01 0200 0100000000000000 03000000 613a31 00000000 0400000000000000 03000000 643a34 00000000
         00 00",
    );
}

#[test]
fn acceptor_greeting_with_sites_and_a_placement_change() {
    let sited = |id, address, site: &str| Member { site: Some(site.into()), ..member(id, address) };
    acceptor(
        AcceptorMessage::Greeting(AcceptorGreeting {
            protocol_version: 7,
            node_id: NodeId(7),
            term: 4,
            membership: Membership {
                generation: 4,
                members: vec![sited(1, "a:1", "dc1"), sited(2, "b:2", "dc2")],
                new_members: None,
                placement: Placement::Stretched,
                new_placement: Some(Placement::LocalQuorum {
                    home: "dc2".into(),
                    max_async_lag: 0x10_0000,
                    on_async_lag: OnAsyncLag::Throttle,
                }),
            },
        }),
        "5b000000 81 07000000 0700000000000000 0400000000000000
         04000000 0200 0100000000000000 03000000 613a31 03000000 646331
         0200000000000000 03000000 623a32 03000000 646332
         00 02 01 01 03000000 646332 0000100000000000 01",
    );
}

#[test]
fn vote_response() {
    acceptor(
        AcceptorMessage::VoteResponse(VoteResponse {
            term: 5,
            vote_given: true,
            flush_lsn: Lsn(0x3000),
            truncate_lsn: Lsn(0x1000),
            term_history: history(&[(1, 0x1000), (3, 0x2000)]),
            timeline_start_lsn: Lsn(0x1000),
        }),
        "46000000 82 0500000000000000 01 0030000000000000 0010000000000000 0010000000000000
         02000000 0100000000000000 0010000000000000 0300000000000000 0020000000000000",
    );
}

#[test]
fn append_response() {
    acceptor(
        AcceptorMessage::AppendResponse(AppendResponse {
            term: 5,
            flush_lsn: Lsn(0x3005),
            commit_lsn: Lsn(0x3000),
            consumer_applied_lsn: Lsn(0x2000),
        }),
        "21000000 83 0500000000000000 0530000000000000 0030000000000000 0020000000000000",
    );
}

#[test]
fn acceptor_error() {
    acceptor(
        AcceptorMessage::Error(ErrorMessage { code: ErrorCode::Version, message: "need v1".into() }),
        "0e000000 8f 0200 07000000 6e656564207631",
    );
}

#[test]
fn start_streaming() {
    let start = |protocol_version, token: Option<&str>| {
        ConsumerMessage::Start(StartStreaming {
            protocol_version,
            tenant_id: TenantId([0x11; 16]),
            timeline_id: TimelineId([0x22; 16]),
            start_lsn: Lsn(0x1000),
            stop_lsn: Lsn::INVALID,
            include_uncommitted: false,
            consumer_id: "ps-1".into(),
            token: token.map(|t| Token::new(t.into())),
            generation: if protocol_version >= 5 { 7 } else { 0 },
            shard: if protocol_version >= 8 { ShardIndex::new(1, 4).unwrap() } else { ShardIndex::UNSHARDED },
            format: if protocol_version >= 9 { StreamFormat::Decoded } else { StreamFormat::Raw },
            stripe_blocks: if protocol_version >= 9 { 256 } else { DEFAULT_STRIPE_BLOCKS },
        })
    };
    // Version 9 ends with the format (decoded) and the stripe size (256).
    consumer(
        start(9, Some("tok")),
        "50000000 10 09000000 11111111111111111111111111111111 22222222222222222222222222222222
         0010000000000000 0000000000000000 00 04000000 70732d31 03000000 746f6b 07000000 01 04 01 00010000",
    );
    // Version 8 ends with the shard (number 1 of 4).
    consumer(
        start(8, Some("tok")),
        "4b000000 10 08000000 11111111111111111111111111111111 22222222222222222222222222222222
         0010000000000000 0000000000000000 00 04000000 70732d31 03000000 746f6b 07000000 01 04",
    );
    // Version 5 ends with the attachment generation.
    consumer(
        start(5, Some("tok")),
        "49000000 10 05000000 11111111111111111111111111111111 22222222222222222222222222222222
         0010000000000000 0000000000000000 00 04000000 70732d31 03000000 746f6b 07000000",
    );
    consumer(
        start(3, Some("tok")),
        "45000000 10 03000000 11111111111111111111111111111111 22222222222222222222222222222222
         0010000000000000 0000000000000000 00 04000000 70732d31 03000000 746f6b",
    );
    // Versions 1 and 2 have no token field; safekeepers still serve them (a
    // safekeeper that checks tokens refuses them as carrying none).
    consumer(
        start(2, None),
        "3e000000 10 02000000 11111111111111111111111111111111 22222222222222222222222222222222
         0010000000000000 0000000000000000 00 04000000 70732d31",
    );
    // An empty token of version 3 is none.
    consumer(
        start(3, None),
        "42000000 10 03000000 11111111111111111111111111111111 22222222222222222222222222222222
         0010000000000000 0000000000000000 00 04000000 70732d31 00000000",
    );
}

#[test]
fn wal_data() {
    stream(
        StreamMessage::Wal(WalData {
            begin_lsn: Lsn(0x3000),
            commit_lsn: Lsn(0x3000),
            flush_lsn: Lsn(0x3005),
            wal: vec![1, 2, 3, 4, 5],
        }),
        "1e000000 91 0030000000000000 0030000000000000 0530000000000000 0102030405",
    );
}

#[test]
fn decoded_wal() {
    stream(
        StreamMessage::Decoded(DecodedWal {
            begin_lsn: Lsn(0x3000),
            end_lsn: Lsn(0x3080),
            last_record_lsn: Lsn(0x3040),
            read_lsn: Lsn(0x3090),
            commit_lsn: Lsn(0x3090),
            flush_lsn: Lsn(0x3100),
            batch_len: 5,
            crc32c: 0x0102_0304,
            payload: vec![0xaa, 0xbb],
        }),
        "3b000000 93 0030000000000000 8030000000000000 4030000000000000 9030000000000000 9030000000000000
         0031000000000000 05000000 04030201 aabb",
    );
}

#[test]
fn vectors_are_rejected_by_other_directions_and_when_damaged() {
    // The VoteResponse vector with vote_given = 2.
    let mut frame = unhex(
        "46000000 82 0500000000000000 02 0030000000000000 0010000000000000 0010000000000000
         02000000 0100000000000000 0010000000000000 0300000000000000 0020000000000000",
    );
    assert!(decode_acceptor(&frame[4..]).unwrap_err().to_string().contains("vote_given"));
    // The same with the history's terms out of order (3 then 1).
    frame[13] = 1;
    frame[58] = 1;
    frame[42] = 3;
    assert!(decode_acceptor(&frame[4..]).unwrap_err().to_string().contains("invalid term history"));
    // An acceptor greeting is not a proposer message.
    let greeting = unhex("15000000 81 01000000 0700000000000000 0400000000000000");
    assert!(decode_proposer(&greeting[4..]).is_err());
    assert!(decode_stream(&greeting[4..]).is_err());
}
