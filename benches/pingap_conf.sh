# Pingap's side of the tollgate-vs-Pingap comparison (sourced by benches/pingap.sh and
# benches/instructions.sh, not run): its TOML, and the limit plugin pair that matches
# tollgate's inflight + rate on the client IP.

# Writes $tmp/$1.toml: Pingap named $1, one thread, listening on 127.0.0.1:$2, proxying to
# 127.0.0.1:$3, with the plugin list $4 (a TOML array body) and the plugin tables $5.
pingap_toml() {
  local name=$1 port=$2 up=$3 plugins=$4 tables=$5
  cat >"$tmp/$name.toml" <<TOML
[basic]
name = "$name"
threads = 1
grace_period = "1s"
graceful_shutdown_timeout = "1s"
log_level = "WARN"
pid_file = "$tmp/$name.pid"
upgrade_sock = "$tmp/$name.sock"

[upstreams.bench]
addrs = ["127.0.0.1:$up"]

[locations.bench]
upstream = "bench"
plugins = [$plugins]

[servers.bench]
addr = "127.0.0.1:$port"
locations = ["bench"]
threads = 1
$tables
TOML
}

# The limit plugin twice, inflight and rate, keyed on the client IP, out of reach.
# shellcheck disable=SC2034 # used by the sourcing scripts
PINGAP_LIMIT_PLUGINS='"conc", "perClient"'
# shellcheck disable=SC2034
PINGAP_LIMIT_TABLES='
[plugins.conc]
category = "limit"
type = "inflight"
tag = "ip"
max = 100000

[plugins.perClient]
category = "limit"
type = "rate"
tag = "ip"
max = 100000000
interval = "1s"'

# tollgate's matching pair: an inflight and a rate limit on the client IP, out of reach.
# shellcheck disable=SC2034
TOLLGATE_LIMIT_PAIR="    limits:
      conc: { kind: inflight, key: [client_ip], max: 100000 }
      per_client: { kind: rate, key: [client_ip], max: 100000000, per: 1s }"
