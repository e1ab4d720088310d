# Shell helpers the benchmark scripts share (sourced, not run): process bookkeeping and
# cleanup, CPU time from /proc, free ports, nginx temp paths. The sourcing script defines
# `die`, `tmp` (its scratch directory) and `pids` (the processes it started), and installs
# `trap cleanup EXIT`.

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
