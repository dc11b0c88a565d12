#!/usr/bin/env bash
# The whole test suite: installs redis-server and secantusd-rs when they
# are missing, then runs format, lint and every test. Integration tests
# start their own servers on free loopback ports and fail when they cannot.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
ensure_redis
ensure_secantus
command -v redis-server >/dev/null || die "redis-server is still missing"
command -v secantusd-rs >/dev/null || die "secantusd-rs is still missing"
say "cargo fmt --check"
cargo fmt --all -- --check
say "cargo clippy -D warnings"
cargo clippy --all-targets --locked -- -D warnings
say "cargo test"
cargo test --locked "$@"
