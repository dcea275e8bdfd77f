#!/usr/bin/env bash
# slurm-local.sh -- run a real, single-node Slurm cluster on localhost.
#
# For ltbench's slurm tests and for trying the Slurm backend on a laptop.
# Uses Debian's slurm-wlm + munge packages; no systemd, no cgroups, no
# accounting database.  Everything (config, key, state, logs, pid files)
# lives in one state directory, so it never touches /etc/slurm or a system
# munged.
#
# Usage:
#   scripts/slurm-local.sh up [--no-install]   # install if needed, start, wait until idle
#   scripts/slurm-local.sh down [--purge]      # stop what `up` started (and rm the state dir)
#   scripts/slurm-local.sh status              # up/down, sinfo, squeue
#   scripts/slurm-local.sh env                 # print the export line
#
#   eval "$(scripts/slurm-local.sh up)"        # `up` prints only the export line on stdout
#
# Environment:
#   LTBENCH_SLURM_DIR          state directory (default ~/.cache/ltbench-slurm; scripts/run-tests.sh gives
#                              each test run a folder of its own made by mktemp)
#   LTBENCH_SLURM_TIMEOUT      seconds `up` waits for the node to be idle (default 60)
#   LTBENCH_SLURMCTLD_PORT     slurmctld port (default 6817)
#   LTBENCH_SLURMD_PORT        slurmd port (default 6818)
#   LTBENCH_SLURM_DEF_MEM_PER_CPU  DefMemPerCPU in MB (default min(1024, RealMemory/CPUs))
#
# `status` exits 0 when up, 3 when down, 1 when only some daemons run.
#
# up/down must run as root (slurmd launches jobs as the submitting user and
# SlurmUser=root); status/env do not.
#
# Known limitations / timings:
#   - no accounting storage, so `sacct` fails ("Slurm accounting storage is
#     disabled"); use `squeue -t all` / `scontrol show job` (finished jobs stay
#     visible for MinJobAge=300 s).  submitit therefore reports every job as
#     UNKNOWN; result() still works (it reads the result pickle), but a job
#     that dies without writing one (scancel, SIGKILL) never counts as done.
#   - `up` takes well under a second once the packages are installed, but
#     slurmctld only makes its first scheduling pass ~3 s after it starts.
#   - `scontrol requeue` of a running job: it becomes eligible again
#     cred_expire+1 = 11 s later and starts at the next scheduling pass
#     (sched_interval=5), so it reruns ~11-16 s after the requeue.

set -euo pipefail

PROG=$(basename "$0")
DIR=${LTBENCH_SLURM_DIR:-$HOME/.cache/ltbench-slurm}
CONF="$DIR/slurm.conf"
TIMEOUT=${LTBENCH_SLURM_TIMEOUT:-60}
CTLD_PORT=${LTBENCH_SLURMCTLD_PORT:-6817}
SLURMD_PORT=${LTBENCH_SLURMD_PORT:-6818}
NODE=localhost

MUNGE_DIR="$DIR/munge"
MUNGE_KEY="$MUNGE_DIR/munge.key"
MUNGE_SOCKET="$MUNGE_DIR/munge.socket.2"
MUNGE_PID="$DIR/run/munged.pid"
CTLD_PID="$DIR/run/slurmctld.pid"
SLURMD_PID="$DIR/run/slurmd.pid"

# Debian installs the daemons in /usr/sbin, which a non-login root shell may not have on PATH.
PATH="$PATH:/usr/sbin:/sbin"

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
}

need_root() {
    [ "$(id -u)" -eq 0 ] || die "'$1' must run as root (slurmd/slurmctld run as SlurmUser=root); try: sudo -E $0 $1"
}

export_line() { printf 'export SLURM_CONF=%s\n' "$CONF"; }

# ---------------------------------------------------------------- processes

# running PID: the process exists and is not a zombie (an init that does not
# reap, as in some containers, leaves exited daemons as zombies).
running() {
    local st
    st=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$st" ] && [ "${st%% *}" != Z ] && [ "${st%% *}" != X ]
}

# pid_alive PIDFILE NAME: true if PIDFILE names a live process whose
# executable is NAME (guards against a stale pid file whose pid was reused).
pid_alive() {
    local pidfile=$1 name=$2 pid exe comm
    [ -s "$pidfile" ] || return 1
    pid=$(tr -dc '0-9' <"$pidfile")
    [ -n "$pid" ] && running "$pid" || return 1
    # Debian's binaries are alternatives symlinks (slurmd -> slurmd-wlm), so
    # check the command name and accept a "-wlm" executable too.
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
    exe=$(basename "${exe% (deleted)}")
    case "$comm:$exe" in
        "$name":* | *:"$name" | *:"$name"-wlm) echo "$pid" ;;
        *) return 1 ;;
    esac
}

# stop_pidfile PIDFILE NAME: SIGTERM, wait up to 20 s, then SIGKILL.
stop_pidfile() {
    local pidfile=$1 name=$2 pid i
    if ! pid=$(pid_alive "$pidfile" "$name"); then
        rm -f "$pidfile"
        return 0
    fi
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 200); do
        running "$pid" || break
        sleep 0.1
    done
    if running "$pid"; then
        log "$name (pid $pid) did not exit after 20 s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        for i in $(seq 1 50); do running "$pid" || break; sleep 0.1; done
    fi
    rm -f "$pidfile"
}

# Job steps (slurmstepd and the job's processes) outlive slurmd by design and
# get a scrubbed environment, so find our slurmstepds by what they hold open:
# their cwd / log fd is in this state dir.  Prints them and their descendants.
leftover_job_pids() {
    local p link stepds="" f
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = slurmstepd ] || continue
        for f in "/proc/$p/cwd" "/proc/$p"/fd/*; do
            link=$(readlink "$f" 2>/dev/null) || continue
            case $link in
                "$DIR"/*) stepds="$stepds $p"; break ;;
            esac
        done
    done
    [ -n "$stepds" ] || return 0
    # descendants, breadth first
    ps -e -o pid=,ppid= | awk -v roots="$stepds" '
        BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
        { parent[$1] = $2 }
        END {
            do {
                changed = 0
                for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; changed = 1 }
            } while (changed)
            for (p in keep) print p
        }'
}

# slurm CMD ARGS...: a Slurm client command against this cluster, never hanging more than 10 s.
slurm() { SLURM_CONF=$CONF timeout 10 "$@"; }

is_up() {
    pid_alive "$MUNGE_PID" munged >/dev/null &&
        pid_alive "$CTLD_PID" slurmctld >/dev/null &&
        pid_alive "$SLURMD_PID" slurmd >/dev/null
}

node_state() {
    slurm sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -n1
}

# Epoch seconds of the node's SlurmdStartTime as slurmctld knows it (0 if
# unknown).  slurmctld restores the node as "idle" from its saved state before
# slurmd has registered, so "idle" alone does not prove slurmd is talking to it.
slurmd_start_time() {
    local t
    t=$(slurm scontrol -o show node "$NODE" 2>/dev/null |
        tr ' ' '\n' | sed -n 's/^SlurmdStartTime=//p')
    date -d "$t" +%s 2>/dev/null || echo 0
}

# node_ready SINCE: the node is usable (idle/mixed/allocated/completing; "idle*", registered once but
# not responding, is not) and its slurmd registered at or after SINCE (epoch s; 0: any time).
# Prints the state either way.
node_ready() {
    local since=${1:-0} state
    state=$(node_state || true)
    printf '%s\n' "$state"
    case $state in
        idle | mixed | allocated | completing) [ "$(slurmd_start_time)" -ge "$since" ] ;;
        *) return 1 ;;
    esac
}

# wait_until_idle SINCE: wait up to TIMEOUT s for node_ready SINCE, failing early if a daemon exits.
# Prints the node state.
wait_until_idle() {
    local since=$1 state="" w0=$SECONDS
    log "waiting up to ${TIMEOUT}s for node $NODE to be idle"
    while [ $((SECONDS - w0)) -lt "$TIMEOUT" ]; do
        if state=$(node_ready "$since"); then
            printf '%s\n' "$state"
            return 0
        fi
        pid_alive "$CTLD_PID" slurmctld >/dev/null || fail_up "slurmctld exited"
        pid_alive "$SLURMD_PID" slurmd >/dev/null || fail_up "slurmd exited"
        sleep 0.5
    done
    case $state in
        idle | mixed | allocated | completing) state="$state, slurmd not registered" ;;
    esac
    fail_up "node $NODE did not become idle within ${TIMEOUT}s (state: '${state:-no answer from slurmctld}')"
}

# cancel_ghost_jobs: after an unclean stop (daemons killed, machine rebooted) slurmctld restores jobs
# as RUNNING whose processes are gone, and only notices much later. With a fresh slurmd and none of
# our slurmstepds alive they are ghosts: cancel them so the node is really free.
cancel_ghost_jobs() {
    [ -z "$(leftover_job_pids)" ] || return 0
    local ghosts
    ghosts=$(slurm squeue -h -t R,S -o %A 2>/dev/null | tr '\n' ' ')
    if [ -n "${ghosts// /}" ]; then
        log "cancelling job(s) left RUNNING by an unclean shutdown (their processes are gone): $ghosts"
        # shellcheck disable=SC2086
        slurm scancel $ghosts || true
    fi
}

# cancel_all_jobs: job steps outlive slurmd, so cancel every job (and wait up to 15 s) before stopping it.
cancel_all_jobs() {
    pid_alive "$CTLD_PID" slurmctld >/dev/null && [ -f "$CONF" ] || return 0
    local jobs i
    mapfile -t jobs < <(slurm squeue -h -o %A 2>/dev/null | sort -u)
    [ "${#jobs[@]}" -gt 0 ] || return 0
    log "cancelling ${#jobs[@]} job(s): ${jobs[*]}"
    slurm scancel --quiet "${jobs[@]}" 2>/dev/null || true
    for i in $(seq 1 30); do
        [ -z "$(slurm squeue -h -t R,CG,S -o %i 2>/dev/null)" ] && break
        sleep 0.5
    done
}

# kill_leftover_jobs: the safety net (slurmctld already dead, so nothing got cancelled): job steps of
# *this* cluster that still run get SIGTERM, then SIGKILL.
kill_leftover_jobs() {
    local left
    left=$(leftover_job_pids | tr '\n' ' ')
    [ -n "${left// /}" ] || return 0
    log "killing leftover job processes of this cluster: $left"
    # shellcheck disable=SC2086
    kill -TERM $left 2>/dev/null || true
    sleep 1
    left=$(leftover_job_pids | tr '\n' ' ')
    # shellcheck disable=SC2086
    if [ -n "${left// /}" ]; then kill -KILL $left 2>/dev/null || true; fi
}

show_logs() {
    local f
    for f in "$DIR/log/munged.log" "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log"; do
        [ -f "$f" ] || continue
        printf '\n----- tail of %s -----\n' "$f" >&2
        tail -n 25 "$f" >&2
    done
}

# ------------------------------------------------------------------ install

install_packages() {
    local missing=0 c
    for c in munged munge slurmctld slurmd sbatch sinfo; do
        command -v "$c" >/dev/null 2>&1 || missing=1
    done
    [ "$missing" -eq 0 ] && return 0
    command -v apt-get >/dev/null 2>&1 || die "slurm/munge are not installed and apt-get is unavailable; install slurm-wlm and munge by hand"
    log "installing slurm-wlm and munge with apt-get (non-interactive)"
    local apt=(apt-get -o DPkg::Lock::Timeout=600 -y -q --no-install-recommends)
    export DEBIAN_FRONTEND=noninteractive
    if ! "${apt[@]}" install slurm-wlm munge >&2; then
        log "install failed; running apt-get update and retrying"
        # apt-get update takes the lists lock, which DPkg::Lock::Timeout does
        # not cover on older apt: retry while another apt holds it.
        local i
        for i in $(seq 1 60); do
            apt-get -o DPkg::Lock::Timeout=600 -q update >&2 && break
            log "apt-get update failed (lock held by another apt?); retry $i/60 in 10 s"
            sleep 10
        done
        "${apt[@]}" install slurm-wlm munge >&2 || die "apt-get install slurm-wlm munge failed"
    fi
}

# ------------------------------------------------------------------- config

write_config() {
    local cpus mem defmem
    cpus=$(nproc)
    # MemTotal in MB, minus 1% so rounding can never make RealMemory exceed
    # what slurmd detects (that would drain the node as "Low RealMemory").
    mem=$(free -m | awk '/^Mem:/{print $2}')
    mem=$((mem - mem / 100))
    defmem=${LTBENCH_SLURM_DEF_MEM_PER_CPU:-$((mem / cpus < 1024 ? mem / cpus : 1024))}

    cat >"$CONF.tmp" <<EOF
# Generated by scripts/slurm-local.sh -- single-node Slurm on localhost.
# Regenerated on every 'up' that starts the cluster; edits are lost.
ClusterName=ltbench
SlurmctldHost=$NODE
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root

# Own munged, own key and socket (see $MUNGE_DIR), never the system one.
# cred_expire also delays restarting a requeued job (default 120 s).
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10

# No systemd, no cgroups.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
LaunchType=launch/slurm

# Nodes are shared: array tasks / small jobs run side by side.
SchedulerType=sched/backfill
# Scheduling passes every 5 s (defaults: main 60 s, backfill 30 s): a requeued
# job becomes eligible cred_expire+1 s after the requeue but only starts at the
# next periodic pass (measured: ~45 s with the defaults, ~13 s with these).
SchedulerParameters=sched_interval=5,bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$defmem

# No accounting database: sacct does not work.
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none

# scontrol requeue of running jobs; a node that was down comes back by itself.
JobRequeue=1
PreemptType=preempt/none
PreemptMode=OFF
ReturnToService=2
KillWait=5
MailProg=/bin/true
MinJobAge=300
SlurmdTimeout=60
InactiveLimit=0

StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info

NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    mv "$CONF.tmp" "$CONF"
    log "wrote $CONF (CPUs=$cpus RealMemory=${mem}MB DefMemPerCPU=${defmem}MB)"
}

# ------------------------------------------------------------------ daemons

start_munged() {
    if pid_alive "$MUNGE_PID" munged >/dev/null; then return 0; fi
    if [ ! -s "$MUNGE_KEY" ]; then
        log "creating munge key $MUNGE_KEY"
        if command -v mungekey >/dev/null 2>&1; then
            mungekey --create --keyfile="$MUNGE_KEY" >&2
        else
            dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
        fi
    fi
    chmod 0400 "$MUNGE_KEY"
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    log "starting munged"
    munged --force \
        --key-file="$MUNGE_KEY" \
        --socket="$MUNGE_SOCKET" \
        --pid-file="$MUNGE_PID" \
        --log-file="$DIR/log/munged.log" \
        --seed-file="$MUNGE_DIR/munged.seed" \
        || fail_up "munged failed to start"
    local i
    for i in $(seq 1 50); do
        if munge -S "$MUNGE_SOCKET" -n 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
    done
    fail_up "munged started but 'munge -n | unmunge' fails on $MUNGE_SOCKET"
}

start_slurmctld() {
    if pid_alive "$CTLD_PID" slurmctld >/dev/null; then return 0; fi
    log "starting slurmctld"
    # Daemonizes itself and writes SlurmctldPidFile.
    slurmctld -f "$CONF" || fail_up "slurmctld failed to start"
}

start_slurmd() {
    if pid_alive "$SLURMD_PID" slurmd >/dev/null; then return 0; fi
    log "starting slurmd"
    # -N: our NodeName is 'localhost', not the machine's hostname.
    slurmd -f "$CONF" -N "$NODE" || fail_up "slurmd failed to start"
}

# port_busy PORT: something already listens on 127.0.0.1:PORT.
port_busy() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# check_ports: fail early (before starting anything) if another Slurm holds our ports.
check_ports() {
    local hint="set LTBENCH_SLURMCTLD_PORT and LTBENCH_SLURMD_PORT to free ports"
    if ! pid_alive "$CTLD_PID" slurmctld >/dev/null && port_busy "$CTLD_PORT"; then
        die "port $CTLD_PORT is already in use (another slurmctld?); $hint"
    fi
    if ! pid_alive "$SLURMD_PID" slurmd >/dev/null && port_busy "$SLURMD_PORT"; then
        die "port $SLURMD_PORT is already in use (another slurmd?); $hint"
    fi
}

# prepare_state_dir: the folders, and a config rewritten only while slurmctld/slurmd are not running.
prepare_state_dir() {
    mkdir -p "$DIR"/{state,spool/slurmd,log,run}
    # munged wants the socket dir searchable by all (users run sbatch too); the key itself is 0400 root.
    install -d -m 0755 "$MUNGE_DIR"
    chmod 0755 "$DIR"
    if ! pid_alive "$CTLD_PID" slurmctld >/dev/null && ! pid_alive "$SLURMD_PID" slurmd >/dev/null; then
        write_config
    fi
}

fail_up() {
    show_logs
    die "$* -- '$PROG down' stops whatever was started"
}

wait_pidfile() {
    local pidfile=$1 name=$2 i
    for i in $(seq 1 100); do
        pid_alive "$pidfile" "$name" >/dev/null && return 0
        sleep 0.1
    done
    fail_up "$name did not start (no live pid in $pidfile)"
}

# --------------------------------------------------------------- commands

cmd_up() {
    local install=1 arg
    for arg in "$@"; do
        case $arg in
            --no-install) install=0 ;;
            *) die "up: unknown argument $arg" ;;
        esac
    done
    need_root up
    local t0=$SECONDS c

    if is_up && node_ready 0 >/dev/null; then
        log "already up (state dir $DIR)"
        export_line
        return 0
    fi

    [ "$install" -eq 1 ] && install_packages
    for c in munged munge unmunge slurmctld slurmd sinfo sbatch; do
        command -v "$c" >/dev/null 2>&1 || die "$c not found (install slurm-wlm and munge)"
    done
    prepare_state_dir
    check_ports

    start_munged
    start_slurmctld
    wait_pidfile "$CTLD_PID" slurmctld
    local slurmd_t0 state
    slurmd_t0=$(date +%s)
    if pid_alive "$SLURMD_PID" slurmd >/dev/null; then slurmd_t0=0; fi
    start_slurmd
    wait_pidfile "$SLURMD_PID" slurmd
    state=$(wait_until_idle "$slurmd_t0")
    if [ "$slurmd_t0" -ne 0 ]; then cancel_ghost_jobs; fi
    log "up in $((SECONDS - t0))s: node $NODE is $state; state dir $DIR"
    log "to use it: export SLURM_CONF=$CONF"
    export_line
}

cmd_down() {
    local purge=0 arg
    for arg in "$@"; do
        case $arg in
            --purge) purge=1 ;;
            *) die "down: unknown argument $arg" ;;
        esac
    done
    need_root down

    cancel_all_jobs
    stop_pidfile "$SLURMD_PID" slurmd
    stop_pidfile "$CTLD_PID" slurmctld
    stop_pidfile "$MUNGE_PID" munged
    kill_leftover_jobs

    if [ "$purge" -eq 1 ]; then
        # Only ever delete a directory this script set up.
        if [ -e "$DIR" ] && ! grep -qs '^# Generated by scripts/slurm-local.sh' "$CONF"; then
            die "refusing to remove $DIR: no slurm.conf generated by this script in it"
        fi
        rm -rf -- "$DIR"
        log "down; removed $DIR"
    else
        log "down; state dir $DIR kept (use --purge to remove it)"
    fi
}

cmd_status() {
    local m c d
    m=$(pid_alive "$MUNGE_PID" munged || echo -)
    c=$(pid_alive "$CTLD_PID" slurmctld || echo -)
    d=$(pid_alive "$SLURMD_PID" slurmd || echo -)
    if is_up; then
        echo "up (state dir $DIR; munged $m, slurmctld $c, slurmd $d)"
        export_line
        echo
        slurm sinfo || true
        echo
        slurm squeue || true
        return 0
    fi
    if [ "$m$c$d" != "---" ]; then
        echo "partly up (state dir $DIR; munged $m, slurmctld $c, slurmd $d); run '$PROG down' or '$PROG up'"
        return 1
    fi
    echo "down (state dir $DIR)"
    return 3
}

main() {
    local cmd=${1:-}
    [ $# -gt 0 ] && shift
    case $cmd in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        status) cmd_status "$@" ;;
        env) export_line ;;
        -h | --help | help) usage ;;
        *) usage; exit 2 ;;
    esac
}

main "$@"
