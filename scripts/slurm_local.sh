#!/usr/bin/env bash
# A single-host SLURM for the tests and for trying the cluster scripts: scripts/slurm_local.sh start|stop|status|env
#
#   start   install Debian's slurm-wlm and munge if missing (as root; else say what to install), write a config
#           into a private state directory and start munged, slurmctld and slurmd on localhost: one node with
#           this machine's CPUs and memory, one partition. Running already: says so.
#   stop    cancel the cluster's jobs, then stop the three daemons this script started, by the process ids in
#           their pid files (never by name). Not running: says so.
#   status  what runs, and the queue.
#   env     the line that points SLURM's commands at this cluster: eval "$(scripts/slurm_local.sh env)"
#
# Nothing is written to /etc: the state directory ($RESNORM_LM_SLURM_DIR, default /tmp/resnorm-lm-slurm) holds
# slurm.conf, munge's key and socket, the daemons' pid files, logs and spool. Clients find the config through
# SLURM_CONF (the env command). The ports default to 16817 (slurmctld) and 16818 (slurmd), away from a system
# SLURM's 6817/6818; RESNORM_LM_SLURM_PORT moves both. A container has no cgroups to give: processes are tracked
# by their parent ids (proctrack/linuxproc), tasks are not bound (task/none), and memory is not enforced.
set -euo pipefail

STATE=${RESNORM_LM_SLURM_DIR:-/tmp/resnorm-lm-slurm}
CTLD_PORT=${RESNORM_LM_SLURM_PORT:-16817}
SLURMD_PORT=$((CTLD_PORT + 1))
CONF=$STATE/slurm.conf
NODE=$(hostname -s)
PARTITION=local
DAEMONS=(munged slurmctld slurmd)  # started in this order, stopped in the reverse
me=scripts/slurm_local.sh

say() { echo "$me: $*"; }
fail() { echo "$me: $*" >&2; exit 1; }

pid_file() { echo "$STATE/run/$1.pid"; }

# The pid its pid file names, when that process is alive and is that daemon (a pid file left by a dead daemon
# can name a pid that something else has since been given).
running_pid() {
    local file pid
    file=$(pid_file "$1")
    [ -s "$file" ] || return 1
    pid=$(tr -dc '0-9' <"$file")
    [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$1" ] || return 1
    echo "$pid"
}

slurm_env() { SLURM_CONF=$CONF "$@"; }

install_packages() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return 0
    local missing="apt-get install -y slurm-wlm munge (Debian or Ubuntu)"
    [ "$(id -u)" = 0 ] || fail "SLURM is not installed and this is not root; install it first: sudo $missing"
    command -v apt-get >/dev/null || fail "SLURM is not installed and there is no apt-get here; install slurmctld, slurmd and munged"
    say "installing slurm-wlm and munge (about a minute)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >"$STATE/log/apt-get.log" 2>&1 || {
        # the package lists of a fresh container may be missing: fetch them once and try again
        DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$STATE/log/apt-get.log" 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >>"$STATE/log/apt-get.log" 2>&1
    } || fail "apt-get install slurm-wlm munge failed; see $STATE/log/apt-get.log"
}

# This machine as slurmd sees it: CPUs, sockets, cores, threads and real memory, in slurm.conf's words.
node_hardware() {
    slurmd -C | head -1 | tr ' ' '\n' | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore|RealMemory)=' | tr '\n' ' '
}

write_config() {
    cat >"$CONF" <<EOF
# written by $me start; rewritten at each start
ClusterName=resnormlm
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=$(id -un)
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.socket.2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$(pid_file slurmctld)
SlurmdPidFile=$(pid_file slurmd)
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=30
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$NODE NodeAddr=127.0.0.1 $(node_hardware) State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munged() {
    mkdir -p "$STATE/munge"
    chmod 0700 "$STATE/munge"
    [ -s "$STATE/munge/munge.key" ] || {
        dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
        chmod 0400 "$STATE/munge/munge.key"
    }
    munged --force --socket="$STATE/munge/munge.socket.2" --key-file="$STATE/munge/munge.key" \
        --pid-file="$(pid_file munged)" --log-file="$STATE/log/munged.log" --seed-file="$STATE/munge/munged.seed"
}

# Until the node takes jobs (slurmd registered with slurmctld), at most 60 s.
wait_until_idle() {
    local state
    for _ in $(seq 120); do
        state=$(slurm_env sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
        case $state in idle* | mixed* | allocated*) return 0 ;; esac
        sleep 0.5
    done
    fail "the node did not come up (state: ${state:-none}); see $STATE/log/slurmctld.log and $STATE/log/slurmd.log"
}

start() {
    local up=0 daemon
    for daemon in "${DAEMONS[@]}"; do running_pid "$daemon" >/dev/null && up=$((up + 1)); done
    if [ "$up" = "${#DAEMONS[@]}" ]; then
        say "already running (state in $STATE)"
        return 0
    fi
    [ "$up" = 0 ] || fail "partly running; run '$me stop' first"
    mkdir -p "$STATE/run" "$STATE/log" "$STATE/ctld" "$STATE/spool"
    install_packages
    write_config
    start_munged
    # -c: a fresh queue at each start (no jobs from an earlier start come back)
    slurmctld -f "$CONF" -c
    slurmd -f "$CONF" -N "$NODE"
    wait_until_idle
    say "running: one node '$NODE' ($(node_hardware | tr -s ' ' | sed 's/ $//')), partition '$PARTITION'"
    say "point SLURM's commands at it with: eval \"\$($me env)\""
}

stop_pid() {  # stop_pid <daemon> <pid>: TERM, then KILL after 20 s
    kill -TERM "$2" 2>/dev/null || return 0
    for _ in $(seq 40); do
        kill -0 "$2" 2>/dev/null || return 0
        sleep 0.5
    done
    say "$1 ($2) did not stop within 20 s: killing it"
    kill -KILL "$2" 2>/dev/null || true
}

stop() {
    local any=0 daemon pid i
    for daemon in "${DAEMONS[@]}"; do running_pid "$daemon" >/dev/null && any=1; done
    if [ "$any" = 0 ]; then
        say "not running (state in $STATE)"
        return 0
    fi
    # the jobs first: their processes belong to slurmd's step daemons, which outlive slurmd
    if running_pid slurmctld >/dev/null && [ -n "$(slurm_env squeue -h -o %i 2>/dev/null)" ]; then
        slurm_env scancel --full --partition "$PARTITION" 2>/dev/null || true
        for _ in $(seq 60); do
            [ -z "$(slurm_env squeue -h -t running,completing -o %i 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
    for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
        daemon=${DAEMONS[i]}
        if pid=$(running_pid "$daemon"); then
            stop_pid "$daemon" "$pid"
            say "stopped $daemon ($pid)"
        fi
        rm -f "$(pid_file "$daemon")"
    done
}

status() {
    local down=0 daemon pid
    for daemon in "${DAEMONS[@]}"; do
        if pid=$(running_pid "$daemon"); then say "$daemon running ($pid)"; else say "$daemon not running"; down=1; fi
    done
    if [ "$down" = 0 ]; then
        slurm_env sinfo
        slurm_env squeue
    fi
    return "$down"
}

case ${1:-} in
start) start ;;
stop) stop ;;
status) status ;;
env) echo "export SLURM_CONF=$CONF" ;;
*)
    echo "usage: $me start|stop|status|env   (state in \$RESNORM_LM_SLURM_DIR, now $STATE)" >&2
    exit 2
    ;;
esac
