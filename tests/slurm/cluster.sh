#!/usr/bin/env bash
# Bring up / tear down a real single-node Slurm cluster for cocaq's integration tests: Slurm 22.05 from
# Debian 12's packages, or Slurm 25.11 built from its source (tests/slurm/build.sh, cached under its own
# prefix). Both can be up at once: each version has its own config, spool, log and run folders, ports,
# MariaDB database and binaries; only munge and mariadbd are shared. Runs as root, needs no systemd.
#
#   tests/slurm/cluster.sh up [VERSION]      # install/build (if missing), configure, start; idempotent
#   tests/slurm/cluster.sh down [VERSION]    # stop slurmd, slurmctld, slurmdbd (munged too when no other
#                                            # version is up); packages, builds and state stay
#   tests/slurm/cluster.sh status [VERSION]  # daemon pids, sinfo, sacctmgr cluster
#   tests/slurm/cluster.sh env [VERSION]     # shell lines for that version's CLIs: eval "$(... env 25.11)"
#
# VERSION: 22.05 (default; or COCAQ_SLURM_VERSION) or 25.11.
#
#               22.05 (Debian)          25.11 (built from COCAQ_SLURM_SOURCE)
#   binaries    /usr/bin, /usr/sbin     /opt/cocaq-slurm-25.11.X/{bin,sbin}
#   config      /etc/slurm              /etc/slurm-25.11 (compiled in: its CLIs need no SLURM_CONF)
#   spool       /var/spool/slurm{ctld,d,dbd}   /var/spool/slurm-25.11/{slurmctld,slurmd,slurmdbd}
#   logs, pids  /var/log/slurm, /run/slurm      /var/log/slurm-25.11, /run/slurm-25.11
#   ports       6817 ctld, 6818 d, 6819 dbd     6837, 6838, 6839
#   accounting  MariaDB slurm_acct_db            slurm_acct_db_2511
#
# Environment knobs (all optional, the same for both versions):
#   COCAQ_SLURM_PROLOG / COCAQ_SLURM_EPILOG   absolute paths of the project's
#       Prolog/Epilog hooks.  Empty (default) = no Prolog=/Epilog= lines.
#       NOTE: a non-zero epilog exit code DRAINS the node.
#   COCAQ_SLURM_TASK_PROLOG / COCAQ_SLURM_TASK_EPILOG   same for TaskProlog/TaskEpilog.
#   COCAQ_SLURM_EXTRA_CONF   extra lines appended verbatim to slurm.conf.
#   COCAQ_SLURM_USERS        unix users to create and register (default "alice bob").
#   COCAQ_DB_PASS            password of the MariaDB 'slurm' user (default below).
#   COCAQ_STOP_MARIADB=1     let `down` also stop mariadbd (default: leave it running).
#   COCAQ_SLURM_SOURCE       25.11 only: Slurm's source tarball (tests/slurm/build.sh; default
#                            ../shared/vendor/slurm-25.11.7.tar.gz beside the repository). Without it,
#                            `up 25.11` exits 3 with one line saying so.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
export LC_ALL=C.UTF-8

ACTION=${1:-}
VERSION=${2:-${COCAQ_SLURM_VERSION:-22.05}}
HERE=$(cd "$(dirname "$0")" && pwd)
CLUSTER_NAME=cocaqtest
NODE=$(hostname -s)
DB_USER=slurm
DB_PASS=${COCAQ_DB_PASS:-cocaq-slurmdbd-test}
case "$VERSION" in
    22.05)
        BIN=/usr/bin SBIN=/usr/sbin
        CONF_DIR=/etc/slurm
        RUN_DIR=/run/slurm
        LOG_DIR=/var/log/slurm
        CTLD_SPOOL=/var/spool/slurmctld
        SLURMD_SPOOL=/var/spool/slurmd
        DBD_SPOOL=/var/spool/slurmdbd
        PORT_CTLD=6817 PORT_D=6818 PORT_DBD=6819
        DB_NAME=slurm_acct_db
        ;;
    25.11)
        BIN='' SBIN='' # set by ensure_build (the prefix depends on the source's patch version)
        CONF_DIR=/etc/slurm-25.11
        RUN_DIR=/run/slurm-25.11
        LOG_DIR=/var/log/slurm-25.11
        CTLD_SPOOL=/var/spool/slurm-25.11/slurmctld
        SLURMD_SPOOL=/var/spool/slurm-25.11/slurmd
        DBD_SPOOL=/var/spool/slurm-25.11/slurmdbd
        PORT_CTLD=6837 PORT_D=6838 PORT_DBD=6839
        DB_NAME=slurm_acct_db_2511
        ;;
    *) echo "cluster.sh: unknown Slurm version '$VERSION' (22.05 or 25.11)" >&2; exit 2 ;;
esac
export SLURM_CONF=$CONF_DIR/slurm.conf
ACCOUNTS=(lab_vision lab_nlp)
read -r -a EXTRA_USERS <<<"${COCAQ_SLURM_USERS:-alice bob}"
# user -> default account (root gets both labs, default lab_vision)
declare -A USER_ACCOUNT=([alice]=lab_vision [bob]=lab_nlp)

# ---- hook point for the project's Prolog/Epilog (added by a later task) ----
PROLOG=${COCAQ_SLURM_PROLOG:-}
EPILOG=${COCAQ_SLURM_EPILOG:-}
TASK_PROLOG=${COCAQ_SLURM_TASK_PROLOG:-}
TASK_EPILOG=${COCAQ_SLURM_TASK_EPILOG:-}
EXTRA_CONF=${COCAQ_SLURM_EXTRA_CONF:-}

# Fake GPUs: char devices with NVIDIA's major number (195).  Slurm only needs
# the files to exist for gres.conf; nothing ever opens them.
GPU_TYPE=a100
GPU_DEVS=(/dev/cocaq-fake-nvidia0 /dev/cocaq-fake-nvidia1)

log() { printf '[cluster.sh %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $ACTION == env || $(id -u) -eq 0 ]] || die "must run as root"

pid_alive() { # pidfile -> true if it names a live (non-zombie) process
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null &&
        [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]
}

wait_for() { # timeout-seconds description command...
    local t=$1 what=$2; shift 2
    local i
    for ((i = 0; i < t * 2; i++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.5
    done
    die "timed out after ${t}s waiting for: $what"
}

# write file only if content differs; returns 0 if changed, 1 if unchanged
install_content() { # path mode owner content
    local path=$1 mode=$2 owner=$3 content=$4 tmp
    tmp=$(mktemp)
    printf '%s\n' "$content" >"$tmp"
    if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
        chmod "$mode" "$path"; chown "$owner" "$path"
        return 1
    fi
    install -m "$mode" -o "${owner%%:*}" -g "${owner##*:}" "$tmp" "$path"
    rm -f "$tmp"
    log "wrote $path"
    return 0
}

# ---------------------------------------------------------------- packages
ensure_packages() {
    local pkgs=(munge mariadb-server) missing=() p
    [[ $VERSION == 22.05 ]] && pkgs+=(slurm-wlm slurmdbd)
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if ((${#missing[@]})); then
        log "apt-get install ${missing[*]}"
        # policy-rc.d keeps maintainer scripts from trying to start services
        # (waits for another apt-get; on a failure, apt-get update and once more)
        "$HERE/../../scripts/apt-install.sh" -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
            "${missing[@]}"
    fi
}

# Where this version's binaries are: Debian's, or a cached build of the source (built on first use).
ensure_build() {
    if [[ $VERSION == 25.11 ]]; then
        local prefix rc=0
        prefix=$("$HERE/build.sh") || rc=$?
        ((rc == 0)) || exit "$rc" # 3: no source (build.sh said where to put it)
        BIN=$prefix/bin SBIN=$prefix/sbin
    fi
    export PATH=$BIN:$SBIN:$PATH
    # Debian's package makes the slurm user; a source build does not
    id slurm >/dev/null 2>&1 || { useradd --system --no-create-home --shell /usr/sbin/nologin slurm; log "created user slurm"; }
}

# ------------------------------------------------------------------- munge
ensure_munge() {
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating munge key"
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
    chown munge:munge /etc/munge /etc/munge/munge.key
    chmod 700 /etc/munge; chmod 400 /etc/munge/munge.key
    install -d -o munge -g munge -m 755 /run/munge
    install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
    if ! pid_alive /run/munge/munged.pid; then
        log "starting munged"
        start-stop-daemon --start --oknodo --chuid munge:munge \
            --pidfile /run/munge/munged.pid --exec /usr/sbin/munged
    fi
    wait_for 15 "munge round trip" bash -c 'munge -n | unmunge'
}

# ----------------------------------------------------------------- mariadb
ensure_mariadb() {
    if ! mysqladmin ping >/dev/null 2>&1; then
        log "starting mariadbd"
        install -d -o mysql -g mysql /run/mysqld
        start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
        wait_for 60 "mariadb ping" mysqladmin ping
    fi
    mysql -u root <<SQL
CREATE DATABASE IF NOT EXISTS ${DB_NAME};
CREATE USER IF NOT EXISTS '${DB_USER}'@'localhost' IDENTIFIED BY '${DB_PASS}';
ALTER USER '${DB_USER}'@'localhost' IDENTIFIED BY '${DB_PASS}';
GRANT ALL PRIVILEGES ON ${DB_NAME}.* TO '${DB_USER}'@'localhost';
FLUSH PRIVILEGES;
SQL
}

# ------------------------------------------------------------- dirs, devs
ensure_dirs() {
    install -d -o slurm -g slurm -m 755 "$RUN_DIR" "$LOG_DIR" "$CTLD_SPOOL" "$DBD_SPOOL"
    install -d -o root -g root -m 755 "$(dirname "$SLURMD_SPOOL")"
    install -d -o root -g root -m 755 "$SLURMD_SPOOL" "$CONF_DIR"
    local i
    for i in "${!GPU_DEVS[@]}"; do
        [[ -c ${GPU_DEVS[$i]} ]] || { mknod -m 666 "${GPU_DEVS[$i]}" c 195 "$i"; log "mknod ${GPU_DEVS[$i]}"; }
    done
    local u
    for u in "${EXTRA_USERS[@]}"; do
        id "$u" >/dev/null 2>&1 || { useradd -m -s /bin/bash "$u"; log "created unix user $u"; }
    done
}

# ------------------------------------------------------------------ config
CONF_CHANGED=0
write_configs() {
    # CPU/memory layout of this VM as slurmd sees it; keep ~1 GiB headroom.
    local hw cpus sockets cores threads mem
    hw=$("$SBIN/slurmd" -C | head -1)
    cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$hw")
    sockets=$(sed -n 's/.*SocketsPerBoard=\([0-9]*\).*/\1/p' <<<"$hw")
    cores=$(sed -n 's/.*CoresPerSocket=\([0-9]*\).*/\1/p' <<<"$hw")
    threads=$(sed -n 's/.*ThreadsPerCore=\([0-9]*\).*/\1/p' <<<"$hw")
    mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
    mem=$((mem > 2048 ? mem - 1024 : mem))

    local dbd
    dbd=$(cat <<EOF
# generated by tests/slurm/cluster.sh
AuthType=auth/munge
DbdHost=localhost
DbdPort=${PORT_DBD}
SlurmUser=slurm
DebugLevel=info
LogFile=${LOG_DIR}/slurmdbd.log
PidFile=${RUN_DIR}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=${DB_USER}
StoragePass=${DB_PASS}
StorageLoc=${DB_NAME}
EOF
)
    install_content "$CONF_DIR/slurmdbd.conf" 600 slurm:slurm "$dbd" && CONF_CHANGED=1

    local hooks=""
    [[ -n $PROLOG ]] && hooks+="Prolog=${PROLOG}"$'\n'
    [[ -n $EPILOG ]] && hooks+="Epilog=${EPILOG}"$'\n'
    [[ -n $TASK_PROLOG ]] && hooks+="TaskProlog=${TASK_PROLOG}"$'\n'
    [[ -n $TASK_EPILOG ]] && hooks+="TaskEpilog=${TASK_EPILOG}"$'\n'

    # 25.11 has no switch/none plugin (no SwitchType means none)
    local SWITCH=""
    [[ $VERSION == 22.05 ]] && SWITCH=$'SwitchType=switch/none\n'
    local conf
    conf=$(cat <<EOF
# generated by tests/slurm/cluster.sh
ClusterName=${CLUSTER_NAME}
SlurmctldHost=${NODE}
SlurmUser=slurm
AuthType=auth/munge
SlurmctldPort=${PORT_CTLD}
SlurmdPort=${PORT_D}
StateSaveLocation=${CTLD_SPOOL}
SlurmdSpoolDir=${SLURMD_SPOOL}
SlurmctldPidFile=${RUN_DIR}/slurmctld.pid
SlurmdPidFile=${RUN_DIR}/slurmd.pid
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
${SWITCH}SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
MinJobAge=10
KillWait=5
InactiveLimit=0
Waittime=0
MaxArraySize=1001
PrologFlags=Alloc
GresTypes=gpu
# accounting
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=${PORT_DBD}
AccountingStorageTRES=gres/gpu,gres/gpu:${GPU_TYPE}
AccountingStoreFlags=job_comment
AccountingStorageEnforce=associations
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
JobCompType=jobcomp/none
# project hooks (COCAQ_SLURM_PROLOG / COCAQ_SLURM_EPILOG ...)
${hooks}${EXTRA_CONF}
NodeName=${NODE} CPUs=${cpus} Boards=1 SocketsPerBoard=${sockets} CoresPerSocket=${cores} ThreadsPerCore=${threads} RealMemory=${mem} Gres=gpu:${GPU_TYPE}:${#GPU_DEVS[@]} State=UNKNOWN
PartitionName=gpu Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP
PartitionName=cpu Nodes=${NODE} Default=NO MaxTime=INFINITE State=UP
EOF
)
    install_content "$CONF_DIR/slurm.conf" 644 root:root "$conf" && CONF_CHANGED=1

    local gres
    gres=$(cat <<EOF
# generated by tests/slurm/cluster.sh -- fake GPUs (mknod c 195 N)
AutoDetect=off
NodeName=${NODE} Name=gpu Type=${GPU_TYPE} File=${GPU_DEVS[0]}
NodeName=${NODE} Name=gpu Type=${GPU_TYPE} File=${GPU_DEVS[1]}
EOF
)
    install_content "$CONF_DIR/gres.conf" 644 root:root "$gres" && CONF_CHANGED=1
    return 0
}

# ---------------------------------------------------------------- daemons
# A daemon started from another build (a rebuilt or moved 25.11 prefix: its binary deleted or elsewhere)
# is stopped, so that `up` starts this build's: slurmd would otherwise launch jobs through a slurmstepd
# that is gone.
stale_daemons() {
    local d pf pid exe
    for d in slurmd slurmctld slurmdbd; do
        pf=$RUN_DIR/$d.pid
        pid_alive "$pf" || continue
        pid=$(cat "$pf")
        exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
        # (resolved: Debian's /usr/sbin/slurmd is an alternatives link to slurmd-wlm)
        if [[ -n $exe && $exe != "$(readlink -f "$SBIN/$d")" ]]; then
            log "$d (pid $pid) runs $exe, not $SBIN/$d: restarting it"
            stop_pidfile "$d" "$pf"
        fi
    done
}

start_slurmdbd() {
    if ! pid_alive "$RUN_DIR/slurmdbd.pid"; then
        log "starting slurmdbd"
        "$SBIN/slurmdbd"
    elif ((CONF_CHANGED)); then
        log "slurmdbd already running (config changed: restart with down/up if needed)"
    fi
    wait_for 60 "slurmdbd answering sacctmgr" sacctmgr -n list cluster
}

register_accounting() {
    sacctmgr_add() { # sacctmgr -i add ... (idempotent: 'already exists' is fine)
        local out
        if ! out=$(sacctmgr -i "$@" 2>&1); then
            grep -qiE 'already exist|Nothing new added' <<<"$out" || { echo "$out" >&2; return 1; }
        fi
    }
    sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER_NAME" ||
        sacctmgr_add add cluster "$CLUSTER_NAME"
    local a
    for a in "${ACCOUNTS[@]}"; do
        sacctmgr -n -P list account "$a" format=account | grep -qx "$a" ||
            sacctmgr_add add account "$a" cluster="$CLUSTER_NAME" \
                description="cocaq test lab $a" organization=cocaq
    done
    # root: member of every lab, default the first
    local u acct
    for a in "${ACCOUNTS[@]}"; do
        sacctmgr -n -P list assoc cluster="$CLUSTER_NAME" user=root account="$a" format=user | grep -qx root ||
            sacctmgr_add add user root account="$a" defaultaccount="${ACCOUNTS[0]}" cluster="$CLUSTER_NAME"
    done
    for u in "${EXTRA_USERS[@]}"; do
        acct=${USER_ACCOUNT[$u]:-${ACCOUNTS[0]}}
        sacctmgr -n -P list assoc cluster="$CLUSTER_NAME" user="$u" account="$acct" format=user | grep -qx "$u" ||
            sacctmgr_add add user "$u" account="$acct" defaultaccount="$acct" cluster="$CLUSTER_NAME"
    done
}

start_slurm() {
    # A daemon that was already running still has the old slurm.conf (e.g. other Prolog=/Epilog=
    # lines): `scontrol reconfigure` makes slurmctld and every slurmd re-read it.
    local was_running=0
    if pid_alive "$RUN_DIR/slurmctld.pid"; then
        was_running=1
    else
        log "starting slurmctld"
        "$SBIN/slurmctld"
    fi
    wait_for 60 "slurmctld ping" bash -c 'scontrol ping | grep -q UP'
    if pid_alive "$RUN_DIR/slurmd.pid"; then
        was_running=1
    else
        log "starting slurmd"
        "$SBIN/slurmd"
    fi
    if ((CONF_CHANGED && was_running)); then
        log "config changed while Slurm was running -> scontrol reconfigure"
        scontrol reconfigure || true
        sleep 1 # slurmctld forwards it to slurmd asynchronously
    fi
    # a node left DRAIN/DOWN by an earlier run (e.g. failing epilog) is resumed
    local st
    st=$(sinfo -h -n "$NODE" -o '%T' | head -1)
    case "$st" in
        *drain*|down*|fail*) log "node state '$st' -> resume"; scontrol update nodename="$NODE" state=resume || true ;;
    esac
    wait_for 90 "node $NODE idle" bash -c "sinfo -h -n '$NODE' -o '%T' | grep -qE '^(idle|mixed|allocated)\$'"
}

cmd_up() {
    local t0=$SECONDS
    ensure_packages
    ensure_build
    ensure_munge
    ensure_mariadb
    ensure_dirs
    write_configs
    stale_daemons
    start_slurmdbd
    register_accounting
    start_slurm
    sinfo
    log "cluster '$CLUSTER_NAME' up on node '$NODE' ($(sinfo --version), config $SLURM_CONF)"
    echo "up took $((SECONDS - t0)) seconds"
}

stop_pidfile() { # name pidfile
    local name=$1 pf=$2 i pid
    pid=$(cat "$pf" 2>/dev/null || true)
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
        log "stopping $name (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        # kill -0 also succeeds for an unreaped zombie, so check /proc state too
        for ((i = 0; i < 60; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] && break
            sleep 0.5
        done
        if kill -0 "$pid" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]; then
            log "$name did not stop, SIGKILL"; kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$pf"
}

cmd_down() {
    # slurmd first (lets running steps be torn down), then controller, then dbd
    stop_pidfile slurmd "$RUN_DIR/slurmd.pid"
    stop_pidfile slurmctld "$RUN_DIR/slurmctld.pid"
    stop_pidfile slurmdbd "$RUN_DIR/slurmdbd.pid"
    # munged serves both versions: only stopped when the other one is not up
    local other=/run/slurm-25.11
    [[ $VERSION == 25.11 ]] && other=/run/slurm
    if pid_alive "$other/slurmctld.pid" || pid_alive "$other/slurmdbd.pid"; then
        log "munged left running (the other Slurm version is up)"
    else
        stop_pidfile munged /run/munge/munged.pid
    fi
    if [[ ${COCAQ_STOP_MARIADB:-0} == 1 ]]; then
        mysqladmin shutdown 2>/dev/null || true
    fi
    log "Slurm $VERSION cluster down (packages, build, config, DB and spool state kept)"
}

cmd_status() {
    local n pf rc=0
    if [[ $VERSION == 25.11 ]]; then
        local prefix
        prefix=$("$HERE/build.sh" --check >/dev/null && "$HERE/build.sh") || { echo "slurm $VERSION: not built"; return 1; }
        export PATH=$prefix/bin:$prefix/sbin:$PATH
    fi
    for n in munged:/run/munge/munged.pid slurmdbd:$RUN_DIR/slurmdbd.pid \
             slurmctld:$RUN_DIR/slurmctld.pid slurmd:$RUN_DIR/slurmd.pid; do
        pf=${n#*:}
        if pid_alive "$pf"; then echo "${n%%:*}: running (pid $(cat "$pf"))"
        else echo "${n%%:*}: stopped"; rc=1; fi
    done
    mysqladmin ping >/dev/null 2>&1 && echo "mariadb: running" || { echo "mariadb: stopped"; rc=1; }
    if ((rc == 0)); then
        sinfo || rc=1
        sacctmgr -n list cluster format=cluster,controlhost,rpc || true
    fi
    return $rc
}

cmd_env() { # the lines a shell (or a test) needs to use this version's CLIs
    local bin=/usr/bin sbin=/usr/sbin prefix
    if [[ $VERSION == 25.11 ]]; then
        prefix=$("$HERE/build.sh" --check >/dev/null && "$HERE/build.sh") || { echo "slurm $VERSION: not built (tests/slurm/cluster.sh up 25.11)" >&2; return 1; }
        bin=$prefix/bin sbin=$prefix/sbin
    fi
    printf 'export PATH=%q:%q:"$PATH"\nexport SLURM_CONF=%q\n' "$bin" "$sbin" "$SLURM_CONF"
}

case "$ACTION" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) cmd_env ;;
    *) echo "usage: $0 up|down|status|env [22.05|25.11]" >&2; exit 2 ;;
esac
