#!/usr/bin/env bash
# Submit a varied set of short REAL jobs to a test cluster (tests/slurm/cluster.sh up [VERSION])
# and capture genuine sacct output into tests/data/sacct/, as slurm2205_* or slurm2511_*.
# Run as root from the repo root.  Takes ~3 minutes (the TIMEOUT job dominates).
#
#   tests/slurm/capture_sacct.sh [OUTDIR] [VERSION]     # VERSION: 22.05 (default) or 25.11
set -euo pipefail
export LC_ALL=C.UTF-8

REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$REPO/tests/data/sacct}
VERSION=${2:-${COCAQ_SLURM_VERSION:-22.05}}
# that version's sbatch, sacct ... (users' jobs get the same PATH and SLURM_CONF below)
eval "$("$REPO/tests/slurm/cluster.sh" env "$VERSION")"
TAG=slurm${VERSION/./}
mkdir -p "$OUT"
WORK=/tmp/cocaq-capture
rm -rf "$WORK"; mkdir -p "$WORK"; chmod 1777 "$WORK"
CMDLOG=$WORK/commands.log   # exact commands, copied into README.md by hand
: >"$CMDLOG"

FMT=JobID,JobIDRaw,JobName,User,UID,Account,Partition,QOS,NodeList,NNodes,AllocCPUS,AllocTRES,ReqTRES,ReqMem,Submit,Start,End,Elapsed,ElapsedRaw,State,ExitCode,TotalCPU,Comment,ConsumedEnergyRaw,Cluster,Timelimit

log() { printf '[capture %s] %s\n' "$(date +%T)" "$*" >&2; }

# run a submit command (as root, or as a user through su), print the job id
sub() { # user command...
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

START=$(date +%Y-%m-%dT%H:%M:%S)
echo "START=$START" >"$WORK/start"
log "start=$START"

# --- batch scripts ----------------------------------------------------------
cat >"$WORK/steps.sh" <<'EOF'
#!/bin/bash
#SBATCH -J multi_step
#SBATCH -n 1
#SBATCH -t 00:05:00
srun -n1 -J prep hostname
srun -n1 -J train sleep 3
srun -n1 -J eval bash -c 'echo done'
EOF
cat >"$WORK/het.sh" <<'EOF'
#!/bin/bash
#SBATCH -J het_pipeline
#SBATCH -n 1 --mem=500M -p gpu --gres=gpu:1
#SBATCH hetjob
#SBATCH -n 1 --mem=300M -p cpu
srun --het-group=0 sleep 2 : --het-group=1 sleep 2
srun --het-group=1 hostname
EOF
chmod 755 "$WORK"/*.sh

# 1. timeout first: it needs ~1-1.5 min of wall time
T_TIMEOUT=$(sub root sbatch -J will_timeout -p cpu -t 0:01:00 -o /dev/null --wrap 'sleep 300' | jid)
# 2. job to be cancelled while RUNNING
T_CANCEL=$(sub bob sbatch -J to_cancel -t 10 -o /dev/null --wrap 'sleep 300' | jid)
# 3. steps
T_STEPS=$(sub root sbatch -o /dev/null steps.sh | jid)
# 4. GPU jobs
T_GPU1=$(sub alice sbatch -J gpu_one --gres=gpu:1 -t 5 -o /dev/null --wrap 'echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; sleep 3' | jid)
T_GPU2=$(sub bob sbatch -J gpu_two --gres=gpu:2 -t 5 -o /dev/null --wrap 'echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; sleep 3' | jid)
T_GPUT=$(sub root sbatch -J gpu_typed -p gpu --gres=gpu:a100:1 -t 5 -o /dev/null --wrap 'sleep 2' | jid)
# 5. accounts + comments (one non-ASCII)
T_CV=$(sub root sbatch -J vis_comment --account=lab_vision --comment "exp=resnet50 lr=0.1 seed=7" -o /dev/null --wrap 'sleep 2' | jid)
T_CN=$(sub root sbatch -J nlp_comment --account=lab_nlp --comment "Übersetzung de→日本語, café ✓" -o /dev/null --wrap 'sleep 2' | jid)
# 6. failing job (exit 3)
T_FAIL=$(sub alice sbatch -J fails_exit3 -p cpu -o /dev/null --wrap 'sleep 1; exit 3' | jid)
# 7. arrays
T_ARR=$(sub alice sbatch -J arr4 --array=0-3 -o /dev/null --wrap 'sleep 2' | jid)
T_ARR2=$(sub bob sbatch -J arr10_throttled --array=0-9%2 -p cpu -o /dev/null --wrap 'sleep 3' | jid)
# 8. heterogeneous job
T_HET=$(sub root sbatch -o /dev/null het.sh | jid || true)
# 9. memory requests
T_MEM=$(sub alice sbatch -J mem2g --mem=2G -o /dev/null --wrap 'sleep 2' | jid)
T_MPC=$(sub bob sbatch -J mem_per_cpu -n 2 --mem-per-cpu=500M -p cpu -o /dev/null --wrap 'srun sleep 2' | jid)
# 10. interactive-style srun (blocks; run in background)
echo "alice\$ srun -J interactive -n1 -t 2 bash -c 'hostname; sleep 2'" >>"$CMDLOG"
runuser -u alice -- env PATH="$PATH" SLURM_CONF="$SLURM_CONF" bash -c "cd $WORK && srun -J interactive -n1 -t 2 bash -c 'hostname; sleep 2'" >"$WORK/srun.out" 2>&1 &
SRUN_PID=$!
# 11. a longer job that will still be RUNNING in the mid-way snapshot
T_LONG=$(sub root sbatch -J long_running -p cpu --account=lab_nlp -t 5 -o /dev/null --wrap 'sleep 25' | jid)

log "submitted: timeout=$T_TIMEOUT cancel=$T_CANCEL steps=$T_STEPS gpu1=$T_GPU1 gpu2=$T_GPU2 gput=$T_GPUT cv=$T_CV cn=$T_CN fail=$T_FAIL arr=$T_ARR arr2=$T_ARR2 het=$T_HET mem=$T_MEM mpc=$T_MPC long=$T_LONG"
{
    echo "timeout=$T_TIMEOUT cancel=$T_CANCEL steps=$T_STEPS gpu1=$T_GPU1 gpu2=$T_GPU2 gput=$T_GPUT"
    echo "comment_vision=$T_CV comment_nlp=$T_CN fail=$T_FAIL arr=$T_ARR arr2=$T_ARR2 het=$T_HET"
    echo "mem=$T_MEM mpc=$T_MPC long=$T_LONG"
} >"$WORK/jobids"

# cancel bob's job once it is RUNNING
for _ in $(seq 1 240); do
    [[ $(squeue -h -j "$T_CANCEL" -o %T) == RUNNING ]] && break
    sleep 0.5
done
sleep 2
echo "root# scancel $T_CANCEL   (while RUNNING)" >>"$CMDLOG"
scancel "$T_CANCEL"

# mid-way snapshot: wait until the throttled array has some tasks done, some pending
for _ in $(seq 1 240); do
    done_n=$(sacct -n -X -j "$T_ARR2" -o State -P | grep -c COMPLETED || true)
    pend_n=$(squeue -h -j "$T_ARR2" -t PD -r | wc -l)
    ((done_n >= 1 && pend_n >= 1)) && break
    sleep 0.5
done
log "mid-way snapshot"
squeue -a -r >"$WORK/squeue_midway.txt"
sacct --allusers --parsable2 -S "$START" -E now --format="$FMT" >"$OUT/${TAG}_midway_parsable2.txt"
sacct --json --allusers -S "$START" -E now >"$OUT/${TAG}_midway.json"

# A hetjob can never start on a one-node cluster (Slurm gives each component its
# own node(s)); it stays PENDING/Resources and, being first in priority, blocks
# the queue.  Cancel it after the snapshot: it is recorded as a never-started
# CANCELLED job (Start=None), which is a useful case on its own.
if [[ -n $T_HET ]]; then
    echo "root# scancel $T_HET   (hetjob cannot start on one node)" >>"$CMDLOG"
    scancel "$T_HET"
fi

# wait for everything to finish
wait "$SRUN_PID" || true
for _ in $(seq 1 600); do
    [[ -z $(squeue -h -a) ]] && break
    sleep 1
done
[[ -z $(squeue -h -a) ]] || { log "jobs still queued:"; squeue -a; }
sleep 3   # let slurmctld push final records to slurmdbd
log "final capture"
sacct --json --allusers -S "$START" -E now >"$OUT/${TAG}_sacct.json"
sacct --allusers --parsable2 -S "$START" -E now --format="$FMT" >"$OUT/${TAG}_parsable2.txt"
sacct --allusers --parsable --noheader -S "$START" -E now --format="$FMT" >"$OUT/${TAG}_parsable_noheader.txt"
sacct --helpformat >"$OUT/${TAG}_helpformat.txt"
sacct --json -j "$T_GPU2" >"$OUT/${TAG}_gpu_job.json"
sinfo --version >"$WORK/version"
cat "$WORK/start" "$WORK/jobids" "$WORK/version" "$CMDLOG" >&2
log "done"
