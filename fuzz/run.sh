#!/usr/bin/env bash
# Builds the libFuzzer targets with the stable toolchain (SanitizerCoverage
# instrumentation, no cargo-fuzz needed) and runs each for a bounded time,
# seeded with the WAL test vectors. Usage: fuzz/run.sh [SECONDS_PER_TARGET]
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# An explicit --target keeps the instrumentation flags away from build scripts.
host="$(rustc -vV | sed -n 's/^host: //p')"
decoders="./target/$host/release/decoders"

# Copies the clone's files (tracked, and new ones not ignored) into $2,
# rewriting only those whose content differs and removing those gone, so
# that an unchanged file keeps the time of its last build there.
sync_sources() {
    local src="$1" dest="$2" f
    mkdir -p "$dest"
    (cd "$src" && git ls-files -z --cached --others --exclude-standard) >"$dest.files"
    while IFS= read -r -d '' f; do
        [ -f "$src/$f" ] || continue
        if ! cmp -s "$src/$f" "$dest/$f"; then
            mkdir -p "$(dirname "$dest/$f")"
            cp "$src/$f" "$dest/$f"
        fi
    done <"$dest.files"
    comm -13 <(tr '\0' '\n' <"$dest.files" | sort) <(cd "$dest" && find . -type f | sed 's|^\./||' | sort) |
        while IFS= read -r f; do rm -f "$dest/$f"; done
}

# This is a workspace of its own, and cargo names the crates it takes from
# outside it (the whole project) by their absolute path: built from each
# clone where it lies, a shared build cache would hold one build per clone
# path, and scripts/source-times.sh, which dates the clone's files by what
# the cache was last built from, could pass off another path's older build
# as fresh. So with a shared cache (fuzz/target a link into it, see
# scripts/setup-tests.sh) the build runs from one fixed copy of the
# sources beside the cache, which keeps real times of its own.
if [ -L target ]; then
    cache_target="$(readlink -f target)"
    src_copy="$(dirname "$cache_target")/src"
    exec 9>"$src_copy.lock"
    flock 9
    sync_sources "$(cd .. && pwd -P)" "$src_copy"
    ln -sfn "$cache_target" "$src_copy/fuzz/target"
    (cd "$src_copy/fuzz" && cargo build --release --quiet --target "$host" --bin decoders)
    decoders="$cache_target/$host/release/decoders"
else
    cargo build --release --quiet --target "$host" --bin decoders
fi
mkdir -p corpus/decoders artifacts
# Seeds: each WAL vector behind every selector byte.
for f in ../formats/tests/data/wal/*.wal ../formats/tests/data/pg_control_v15; do
    for sel in 0 1 2 3; do
        out="corpus/decoders/seed-$sel-$(basename "$f")"
        [ -f "$out" ] || { printf "\\x0$sel" > "$out"; head -c 32768 "$f" >> "$out"; }
    done
done
# Page service seeds: test vectors of docs/pageserver-protocol.md behind
# their selector byte (4), one file per direction.
seed_hex() {
    local out="corpus/decoders/$1" hex="$2" i
    [ -f "$out" ] && return
    for ((i = 0; i < ${#hex}; i += 2)); do printf "\\x${hex:i:2}"; done > "$out"
}
seed_hex seed-page-client "04\
2500000001010000001111111111111111111111111111111122222222222222222222222222222222\
2500000010070000000000000028000001000000007f06000005000000004000000000000003000000\
2100000012080000000000000000000000000000007f060000050000000040000002000000\
16000000140b0000000000000000000000000000000002000000"
seed_hex seed-page-server "04\
090000008128000003000000\
0d000000920800000000000000d2040000\
1a0000009f000000000000000003000b0000006e6f2074696d656c696e65"
# Pageserver seeds: the layer file vectors (selector 6) and a timeline metadata file (5).
[ -f corpus/decoders/seed-layer ] || { printf "\\x06" > corpus/decoders/seed-layer; cat ../pageserver/tests/data/layer-v1.delta >> corpus/decoders/seed-layer; }
# The lazy manifest vector (selector 9).
[ -f corpus/decoders/seed-lazy-manifest-v2 ] || printf '\x09strata lazy manifest 2\nlsn 0/1500780\nbase/5/1249 61\nbase/5/16384_fsm 3\nbase/5/16384_vm 1\nglobal/1262 1\nend 4\n' > corpus/decoders/seed-lazy-manifest-v2
[ -f corpus/decoders/seed-image-layer ] || { printf "\\x06" > corpus/decoders/seed-image-layer; cat ../pageserver/tests/data/layer-v1.image >> corpus/decoders/seed-image-layer; }
# Safekeeper seeds (selector 8): offloaded segment metadata.
[ -f corpus/decoders/seed-segment-meta ] || printf '\x08{"format_version":1,"segment_size":16777216,"start_lsn":"0/1000000","end_lsn":"0/2000000","crc32c":1,"wal_start_lsn":"0/1500780","uploaded_by":1}' > corpus/decoders/seed-segment-meta
for v in layer-v2.delta layer-v2.image; do
    [ -f "corpus/decoders/seed-$v" ] || { printf "\\x06" > "corpus/decoders/seed-$v"; cat "../pageserver/tests/data/$v" >> "corpus/decoders/seed-$v"; }
done
[ -f corpus/decoders/seed-index ] || { printf "\\x05" > corpus/decoders/seed-index; cat ../pageserver/tests/data/index-v1.json >> corpus/decoders/seed-index; }
[ -f corpus/decoders/seed-metadata ] || { printf "\\x05" > corpus/decoders/seed-metadata; cat ../pageserver/tests/data/metadata-v1.json >> corpus/decoders/seed-metadata; }
# Token seeds (selector 10): claims of each scope, and a token's shape.
[ -f corpus/decoders/seed-claims-tenant ] || printf '\x0a{"scope":"tenant","tenant_id":"0123456789abcdef0123456789abcdef","iat":1,"exp":4000000000}' > corpus/decoders/seed-claims-tenant
[ -f corpus/decoders/seed-claims-timeline ] || printf '\x0a{"scope":"tenant","tenant_id":"0123456789abcdef0123456789abcdef","timeline_id":"00112233445566778899aabbccddeeff","read_only":true,"iat":1}' > corpus/decoders/seed-claims-timeline
[ -f corpus/decoders/seed-claims-service ] || printf '\x0a{"scope":"service","iat":1}' > corpus/decoders/seed-claims-service
[ -f corpus/decoders/seed-deny-list ] || printf '\x0a{"version":1,"revoked":[{"jti":"00112233445566778899aabbccddeeff","until":1796000000},{"jti":"a-b_c"}]}' > corpus/decoders/seed-deny-list
[ -f corpus/decoders/seed-key-file ] || { printf "\\x0a" > corpus/decoders/seed-key-file; cat ../service/tests/data/auth/public.pem >> corpus/decoders/seed-key-file; }
[ -f corpus/decoders/seed-token-v3 ] || { printf "\\x0a" > corpus/decoders/seed-token-v3; cat ../service/tests/data/auth/replica-v3.token >> corpus/decoders/seed-token-v3; }
[ -f corpus/decoders/seed-token ] || printf '\x0aeyJ0eXAiOiJKV1QiLCJhbGciOiJFZERTQSJ9.eyJzY29wZSI6Im1hbmFnZW1lbnQiLCJpYXQiOjF9.AAAA' > corpus/decoders/seed-token
# Encryption at rest seeds (selector 11): the sealed object vectors, a data
# key object, a storage key file.
seed_sealed() {
    local out="corpus/decoders/seed-sealed-$1"
    [ -f "$out" ] && return
    seed_hex "seed-sealed-$1" "0b$(sed -n "s/^sealed = //p" ../remote_storage/tests/data/sealed-v1.txt | sed -n "$1p")"
}
for i in 1 2 3; do seed_sealed "$i"; done
[ -f corpus/decoders/seed-data-keys ] || printf '\x0b{"format_version":1,"tenant":"00000000000000000000000000000000","keys":[{"id":1,"cluster_key":1,"nonce":"000000000000000000000000","wrapped":"%096d"}]}' 0 > corpus/decoders/seed-data-keys
[ -f corpus/decoders/seed-storage-key ] || printf '\x0b# cluster storage keys\n2 %064d\n1 %064d\n' 2 1 > corpus/decoders/seed-storage-key
# SCRAM seeds (selector 12): a client's first and final messages, a verifier.
[ -f corpus/decoders/seed-scram-first ] || printf '\x0cn,,n=,r=rOprNGfwEbeRWgbNEkqOc=biws,r=rOprNGfwEbeRWgbNEkqO%%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=' > corpus/decoders/seed-scram-first
[ -f corpus/decoders/seed-scram-server ] || printf '\x0cr=clientnonceXYZ,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=' > corpus/decoders/seed-scram-server
[ -f corpus/decoders/seed-scram-verifier ] || printf '\x0cSCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=' > corpus/decoders/seed-scram-verifier
# The proxy's wire decoders share it: a startup packet's body, a cancel request.
[ -f corpus/decoders/seed-pg-startup ] || printf '\x0c\x00\x03\x00\x00user\0app\0database\0postgres\0options\0endpoint=ep1\0\0' > corpus/decoders/seed-pg-startup
[ -f corpus/decoders/seed-pg-cancel ] || printf '\x0c\x04\xd2\x16\x2e\x00\x00\x00\x07\x01\x02\x03\x04' > corpus/decoders/seed-pg-cancel
# Decoded WAL (selector 14): a compressed batch of a whole record and a
# skeleton through a stream decoder, and the same batch's Protobuf bytes.
seed_hex seed-decoded-stream "0e014700000046000000738d86fb28b52ffd0038f4010054030a32102e1a2e2e00000005000b002002007f06000005000000104000000100000007070a10082a103320063208ff0c05908001000902006060032401"
seed_hex seed-decoded-batch "0e000a32102e1a2e2e000000050000000000000000000000000b000000000000002002007f06000005000000104000000100000007070a10082a103320063208ff0c059080010009"
# Free space map pages (selector 15): one page of 1663/5/16384_fsm, block 2.
seed_hex seed-fsm-pages "0f5346534d01010028b52ffd60101fd50000807f060000050000000040000002001100031000d4df4b77d94a"
# An import's tar stream (selector 13): a data directory's first files.
if [ ! -f corpus/decoders/seed-import-tar ]; then
    seed_dir="$(mktemp -d)"
    mkdir -p "$seed_dir/global" "$seed_dir/base/1"
    printf '15\n' > "$seed_dir/PG_VERSION"
    head -c 1024 ../formats/tests/data/pg_control_v15 > "$seed_dir/global/pg_control"
    printf 'x' > "$seed_dir/base/1/1259"
    { printf '\x0d'; tar -cf - -C "$seed_dir" PG_VERSION global base; } > corpus/decoders/seed-import-tar
    rm -rf "$seed_dir"
fi
"$decoders" corpus/decoders -max_total_time="$seconds" -max_len=65536 \
    -artifact_prefix=artifacts/ -print_final_stats=1 2>&1 | tail -n 12
