# Sourced by the set-up scripts: what they share.

# need_packages PKG...: installs the Debian packages of the list that are
# missing (as root; waits for another apt run to finish).
need_packages() {
    local pkg missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    # Do not let the server package create and start a default cluster: Strata runs its own.
    mkdir -p /etc/postgresql-common/createcluster.d
    echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/strata.conf
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
}

# need_cargo: a Rust toolchain on PATH (rustup's default place is tried).
need_cargo() {
    if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        echo "setup: a Rust toolchain (1.88 or newer, e.g. from rustup) is required" >&2
        exit 1
    fi
}

# What the main job and every test need: PostgreSQL 15 (server, clients,
# contrib), FUSE for lazy computes, a C toolchain for the Rust build.
BASE_PACKAGES=(postgresql-15 postgresql-client-15 postgresql-contrib fuse3 build-essential pkg-config ca-certificates)
