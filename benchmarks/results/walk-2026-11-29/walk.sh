#!/usr/bin/env bash
# A new user's first hour on a fresh clone of this repository, as typed from the README: as root without
# sudo, or (run as another user) as a user with sudo, who also types the test command's install line.
# Usage: REPO=/path/to/checkout bash walk.sh [DIR]   (output: DIR/record-<user>.txt; DIR default /tmp/walk-$USER)
set -u
dir=${1:-/tmp/walk-$(id -un)}; mkdir -p "$dir"
rec="$dir/record-$(id -un).txt"; : > "$rec"
step() {
  local name="$1"; shift; local t0; t0=$(date +%s.%N)
  echo "== $name: $*" >> "$rec"
  ( eval "$@" ) > "$dir/out.txt" 2>&1; local rc=$?
  echo "rc=$rc in $(python3 -c "print(f'{$(date +%s.%N) - $t0:.2f}')") s" >> "$rec"
  tail -n 6 "$dir/out.txt" | cut -c1-200 >> "$rec"
}
echo "user $(id -un) (uid $(id -u)), sudo: $(command -v sudo || echo none), $(date -u)" >> "$rec"
rm -rf "$dir/clone" && git clone -q "${REPO:-.}" "$dir/clone" && cd "$dir/clone" || exit 1
export RLFARM_HOME="$dir/home"
if [ "$(id -u)" -ne 0 ]; then  # the test command's first half, as typed (a user's sudo)
  step test-command-packages '$(command -v sudo) apt-get update && $(command -v sudo) apt-get install -y redis-server redis-sentinel docker-compose openssl iproute2 iptables'
fi
step first-command 'python3.11 -m venv .venv && .venv/bin/pip install -e ".[all]" && .venv/bin/rlfarm train --preset cartpole-ppo --run-id walk-ppo'
step quick-tier '.venv/bin/pip install -q -e ".[test]" && .venv/bin/python -m pytest -m unit -q -p no:cacheprovider'
source .venv/bin/activate
step runs 'rlfarm runs'
step eval 'rlfarm eval walk-ppo --episodes 5'
step plot 'rlfarm plot walk-ppo'
step bad-key 'rlfarm train --set ppo.learnin_rate=1'
step up 'rlfarm up -w 1 --listen 0.0.0.0'
step status 'rlfarm status'
rlfarm train --preset cartpole-ppo --total-steps 3000000 --set target_return=inf --run-id walk-load > "$dir/load.txt" 2>&1 &
load=$!
until grep -q "^step [1-9]" "$dir/load.txt" 2>/dev/null || ! kill -0 $load 2>/dev/null; do sleep 0.5; done
for i in 1 2 3; do step "status-under-load-$i" 'rlfarm status > /dev/null'; done
step ctrl-c "kill -INT $load; while kill -0 $load 2>/dev/null; do sleep 0.2; done; tail -n 2 $dir/load.txt"
step resume 'rlfarm train --resume walk-load --total-steps 200000 | tail -n 2'
step train-on-up 'rlfarm train --preset cartpole-ppo --mode async --total-steps 8192 --run-id walk-async'
step down 'rlfarm down'
step status-none 'rlfarm status'
# The walk's own processes only (their RLFARM_HOME): a developer's tests may run beside it.
step leftovers 'for p in $(pgrep -u "$(id -u)" -f "redis-server|celery|rlfarm"); do tr "\0" "\n" < /proc/$p/environ 2>/dev/null | grep -qx "RLFARM_HOME=$RLFARM_HOME" && ps -o pid=,args= -p $p; done; echo "(end of leftovers)"'
echo DONE >> "$rec"
