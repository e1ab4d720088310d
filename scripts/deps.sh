#!/usr/bin/env bash
# Installs what building and testing tollgate needs on Debian, only when missing:
#   cmake      - Pingora's zlib-ng build
#   pkg-config, libssl-dev - Pingora's OpenSSL TLS to upstreams
#   promtool   - (Debian package `prometheus`) checks the metrics and alert rules in tests
#   redis-server, redis-cli, redis-benchmark - (Debian packages `redis-server`, `redis-tools`)
#                the Redis store's tests start their own servers and a local Redis Cluster;
#                the limiter API's tests and bench talk to tollgate with redis-cli and
#                redis-benchmark
#   systemd-analyze - (Debian package `systemd`) verifies conf/systemd/tollgate.service in tests
#   python3-redis - redis-py for /usr/bin/python3: the limiter API's Python client example,
#                run by a test
#   h2load, curl - (Debian packages `nghttp2-client`, `curl`) real HTTP clients of the proxy's
#                tests (h2load --h1 pipelines, HTTP/2 load over TLS and h2c in the edge tests;
#                curl sends what the tests need to see forwarded)
#   python3-grpcio, python3-websockets - gRPC and WebSocket ends for /usr/bin/python3 in the
#                edge tests (an echo service and its client on each protocol); with
#                python3-protobuf, the rate limit service's client (tests/it/rls.rs)
#   testssl   - (Debian package `testssl.sh`) audits a TLS listener (benches/testssl.sh)
#   pebble, pebble-challtestsrv - (Debian package `pebble`) Let's Encrypt's test ACME server
#                and its mock DNS: the ACME tests order certificates from it on loopback
# Pass extra command names to also install bench tools: scripts/deps.sh wrk nginx
set -euo pipefail

declare -A pkg_of=(
  [cmake]=cmake
  [pkg-config]=pkg-config
  [promtool]=prometheus
  [redis-server]=redis-server
  [redis-cli]=redis-tools
  [wrk]=wrk
  [nginx]=nginx-light
  [valgrind]=valgrind
  [redis-benchmark]=redis-tools
  [systemd-analyze]=systemd
  [h2load]=nghttp2-client
  [testssl]=testssl.sh
  [pebble]=pebble
  [pebble-challtestsrv]=pebble
)

missing=()
for cmd in cmake pkg-config promtool redis-server redis-cli redis-benchmark systemd-analyze h2load curl openssl pebble pebble-challtestsrv "$@"; do
  if ! command -v "$cmd" >/dev/null 2>&1; then
    pkg=${pkg_of[$cmd]:-$cmd}
    [[ " ${missing[*]} " == *" $pkg "* ]] || missing+=("$pkg")
  fi
done
if ! dpkg -s libssl-dev >/dev/null 2>&1; then
  missing+=(libssl-dev)
fi
# Debian's python3 (a pyenv or venv python3 earlier in PATH would not see the package).
if ! /usr/bin/python3 -c 'import redis' >/dev/null 2>&1; then
  missing+=(python3-redis)
fi
if ! /usr/bin/python3 -c 'import grpc' >/dev/null 2>&1; then
  missing+=(python3-grpcio)
fi
# protobuf: the rate limit service's tests describe Envoy's messages at run time.
if ! /usr/bin/python3 -c 'import google.protobuf' >/dev/null 2>&1; then
  missing+=(python3-protobuf)
fi
if ! /usr/bin/python3 -c 'import websockets' >/dev/null 2>&1; then
  missing+=(python3-websockets)
fi

if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}" >&2
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
