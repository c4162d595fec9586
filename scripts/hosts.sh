#!/usr/bin/env bash
# Simulated hosts on one machine: runs an MPI job across N "hosts", each its
# own network namespace (and UTS namespace, so each has its own host name),
# joined by veth links to a bridge and shaped with tc like a datacenter link.
# Open MPI launches across them as across real hosts (an rsh agent enters the
# host's namespace), so it sees separate nodes: TCP between hosts, shared
# memory within a host.
#
#   scripts/hosts.sh check                       exit 0 if namespaces can be made here
#   scripts/hosts.sh run HOSTS SLOTS CMD ARGS..  mpirun -np HOSTS*SLOTS across HOSTS hosts
#   scripts/hosts.sh each HOSTS CMD ARGS..       CMD on every host at once, as a launcher
#                                                of its own runs there (torchrun's agents):
#                                                GYRE_HOST_INDEX is the host's index, and
#                                                host0's address is 10.213.0.1; fails if
#                                                any host's command fails
#
# The addresses (10.213.0.0/24) exist only inside the namespaces this script
# creates; the bridge has none, so nothing outside them is reachable from the
# job nor the job from outside. Everything is torn down on exit, also on error
# or Ctrl-C. Link shaping: a token bucket (tc tbf) of GYRE_HOSTS_RATE
# (default 10gbit, a common datacenter NIC) on both ends of every host's link;
# GYRE_HOSTS_RATE=none leaves links unshaped; GYRE_HOSTS_QUEUE_MS (default 5)
# bounds the time a packet may wait in the bucket's queue (tbf's latency:
# beyond it packets drop, and TCP backs off). The latency is the veth pair's
# own (docs/benchmarks.md measures it): netem, which could add delay, is not
# in every kernel (not in this machine's), so it is not relied on.
# Ranks are not bound to cores (--bind-to none): each host's launcher sees the
# whole machine and would bind its first rank to core 0, so the first ranks of
# all hosts would share one core and, as they poll, take turns only at each
# scheduler tick (4 ms at HZ=250): every small message took ~4 ms or more.
# And when the job has more ranks than the machine has cores, the ranks yield
# the core while they poll (mpi_yield_when_idle, which mpirun turns on by
# itself for a node it knows is oversubscribed but cannot here: each host's
# launcher sees all the cores as its own): multihost.collectives.2x2 took
# 41-54 s with it, 112-126 s without, under the same load. GYRE_HOSTS_YIELD=1
# turns it on for every job, 0 off (with fewer ranks than cores, an 8-byte
# ping-pong under load was faster with it in one pair of runs and slower in
# the next: not settled).
# Extra mpirun arguments: GYRE_HOSTS_MPIRUN_ARGS. GYRE_HOSTS_END_FILE: a file
# that receives the moment the job ended (ms since the epoch), written before
# the hosts are torn down.
set -euo pipefail

subnet=10.213.0
rate=${GYRE_HOSTS_RATE:-10gbit}
id=$(( $$ % 100000 ))
prefix=gy${id}            # interface names must stay under 16 characters
bridge=${prefix}br

ns_of() { echo "gyre${id}-h$1"; }
host_of() { echo "host$1"; }

can_make_namespaces() {
  [ "$(id -u)" -eq 0 ] || { echo "hosts.sh: needs root to create network namespaces"; return 1; }
  command -v ip >/dev/null && command -v tc >/dev/null && command -v unshare >/dev/null ||
    { echo "hosts.sh: needs ip, tc (iproute2) and unshare (util-linux)"; return 1; }
  local probe="gyre${id}-probe" out
  if ! out=$(ip netns add "$probe" 2>&1); then
    echo "hosts.sh: cannot create a network namespace here: $out"; return 1
  fi
  ip netns del "$probe"
  if ! out=$(ip link add "${prefix}pr" type bridge 2>&1); then
    echo "hosts.sh: cannot create a bridge here: $out"; return 1
  fi
  ip link del "${prefix}pr"
  if ! out=$(unshare --uts true 2>&1); then
    echo "hosts.sh: cannot create a UTS namespace here: $out"; return 1
  fi
}

teardown() {
  local n=$1
  for ((h = 0; h < n; h++)); do
    ip netns del "$(ns_of $h)" 2>/dev/null || true
    rm -rf "/etc/netns/$(ns_of $h)"
  done
  ip link del "$bridge" 2>/dev/null || true
  rm -f "$agent"
}

setup() {
  local n=$1 h ns
  ip link add "$bridge" type bridge
  ip link set "$bridge" up
  for ((h = 0; h < n; h++)); do
    ns=$(ns_of $h)
    ip netns add "$ns"
    ip link add "${prefix}h$h" type veth peer name "${prefix}p$h"
    ip link set "${prefix}h$h" master "$bridge" up
    ip link set "${prefix}p$h" netns "$ns"
    ip -n "$ns" link set "${prefix}p$h" name eth0
    ip -n "$ns" addr add "$subnet.$((h + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    if [ "$rate" != none ]; then
      # Both directions: egress of the host's end and of the bridge's end.
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 1mb latency ${GYRE_HOSTS_QUEUE_MS:-5}ms
      tc qdisc add dev "${prefix}h$h" root tbf rate "$rate" burst 1mb latency ${GYRE_HOSTS_QUEUE_MS:-5}ms
    fi
    # `ip netns exec` bind-mounts /etc/netns/NS/hosts over /etc/hosts.
    mkdir -p "/etc/netns/$ns"
    {
      echo "127.0.0.1 localhost"
      for ((g = 0; g < n; g++)); do echo "$subnet.$((g + 1)) $(host_of $g)"; done
    } > "/etc/netns/$ns/hosts"
  done
  # The rsh agent: `agent [options] HOST COMMAND...` runs COMMAND on HOST,
  # i.e. in HOST's network namespace under a UTS namespace named after it.
  cat > "$agent" <<AGENT
#!/usr/bin/env bash
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
h=\${host#host}
exec ip netns exec "gyre${id}-h\$h" unshare --uts bash -c "hostname \$host && \$*"
AGENT
  chmod +x "$agent"
}

case "${1:-}" in
  check)
    can_make_namespaces
    ;;
  run)
    shift
    [ $# -ge 3 ] || { echo "usage: hosts.sh run HOSTS SLOTS CMD [ARGS...]" >&2; exit 2; }
    hosts=$1 slots=$2; shift 2
    why=$(can_make_namespaces) || { echo "$why" >&2; exit 77; }
    agent=$(mktemp /tmp/gyre-rsh-agent.XXXXXX)
    trap 'teardown "$hosts"' EXIT
    trap 'exit 130' INT TERM
    setup "$hosts"
    hostlist=""
    for ((h = 0; h < hosts; h++)); do hostlist+="${hostlist:+,}$(host_of $h):$slots"; done
    yield=()
    (( hosts * slots > $(nproc) )) && yield=(--mca mpi_yield_when_idle 1)
    [ "${GYRE_HOSTS_YIELD:-}" = 1 ] && yield=(--mca mpi_yield_when_idle 1)
    [ "${GYRE_HOSTS_YIELD:-}" = 0 ] && yield=()
    # mpirun itself runs on host0, like a job launched from its first node.
    cmd=(mpirun --allow-run-as-root --oversubscribe -np $((hosts * slots)) --host "$hostlist"
         --bind-to none "${yield[@]}"
         --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1
         --mca btl tcp,vader,self --mca btl_tcp_if_include "$subnet.0/24"
         --mca oob_tcp_if_include "$subnet.0/24"
         ${GYRE_HOSTS_MPIRUN_ARGS:-} "$@")
    status=0
    ip netns exec "$(ns_of 0)" unshare --uts bash -c 'hostname "$0" && exec "$@"' "$(host_of 0)" \
      "${cmd[@]}" || status=$?
    # GYRE_HOSTS_END_FILE: where to write when the job ended (ms since the
    # epoch), before the hosts are torn down (the EXIT trap), which is no
    # part of the job and takes long when other jobs hold the kernel's
    # network locks (tests/core/run_killed_rank.sh bounds the time to it).
    if [ -n "${GYRE_HOSTS_END_FILE:-}" ]; then
      echo "$(( $(date +%s%N) / 1000000 ))" > "$GYRE_HOSTS_END_FILE"
    fi
    exit "$status"
    ;;
  each)
    shift
    [ $# -ge 2 ] || { echo "usage: hosts.sh each HOSTS CMD [ARGS...]" >&2; exit 2; }
    hosts=$1; shift
    why=$(can_make_namespaces) || { echo "$why" >&2; exit 77; }
    agent=$(mktemp /tmp/gyre-rsh-agent.XXXXXX)
    trap 'teardown "$hosts"' EXIT
    trap 'exit 130' INT TERM
    setup "$hosts"
    pids=()
    for ((h = 0; h < hosts; h++)); do
      GYRE_HOST_INDEX=$h ip netns exec "$(ns_of $h)" unshare --uts \
        bash -c 'hostname "$0" && exec "$@"' "$(host_of $h)" "$@" &
      pids+=($!)
    done
    status=0
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    exit "$status"
    ;;
  *)
    echo "usage: hosts.sh check | run HOSTS SLOTS CMD [ARGS...] | each HOSTS CMD [ARGS...]" >&2
    exit 2
    ;;
esac
