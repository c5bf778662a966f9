#!/usr/bin/env bash
# Lets a fresh clone reuse the build cache (scripts/setup-tests.sh links
# `target` into it). Cargo decides whether a crate of the workspace is
# fresh by comparing its sources' modification times with its last build,
# and every file of a fresh clone is new: without this, each CI run builds
# every crate of the workspace again (three times: the checked build, the
# test build and clippy's), even those no commit touched. The fuzzer's
# build does not go by these times: it builds from a copy of its own
# (fuzz/run.sh says why).
#
#   source-times.sh restore   before building: every tracked file whose
#                             content is what the cache was last built
#                             from gets an old time (2000-01-01), so cargo
#                             sees it as built; changed files keep theirs.
#   source-times.sh record    after every build of the run succeeded: notes
#                             the content (git's blob hashes) the cache is
#                             now built from.
#
# The note is trusted only while nothing else has built into the cache
# since it was written (no fingerprint newer than it): restore removes it
# before the builds start, so a run that fails or is killed midway leaves
# none, and the next run builds what cargo's times say, as without it.
# A wrong note could only make cargo skip a crate whose sources changed;
# these two rules keep it from ever describing anything but the cache.
# STRATA_SOURCE_TIMES=none turns it off.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "${STRATA_SOURCE_TIMES:-}" = none ] && exit 0
target="$(readlink -f target 2>/dev/null || true)"
# Only a cache shared between clones needs it; a build inside the clone
# keeps its own times.
[ -n "$target" ] && [ "$target" != "$(pwd -P)/target" ] || exit 0
note="$target/../source-times"
mapfile -t fingerprints < <(find "$target" -maxdepth 3 -name .fingerprint -type d 2>/dev/null)

# Tracked files whose working copy is what the index says, as "hash<TAB>path".
clean_files() {
    git ls-files -s | awk -F'\t' -v dirty="$(git diff --name-only)" '
        BEGIN { n = split(dirty, d, "\n"); for (i = 1; i <= n; i++) skip[d[i]] = 1 }
        !($2 in skip) { split($1, m, " "); print m[2] "\t" $2 }'
}

case "${1:-}" in
restore)
    if [ -f "$note" ] && [ "${#fingerprints[@]}" -gt 0 ] && find "${fingerprints[@]}" -newer "$note" -print -quit 2>/dev/null | grep -q .; then
        echo "source-times: the cache was built from other sources since the last note; cargo's own times decide"
        rm -f "$note"
    fi
    if [ -f "$note" ]; then
        same="$(clean_files | sort | comm -12 - <(sort "$note") | cut -f2-)"
        if [ -n "$same" ]; then
            tr '\n' '\0' <<<"$same" | xargs -0 touch -m -d '2000-01-01 00:00:00 UTC' --
        fi
        echo "source-times: $(grep -c . <<<"$same" || true) of $(git ls-files | wc -l) files as the cache was built from"
    fi
    rm -f "$note"
    ;;
record)
    clean_files | sort >"$note.tmp"
    mv "$note.tmp" "$note"
    ;;
*)
    echo "usage: $0 restore|record" >&2
    exit 2
    ;;
esac
