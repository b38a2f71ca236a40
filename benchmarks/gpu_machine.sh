#!/usr/bin/env bash
# The figures of a machine with a GPU and many cores, in one prepared run (about 10 minutes; --short:
# about 6 on 2 cores, for trying it out on any machine first; --only STEP,... runs those steps only:
# learner, ingest, training, acting, lag, pong-to-score; the last two are not run unless named, as
# they take up to 2 and 8 minutes of their own). Each step writes its output under $OUT:
#   learner.txt  the Pong PPO and APPO learners on the device, fp32 and bf16 (ppo.precision), eager and
#                under torch.compile with CUDA graphs (ppo.compile=reduce-overhead): samples/s and the
#                fraction of the device's own matmul rate (benchmarks/learner.py --peak --compile)
#   ingest.txt   the trainer's receive path for pong-appo's and pong's results, before and after the
#                ingest thread, alone and with the learner busy on the device (benchmarks/ingest.py)
#   pong.txt     `rlfarm train --device DEVICE` with a local worker per core but two, for the presets
#                pong-appo (ASYNC: every worker acts all the time) and pong (SYNC: a group is 2 tasks,
#                so 2 workers act it whatever the farm's size), then SB3 PPO with the zoo's Atari
#                settings on 16 envs in subprocesses, learner on the same device, for the same seconds:
#                env steps/s of each, their ratios, slots waiting and learner busy (benchmarks/pong.py)
#   acting.txt   acting Pong on 1, 2, 4, 8 and 14 processes: efficiency against N x one process,
#                beside a pure Python loop's on the same N, the machine's own (acting_scale.py --reference)
#   lag.txt      `rlfarm train --preset pong-fast` (each result learned as it comes) and `--preset
#                pong-fast-farm` (8 results an update) with a worker per core but two: env steps/s,
#                policy lag, tasks in flight, who waits
#   to-score.txt `rlfarm train --preset pong-fast-farm` with a worker per core but two until the mean
#                of 20 games reaches 18 or 8 minutes pass (--short: -20.5 or 1 minute): minutes and
#                env steps at -15, 0, +10 and 18, policy lag (benchmarks/pong.py --to-score; the curve
#                under $OUT/to-score/)
#   machine.txt  the card (nvidia-smi), the cores and their topology (lscpu), torch's version
#
#   OUT=/tmp/gpu PYTHON=.venv/bin/python bash benchmarks/gpu_machine.sh [--short]
# (SCORE_MINUTES and LAG_SECONDS change those budgets, to fit a lease's minutes.)
#
# Needs rlfarm installed with the atari and bench extras in $PYTHON's environment and redis-server on
# the PATH. The device is cuda where torch sees one, else cpu. A step that fails is named at the end
# and the script exits 1, but the steps after it still run: the machine's minutes are scarce.
set -uo pipefail
cd "$(dirname "$0")/.."
short=0 only="learner,ingest,training,acting"
while [ $# -gt 0 ]; do
  case "$1" in
    --short) short=1 ;;
    --only) only="$2"; shift ;;
    *) echo "usage: $0 [--short] [--only learner,ingest,training,acting,lag,pong-to-score]" >&2; exit 2 ;;
  esac
  shift
done
runs() { [[ ",$only," == *",$1,"* ]]; }
PYTHON=${PYTHON:-python3}
OUT=${OUT:-benchmarks/results/gpu-machine-$(date +%F)}
mkdir -p "$OUT"
failed=""
export PYTHONUNBUFFERED=1
device=$("$PYTHON" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
cores=$(nproc)
workers=$((cores > 3 ? cores - 2 : 1))  # a core each for the trainer and Redis
if [ "$short" = 1 ]; then  # APPO's learner alone: bf16 on a CPU without bf16 units takes long
  batches=1 cases="pong-appo" seconds=10 warmup=10 sb3_envs=2 processes="1 2" act_seconds=4 act_warmup=8
  ingest="--workloads pong-appo --seconds 2 --producers 2" score=-20.5 score_minutes=1 lag_seconds=5 lag_warmup=10
else
  batches=5 cases="pong-sync pong-appo" seconds=60 warmup=15 sb3_envs=16 processes="1 2 4 8 14"
  act_seconds=8 act_warmup=10 ingest="--workloads pong-appo pong --seconds 6 --producers 8"
  score=18 score_minutes=${SCORE_MINUTES:-8} lag_seconds=${LAG_SECONDS:-40} lag_warmup=15
fi

{
  date -u
  echo "cores: $cores, device: $device"
  "$PYTHON" -c "import torch; print('torch', torch.__version__)"
  lscpu 2>/dev/null | grep -E "^(Model name|Socket|Core|Thread|CPU\(s\))" || true
  nvidia-smi 2>/dev/null || echo "(no nvidia-smi)"
} >"$OUT/machine.txt"

if runs learner; then
  echo "== learner ($device), at ${SECONDS} s"
  # shellcheck disable=SC2086  # the list of cases is meant to split
  "$PYTHON" benchmarks/learner.py --device "$device" --precision fp32 bf16 --peak --batches "$batches" \
    --compile none reduce-overhead --cases $cases 2>&1 | tee "$OUT/learner.txt" || failed+=" learner"
fi

if runs ingest; then
  echo "== ingest ($device), at ${SECONDS} s"
  # shellcheck disable=SC2086  # the options are meant to split
  "$PYTHON" benchmarks/ingest.py $ingest --learner --device "$device" 2>&1 | tee "$OUT/ingest.txt" || failed+=" ingest"
fi

if runs training; then
  echo "== training: rlfarm against SB3 ($device, $workers workers), at ${SECONDS} s"
  "$PYTHON" benchmarks/pong.py --preset pong-appo --preset pong --device "$device" --workers "$workers" \
    --skip-alone --seconds "$seconds" --warmup "$warmup" --sb3-envs "$sb3_envs" --sb3-subproc 2>&1 |
    tee "$OUT/pong.txt" || failed+=" pong"
fi

if runs acting; then
  echo "== acting on N processes, at ${SECONDS} s"
  # shellcheck disable=SC2086  # the list of process counts is meant to split
  "$PYTHON" benchmarks/acting_scale.py --processes $processes --seconds "$act_seconds" \
    --warmup "$act_warmup" --reference 2>&1 | tee "$OUT/acting.txt" || failed+=" acting"
fi

if runs lag; then
  echo "== policy lag: pong-fast and pong-fast-farm ($device, $workers workers), at ${SECONDS} s"
  "$PYTHON" benchmarks/pong.py --preset pong-fast --preset pong-fast-farm --skip-sb3 --skip-alone \
    --seconds "$lag_seconds" --warmup "$lag_warmup" --device "$device" --workers "$workers" 2>&1 |
    tee "$OUT/lag.txt" || failed+=" lag"
fi

if runs pong-to-score; then
  echo "== pong-fast-farm to $score ($device, $workers workers, at most $score_minutes min), at ${SECONDS} s"
  "$PYTHON" benchmarks/pong.py --to-score "$score" --minutes "$score_minutes" --preset pong-fast-farm \
    --skip-sb3 --device "$device" --workers "$workers" --out "$OUT/to-score" 2>&1 |
    tee "$OUT/to-score.txt" || failed+=" pong-to-score"
fi

echo "figures in $OUT/ after ${SECONDS} s"
if [ -n "$failed" ]; then
  echo "failed:$failed"
  exit 1
fi
