#!/usr/bin/env bash
# A new user's first hour, as root without sudo, on a fresh clone of this repository: the README's
# commands (the first with a --run-id to name the run the later ones use). Output: record.txt.
set -u
rec=/tmp/walk/record.txt; : > $rec
step() { local name="$1"; shift; local t0=$(date +%s); echo "== $name: $*" >> $rec; ( eval "$@" ) > /tmp/walk/out.txt 2>&1; local rc=$?; local t1=$(date +%s); echo "rc=$rc in $((t1-t0)) s" >> $rec; tail -n 6 /tmp/walk/out.txt | cut -c1-200 >> $rec; }
rm -rf /tmp/walk/clone && git clone -q "${REPO:-.}" /tmp/walk/clone && cd /tmp/walk/clone
step first-command 'python3.11 -m venv .venv && .venv/bin/pip install -e ".[all]" && .venv/bin/rlfarm train --preset cartpole-ppo --run-id walk-ppo'
step quick-tier '.venv/bin/pip install -q -e ".[test]" && .venv/bin/python -m pytest -m unit -q -p no:cacheprovider'
source .venv/bin/activate
step presets 'rlfarm presets'
step runs 'rlfarm runs'
step eval 'rlfarm eval walk-ppo --episodes 5'
step plot 'rlfarm plot walk-ppo'
step bad-key 'rlfarm train --set ppo.learnin_rate=1'
step up 'rlfarm up -w 1'
step status 'rlfarm status'
step train-on-up 'rlfarm train --preset cartpole-ppo --mode async --total-steps 8192 --run-id walk-async'
step down 'rlfarm down'
step status-none 'rlfarm status'
echo DONE >> $rec
