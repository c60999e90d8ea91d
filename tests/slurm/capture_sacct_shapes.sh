#!/usr/bin/env bash
# Capture the shapes of real sacct output that capture_sacct.sh's jobs do not have, from the Slurm 22.05
# test cluster (tests/slurm/cluster.sh up 22.05): an allocation that ran no step at all (TotalCPU
# 00:00:00), a job killed right after it started, jobs that burn known CPU time (TotalCPU not 0), a
# RUNNING job mid-way, an array, a GPU job, a 2-task srun, all with the step-level fields TRESUsageInAve,
# TRESUsageInMax, MaxRSS and NTasks, in --parsable2 (with steps, and with -X: job lines only) and --json.
# Writes tests/data/sacct/slurm2205_shapes_*. Run as root from the repo root; about 2 minutes.
#
#   tests/slurm/capture_sacct_shapes.sh [OUTDIR]
set -euo pipefail
export LC_ALL=C.UTF-8

REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$REPO/tests/data/sacct}
eval "$("$REPO/tests/slurm/cluster.sh" env 22.05)"
TAG=slurm2205_shapes
mkdir -p "$OUT"
WORK=/tmp/cocaq-capture-shapes
rm -rf "$WORK"; mkdir -p "$WORK"; chmod 1777 "$WORK"
CMDLOG=$WORK/commands.log

# capture_sacct.sh's --format, and the step-level fields the importer reads since
FMT=JobID,JobIDRaw,JobName,User,UID,Account,Partition,QOS,NodeList,NNodes,AllocCPUS,AllocTRES,ReqTRES,ReqMem,Submit,Start,End,Elapsed,ElapsedRaw,State,ExitCode,TotalCPU,Comment,ConsumedEnergyRaw,Cluster,Timelimit,TRESUsageInAve,TRESUsageInMax,MaxRSS,NTasks

log() { printf '[capture-shapes %s] %s\n' "$(date +%T)" "$*" >&2; }

sub() { # user command...: run a submit command as root or as a user, log it
    local user=$1; shift
    local cmd
    cmd=$(printf '%q ' "$@")
    if [[ $user == root ]]; then
        echo "root# $*" >>"$CMDLOG"
        (cd "$WORK" && "$@")
    else
        echo "$user\$ $*" >>"$CMDLOG"
        runuser -u "$user" -- env PATH="$PATH" SLURM_CONF="$SLURM_CONF" bash -c "cd $WORK && $cmd"
    fi
}
jid() { sed -n 's/^Submitted batch job \([0-9]*\).*/\1/p'; }
state() { squeue -h -j "$1" -o %T 2>/dev/null || true; }
wait_state() { # job state: up to 2 minutes
    for _ in $(seq 1 240); do
        [[ $(state "$1") == "$2" ]] && return 0
        sleep 0.5
    done
    log "job $1 never reached $2"; return 1
}

START=$(date +%Y-%m-%dT%H:%M:%S)
log "start=$START"

cat >"$WORK/burn_steps.sh" <<'EOF'
#!/bin/bash
#SBATCH -J burn_steps
#SBATCH -p cpu
#SBATCH -n 1
#SBATCH -t 00:05:00
srun -n1 -J burn timeout 6 sh -c 'while :; do :; done'
srun -n1 -J idle sleep 2
EOF
chmod 755 "$WORK"/*.sh

# 1. an allocation that never runs a step (salloc --no-shell): no step lines, TotalCPU 00:00:00
echo "alice\$ salloc --no-shell -J alloc_no_steps -p cpu -t 5" >>"$CMDLOG"
T_ALLOC=$(runuser -u alice -- env PATH="$PATH" SLURM_CONF="$SLURM_CONF" bash -c \
    "cd $WORK && salloc --no-shell -J alloc_no_steps -p cpu -t 5 2>&1" |
    sed -n 's/.*Granted job allocation \([0-9]*\).*/\1/p')
# 2. a job that burns ~6 s of one core in an srun step, then sleeps in another (TotalCPU ~6 s)
T_BURN=$(sub root sbatch -o /dev/null burn_steps.sh | jid)
# 3. a batch job that burns ~5 s itself (no srun: its CPU time is the .batch step's)
T_BBURN=$(sub bob sbatch -J batch_burn -p cpu -t 5 -o /dev/null --wrap "timeout 5 sh -c 'while :; do :; done'" | jid)
# 4. a job killed right after it started
T_KILL=$(sub bob sbatch -J killed_at_start -t 5 -o /dev/null --wrap 'sleep 300' | jid)
# 5. an array of three
T_ARR=$(sub alice sbatch -J arr3 --array=0-2 -p cpu -t 5 -o /dev/null --wrap 'sleep 2' | jid)
# 6. a GPU job (no NVML on this node: no gres/gpuutil or gres/gpumem in TRESUsageIn*)
T_GPU=$(sub alice sbatch -J gpu_sleep --gres=gpu:1 --mem=1G -t 5 -o /dev/null --wrap 'sleep 3' | jid)
# 7. two tasks in one srun step (NTasks 2), memory per CPU
T_TWO=$(sub bob sbatch -J two_tasks -n 2 --mem-per-cpu=400M -p cpu -t 5 -o /dev/null --wrap 'srun sleep 3' | jid)
# 8. a job still RUNNING when the mid-way snapshot is taken
T_LONG=$(sub root sbatch -J long_running -p cpu --account=lab_nlp -t 5 -o /dev/null --wrap 'srun sleep 40' | jid)
log "ids: alloc=$T_ALLOC burn=$T_BURN bburn=$T_BBURN kill=$T_KILL arr=$T_ARR gpu=$T_GPU two=$T_TWO long=$T_LONG"

wait_state "$T_KILL" RUNNING
echo "root# scancel $T_KILL   (as soon as it was RUNNING)" >>"$CMDLOG"
scancel "$T_KILL"
# the allocation runs for a while with nothing in it, then is released
sleep 12
echo "root# scancel $T_ALLOC   (the empty allocation, 12 s after the kill)" >>"$CMDLOG"
scancel "$T_ALLOC"

# mid-way: the long job RUNNING (its srun step too), some others done
wait_state "$T_LONG" RUNNING
sleep 8
log "mid-way snapshot"
sacct --allusers --parsable2 -S "$START" -E now --format="$FMT" >"$OUT/${TAG}_midway_parsable2.txt"
sacct --json --allusers -S "$START" -E now >"$OUT/${TAG}_midway.json"

for _ in $(seq 1 300); do
    [[ -z $(squeue -h -a) ]] && break
    sleep 1
done
[[ -z $(squeue -h -a) ]] || { log "jobs still queued:"; squeue -a; }
sleep 3 # let slurmctld push the final records to slurmdbd
log "final capture"
sacct --allusers --parsable2 -S "$START" -E now --format="$FMT" >"$OUT/${TAG}_parsable2.txt"
sacct --allusers --parsable2 -X -S "$START" -E now --format="$FMT" >"$OUT/${TAG}_X_parsable2.txt"
sacct --json --allusers -S "$START" -E now >"$OUT/${TAG}_sacct.json"
{
    echo "START=$START"
    echo "alloc=$T_ALLOC burn=$T_BURN bburn=$T_BBURN kill=$T_KILL arr=$T_ARR gpu=$T_GPU two=$T_TWO long=$T_LONG"
    sinfo --version
    cat "$CMDLOG"
} >&2
log "done"
