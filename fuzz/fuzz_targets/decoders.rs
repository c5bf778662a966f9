//! Fuzz target for every decoder of untrusted bytes: WAL stream, record
//! fragments, images, pg_control, page masking (`strata-formats`), the
//! safekeeper protocol frames and the page service protocol frames
//! (`strata-protocol`), and the pageserver's layer files, stored values
//! and metadata (`strata-pageserver`), native redo of heap and btree
//! records (`strata-redo`), the safekeepers' offloaded segment metadata,
//! peer positions and replicas' hot standby feedback (`strata-safekeeper`), a lazy basebackup's
//! manifest (`strata-protocol`), tokens (`strata-service`), and sealed
//! objects, data key objects and storage key files (`strata-remote-storage`),
//! the proxy's SCRAM messages and verifiers (`strata-proxy`), an
//! import's tar stream (`strata-pageserver`), decoded WAL batches and free
//! space map messages (`strata-protocol`), and the console's readers of
//! services' metrics and cookies (`strata-console`).
#![no_main]

/// First byte of inputs meant for the page service decoders. The formats
/// entry point reads its selector modulo 4, so these inputs still reach it.
const PAGE_SERVICE: u8 = 4;
/// First bytes of inputs for the pageserver's decoders: 5 = stored values,
/// directories, names and metadata; 6 = a layer file.
const PAGESERVER: [u8; 2] = [5, 6];
/// First byte of inputs for native redo: heap, heap2 and btree records on a page.
const NATIVE_REDO: u8 = 7;
/// First byte of inputs for the safekeepers' decoders of object storage,
/// peer answers and replicas: offloaded segment metadata, peer positions,
/// hot standby feedback.
const SAFEKEEPER: u8 = 8;
/// First byte of inputs for a lazy basebackup's manifest.
const LAZY_MANIFEST: u8 = 9;
/// First byte of inputs for the token checks: a token, an `Authorization`
/// header, or claims signed and verified.
const TOKEN: u8 = 10;
/// First byte of inputs for encryption at rest: a sealed object, a data
/// key object, a storage key file.
const SEALED: u8 = 11;
/// First byte of inputs for the proxy's SCRAM: a verifier, and the
/// messages of both ends of an exchange.
const SCRAM: u8 = 12;
/// First byte of inputs for the tar stream of `tenant import`, unpacked
/// into a scratch directory.
const IMPORT_TAR: u8 = 13;
/// Decoded WAL batches (`strata_protocol::decoded_wal`).
const DECODED_WAL: u8 = 14;
/// Free space map pages carried in a logical message (`strata_protocol::fsm_pages`).
const FSM_PAGES: u8 = 15;
/// The console's readers: services' metrics, `Cookie` headers, password redaction.
const CONSOLE: u8 = 16;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some((&CONSOLE, bytes)) = data.split_first() {
        strata_console::fuzz_one(bytes);
    }
    strata_formats::fuzz::fuzz_one(data);
    strata_protocol::safekeeper::codec::fuzz_decode(data);
    if let Some((&PAGE_SERVICE, frames)) = data.split_first() {
        strata_protocol::pageserver::codec::fuzz_decode(frames);
    }
    if data.first().is_some_and(|b| PAGESERVER.contains(b)) {
        strata_pageserver::fuzz::fuzz_one(data);
    }
    if let Some((&NATIVE_REDO, record)) = data.split_first() {
        strata_redo::fuzz::fuzz_one(record);
    }
    if let Some((&SAFEKEEPER, bytes)) = data.split_first() {
        let _ = strata_remote_storage::wal::SegmentMeta::decode(bytes);
        let _ = serde_json::from_slice::<Vec<strata_safekeeper::peers::TimelinePositions>>(bytes);
        let _ = strata_safekeeper::standby_feedback::parse_hot_standby_feedback(bytes);
    }
    if let Some((&LAZY_MANIFEST, bytes)) = data.split_first() {
        use strata_protocol::lazy_manifest::Manifest;
        if let Ok(m) = Manifest::decode(bytes) {
            // What decodes encodes to the same bytes: one text per manifest.
            assert_eq!(m.encode().as_bytes(), bytes);
        }
    }
    if let Some((&TOKEN, bytes)) = data.split_first() {
        strata_service::auth::fuzz_one(bytes);
    }
    if let Some((&SEALED, bytes)) = data.split_first() {
        strata_remote_storage::seal::fuzz::fuzz_one(bytes);
    }
    if let Some((&SCRAM, bytes)) = data.split_first() {
        strata_proxy::scram::fuzz_messages(bytes);
        strata_proxy::wire::fuzz_messages(bytes);
    }
    if let Some((&IMPORT_TAR, bytes)) = data.split_first() {
        strata_pageserver::fuzz::fuzz_import_tar(bytes);
    }
    if let Some((&DECODED_WAL, bytes)) = data.split_first() {
        strata_protocol::decoded_wal::fuzz_one(bytes);
    }
    if let Some((&FSM_PAGES, bytes)) = data.split_first() {
        strata_protocol::fsm_pages::fuzz_decode(bytes);
    }
});
