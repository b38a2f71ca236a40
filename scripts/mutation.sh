#!/usr/bin/env bash
# Mutation testing of the modules that guard a run (docs/reliability.md, "Mutation testing"). Not part
# of the test suite: it takes minutes on one core. mutmut (`pip install -e .[mutation]`) reads the
# [mutmut] section of setup.cfg, copies the project into mutants/ (git-ignored), and runs each mutant
# against the fast unit tests listed there that reach its function, one process at a time, forked from
# a server process (a plain fork of a process that ran torch and MuJoCo hung).
#
#   scripts/mutation.sh                    every guard below
#   scripts/mutation.sh signing lag        some of: signing snapshot lag ingest bounds
#
# Then the score per module: killed / mutants, and how many no unit test reaches ("no tests").
# `mutmut results` lists the survivors, `mutmut show NAME` shows one. Results are kept in mutants/:
# a second run tests only mutants of functions (or tests) that changed; remove mutants/ to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
MUTMUT=${MUTMUT:-mutmut}
PYTHON=${PYTHON:-python}

declare -A GUARDS=(
    [signing]="rlfarm.core.signing.*"
    # Snapshot restore: what reads a blob back and writes it into envs (capture, which only ever
    # saves the worker's own envs, is not a guard).
    [snapshot]="rlfarm.envs.snapshot.x_restore__mutmut_* rlfarm.envs.snapshot.x__restore_env__mutmut_* rlfarm.envs.snapshot.x__restore_layer__mutmut_* rlfarm.envs.snapshot.x__leaves__mutmut_* rlfarm.envs.snapshot.x__units__mutmut_* rlfarm.envs.snapshot.x__normal__mutmut_* rlfarm.envs.snapshot.x__same__mutmut_* rlfarm.envs.snapshot.x__same_unit__mutmut_* rlfarm.envs.snapshot.x__shape__mutmut_* rlfarm.envs.snapshot.x_configuration__mutmut_* rlfarm.envs.snapshot.xǁConfigurationǁcheck__mutmut_* rlfarm.envs.snapshot.x__restore_mjdata__mutmut_* rlfarm.envs.plain.x_unplain__mutmut_* rlfarm.envs.plain.x__restored__mutmut_* rlfarm.envs.plain.x__is_behaviour__mutmut_* rlfarm.envs.plain.x_restore_object__mutmut_* rlfarm.core.streams.x_decode__mutmut_* rlfarm.core.streams.x_resume__mutmut_*"
    # The lag bound lives in a large module: only its functions are mutated.
    [lag]="rlfarm.trainer.policy_lag.x_too_stale__mutmut_* rlfarm.trainer.policy_lag.x_auto_policy_lag__mutmut_* rlfarm.trainer.policy_lag.x_stale_result__mutmut_* rlfarm.trainer.policy_lag.x_line_lags__mutmut_*"
    [ingest]="rlfarm.trainer.ingest.*"
    [bounds]="rlfarm.sections.bounds.*"
)
wanted=("$@")
[ ${#wanted[@]} -eq 0 ] && wanted=(signing snapshot lag ingest bounds)
patterns=()
for guard in "${wanted[@]}"; do
    [ -n "${GUARDS[$guard]:-}" ] || { echo "no guard named $guard (one of: ${!GUARDS[*]})" >&2; exit 2; }
    read -ra more <<<"${GUARDS[$guard]}"
    patterns+=("${more[@]}")
done

"$MUTMUT" run --max-children 1 "${patterns[@]}"
"$MUTMUT" results --all true | "$PYTHON" scripts/mutation_scores.py "${patterns[@]}"
