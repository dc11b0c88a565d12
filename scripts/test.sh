#!/usr/bin/env bash
# The whole test suite: installs redis-server, secantusd-rs, the
# operations tools (promtool, docker-compose, openssl) and the Python
# clients of the contract's independent checker when they are missing,
# then runs format, lint and every test. Integration tests start their
# own servers on free loopback ports and fail when they cannot.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
ensure_redis
ensure_secantus
ensure_ops_tools
ensure_python_clients
python3 -c 'import pymongo, redis' || die "the Python clients pymongo and redis are still missing"
command -v redis-server >/dev/null || die "redis-server is still missing"
command -v secantusd-rs >/dev/null || die "secantusd-rs is still missing"
for tool in promtool docker-compose openssl; do
  command -v "$tool" >/dev/null || die "$tool is still missing"
done
say "cargo fmt --check"
cargo fmt --all -- --check
say "cargo clippy -D warnings"
cargo clippy --all-targets --all-features --locked -- -D warnings
say "cargo test"
# A failing test prints what cachewright logged while it ran (libtest
# shows a test's captured output only when it fails), so a failure in CI
# says what the service was doing, not only which assertion gave up.
export TEST_LOG="${TEST_LOG:-cachewright=info}"
cargo test --locked "$@"
