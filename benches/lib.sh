# Shell helpers the benchmark scripts share (sourced, not run): process bookkeeping and
# cleanup, CPU time from /proc, free ports, readiness over HTTP, nginx and its temp paths.
# The sourcing script defines `die`, `tmp` (its scratch directory), `pids` (the processes
# it started) and `host` (the Host header the proxies route), and installs `trap cleanup
# EXIT`.

# Stops every process this script started: nginx masters take their workers with them on
# SIGTERM, tollgate shuts down within its 0 s grace period (+1 s timeout). Stragglers get
# SIGKILL after 10 s, their nginx workers included.
cleanup() {
  local status=$? pid kids=() waited alive
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do
    if running "$pid"; then
      mapfile -t -O "${#kids[@]}" kids < <(children "$pid")
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  for ((waited = 0; waited < 100; waited++)); do
    alive=0
    for pid in "${pids[@]}" "${kids[@]}"; do
      running "$pid" && alive=1
    done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}" "${kids[@]}"; do
    running "$pid" && kill -KILL "$pid" 2>/dev/null
  done
  wait 2>/dev/null || true
  rm -rf "$tmp"
  exit "$status"
}
# Whether PID $1 is running (exited children stay as zombies until waited for).
running() {
  local state
  state=$(awk '{ sub(/^.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z ]]
}

# The PIDs whose parent is $1 (nginx workers of a master).
children() {
  local stat
  for stat in /proc/[0-9]*/stat; do
    cat "$stat" 2>/dev/null || true
  done | awk -v parent="$1" '{ pid = $1; sub(/^.*\) /, ""); if ($2 == parent) print pid }'
}

# CPU clock ticks (utime + stime) used so far by the PIDs given and their children.
cpu_ticks() {
  local pid all=()
  for pid in "$@"; do
    all+=("$pid")
    mapfile -t -O "${#all[@]}" all < <(children "$pid")
  done
  for pid in "${all[@]}"; do
    cat "/proc/$pid/stat" 2>/dev/null || true
  done | awk '{ sub(/^.*\) /, ""); t += $12 + $13 } END { print t + 0 }'
  # After the comm field, $1 is field 3 (state), so $12 and $13 are fields 14 and 15.
}

# Sets variable $1 to a free TCP port on 127.0.0.1, below the kernel's ephemeral range so
# that wrk's own connections never take it, and distinct from the ports already handed out.
used_ports=" "
free_port() {
  local port tries
  for ((tries = 0; tries < 200; tries++)); do
    port=$((20000 + RANDOM % 12000))
    [[ $used_ports == *" $port "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      used_ports+="$port "
      printf -v "$1" '%s' "$port"
      return
    fi
  done
  die "no free port found"
}

# nginx temp paths inside its prefix, for the modules this nginx has.
nginx_temp_paths() {
  local prefix=$1 mod built
  built=$(nginx -V 2>&1)
  echo "client_body_temp_path $prefix/client_body; proxy_temp_path $prefix/proxy;"
  for mod in fastcgi uwsgi scgi; do
    [[ $built == *"--without-http_${mod}_module"* ]] || echo "${mod}_temp_path $prefix/$mod;"
  done
}

# The status code of one GET / to 127.0.0.1:$1 with Host: $host.
http_status() {
  local line
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$host" >&3
  IFS=' ' read -r -t 5 _ line _ <&3 || true
  exec 3<&-
  echo "$line"
}

# Waits until 127.0.0.1:$2 answers GET / with Host: $host with a 2xx, while PID $1
# runs (20 s at most); $3 names the process and its log $tmp/$3.log.
wait_ready() {
  local pid=$1 port=$2 name=$3 tries status=""
  for ((tries = 0; tries < 200; tries++)); do
    running "$pid" || die "$name exited at start; its log: $(tail -n 20 "$tmp/$name.log" 2>/dev/null)"
    status=$(http_status "$port" 2>/dev/null || true)
    [[ $status == 2* ]] && return
    sleep 0.1
  done
  die "$name did not answer 2xx on port $port within 20 s (last status: ${status:-none}); its log: $(tail -n 20 "$tmp/$name.log" 2>/dev/null)"
}

# Starts nginx with prefix $tmp/$1 and http block body $2, with $workers worker processes
# (1 when the script sets none); sets started_pid.
start_nginx() {
  local name=$1 body=$2 prefix=$tmp/$1
  mkdir -p "$prefix/logs"
  cat >"$prefix/nginx.conf" <<EOF
worker_processes ${workers:-1};
pid $prefix/nginx.pid;
error_log $prefix/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    $(nginx_temp_paths "$prefix")
    $body
}
EOF
  nginx -p "$prefix" -e "$prefix/logs/error.log" -c "$prefix/nginx.conf" -g 'daemon off;' \
    >"$tmp/$name.log" 2>&1 &
  started_pid=$!
  pids+=("$started_pid")
}

# The response (status line, headers, body) to GET $2 from 127.0.0.1:$1, Host $3
# (127.0.0.1 when none).
http_get() {
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n' "$2" "${3:-127.0.0.1}" >&3
  timeout 5 cat <&3 || true
  exec 3<&-
}

# One wrk run's output ($1, from `wrk --latency`) as a tab-separated line:
#   rps p50_us p99_us requests bad
# (bad: non-2xx/3xx responses plus socket errors).
wrk_summary() {
  awk '
    function us(s) {
      if (s ~ /us$/) return s + 0
      if (s ~ /ms$/) return (s + 0) * 1000
      if (s ~ /s$/) return (s + 0) * 1000000
      return s + 0
    }
    /^ +50%/ { p50 = us($2) }
    /^ +99%/ { p99 = us($2) }
    / requests in / { req = $1 }
    /Non-2xx or 3xx responses:/ { bad += $NF }
    /Socket errors:/ { gsub(/,/, ""); bad += $4 + $6 + $8 + $10 }
    /^Requests\/sec:/ { rps = $2 }
    END { printf "%.0f\t%.0f\t%.0f\t%d\t%d\n", rps, p50, p99, req, bad }' <<<"$1"
}
