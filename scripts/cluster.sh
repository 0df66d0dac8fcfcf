#!/usr/bin/env bash
# Several "hosts" on this machine, to rehearse a multi-host run over TCP and
# its faults (README, "Clusters"). Each host is a network namespace with one
# veth into a bridge that lives in a namespace of its own (the switch), so
# nothing touches this machine's own interfaces or routes. Needs root and
# iproute2 (tc for --rate).
#
#   scripts/cluster.sh up N [--rate RATE] [--slots S] [--dir DIR] [--name NAME]
#       hosts NAME-h1..NAME-hN at 10.77.0.1..N; writes DIR/hostfile (S slots
#       each), DIR/agent (Open MPI's rsh agent: runs a command in the host's
#       namespace) and DIR/mpiexec (mpiexec from host 1 with the settings below)
#   scripts/cluster.sh mpiexec [--dir DIR] ARGS...   run a job across the hosts
#   scripts/cluster.sh link HOST down|up [--name NAME]   cut or restore host HOST's cable (HOST: 1..N)
#   scripts/cluster.sh kill|freeze|thaw HOST [--name NAME]   SIGKILL, SIGSTOP or SIGCONT every process on it
#   scripts/cluster.sh procs HOST [--name NAME]   its processes (pid, state, name)
#   scripts/cluster.sh down [--name NAME]   ends every process left on the hosts (by PID) and removes them
# Defaults: --dir build/cluster, --name lc, --slots 2. RATE is tc's (1gbit,
# 100mbit): a token bucket on each host's egress (this kernel has no netem).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "cluster.sh: $*" >&2; exit 1; }
dir=build/cluster name=lc rate="" slots=2
args=()
while (($#)); do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
set -- "${args[@]}"
(($#)) || die "usage: up N [--rate R] [--slots S] | mpiexec ARGS | link HOST down|up | kill|freeze|thaw|procs HOST | down"
# Interface names (NAME-hI-e, NAME-hI-p) must fit Linux's 15 characters.
[[ $name =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "--name: 1-8 lower-case letters or digits, a letter first (got '$name')"
switch=$name-sw
host_ns() { echo "$name-h$1"; }
hosts() { ip netns list | sed -n "s/^\($name-h[0-9][0-9]*\)\b.*/\1/p"; }
signal_host() {  # SIGNAL HOST
  local ns; ns=$(host_ns "$2")
  ip netns pids "$ns" | xargs -r kill "-$1" 2>/dev/null || true
}

case $1 in
  up)
    n=${2:-} && [[ $n =~ ^[1-9][0-9]?$ ]] || die "up needs a host count 1..99"
    [ -z "$(hosts)" ] || die "hosts named $name-h* exist already: scripts/cluster.sh down --name $name first"
    command -v ip >/dev/null || die "ip (iproute2) not found"
    ip netns add "$switch" || die "cannot make network namespaces here (root and CAP_SYS_ADMIN needed)"
    # A step that fails leaves nothing half made.
    trap 'echo "cluster.sh: up failed; removing what it made" >&2; "$0" down --name "$name"' ERR
    ip netns exec "$switch" ip link add br0 type bridge
    ip netns exec "$switch" ip link set br0 up
    mkdir -p "$dir"
    : > "$dir/hostfile"
    for i in $(seq 1 "$n"); do
      ns=$(host_ns "$i")
      ip netns add "$ns"
      ip link add "$ns-e" type veth peer name "$ns-p"
      ip link set "$ns-e" netns "$ns"
      ip link set "$ns-p" netns "$switch"
      ip netns exec "$switch" ip link set "$ns-p" master br0 up
      ip netns exec "$ns" ip link set lo up
      ip netns exec "$ns" ip link set "$ns-e" name eth0
      ip netns exec "$ns" ip addr add "10.77.0.$i/24" dev eth0
      ip netns exec "$ns" ip link set eth0 up
      # Loss-based congestion control, as on most clusters (Linux's cubic where
      # a namespace may pick it, else reno): with this machine's default, BBR,
      # a two-way exchange across the token bucket below ran at about half the
      # rate, and at 65-120 MB/s from one run to the next on a 1gbit link.
      ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_congestion_control=cubic 2>/dev/null ||
        ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_congestion_control=reno
      # A token bucket on the host's egress: every byte it sends crosses it.
      [ -z "$rate" ] || ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
      echo "10.77.0.$i slots=$slots" >> "$dir/hostfile"
    done
    # Open MPI's rsh agent: [ssh options] HOST COMMAND...; host 10.77.0.I is namespace NAME-hI.
    cat > "$dir/agent" <<EOF
#!/bin/sh
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
exec ip netns exec "$name-h\${host##*.}" sh -c "\$*"
EOF
    # mpiexec from host 1 over TCP between the hosts (btl tcp: no shared
    # memory, which the namespaces would share), with the launchers' TCP
    # keepalive shortened (README, "Clusters").
    cat > "$dir/mpiexec" <<EOF
#!/bin/sh
exec ip netns exec $(host_ns 1) mpiexec --allow-run-as-root --oversubscribe --bind-to none \\
  --hostfile "$(realpath "$dir")/hostfile" --mca plm_rsh_agent "$(realpath "$dir")/agent" \\
  --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 --mca btl tcp,self \\
  --mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 5 --mca oob_tcp_keepalive_probes 3 "\$@"
EOF
    chmod +x "$dir/agent" "$dir/mpiexec"
    echo "cluster.sh: $n hosts ($name-h1..$name-h$n, 10.77.0.1-$n${rate:+, $rate each}); run jobs with $dir/mpiexec"
    ;;
  mpiexec) shift; exec "$dir/mpiexec" "$@" ;;
  link)
    [[ ${3:-} == up || ${3:-} == down ]] || die "link HOST down|up"
    port=$(host_ns "$2")-p
    ip netns exec "$switch" ip link set "$port" "$3"
    if [ "$3" = up ]; then
      # Forwarding again before we return, and no neighbour entry left
      # FAILED from the outage (a connect to it fails at once, EHOSTUNREACH,
      # and Open MPI's daemons give up on it).
      for _ in $(seq 50); do
        [ "$(ip netns exec "$switch" cat "/sys/class/net/$port/brport/state" 2>/dev/null)" = 3 ] && break
        sleep 0.1
      done
      for ns in $(hosts); do ip netns exec "$ns" ip neigh flush all 2>/dev/null || true; done
    fi
    ;;
  kill) signal_host KILL "$2" ;;
  freeze) signal_host STOP "$2" ;;
  thaw) signal_host CONT "$2" ;;
  procs) ip netns pids "$(host_ns "$2")" | xargs -r ps -o pid=,stat=,comm= -p || true ;;
  down)
    for ns in $(hosts) "$switch"; do
      ip netns list | grep -qw "^$ns" || continue
      # Frozen ones too: SIGKILL ends a stopped process.
      for _ in 1 2 3; do
        pids=$(ip netns pids "$ns")
        [ -z "$pids" ] && break
        kill -KILL $pids 2>/dev/null || true
        sleep 0.2
      done
      ip netns del "$ns"
    done
    # A veth of ours still in this namespace (an up that failed before
    # moving it): only names this script makes.
    for link in $(ip -o link show | sed -n "s/^[0-9]*: \($name-h[0-9][0-9]*-[ep]\)[@:].*/\1/p"); do
      ip link del "$link" 2>/dev/null || true
    done
    ;;
  *) die "unknown command '$1'" ;;
esac
