#!/usr/bin/env bash
# `make test`: `make ready` (with the MPICH flavour's wheel) and the whole suite but the GPU environment's.
#
#   scripts/test-suite.sh FAST_MARKERS [PYTEST_ARGS...]     (MAKE, VENV and SYSTEM_DEPS from the Makefile)
#
# Lint and the tests that need only the workflow venv (FAST_MARKERS: `make test-fast`) start as soon as that venv
# and the system packages are in place, beside the rest of `make ready`: they keep one core busy, and
# ready's pip installs and compiles leave the second idle much of the time (benchmarks/README.md, Suite timings).
# Their output is held in a log and shown whole when they end. The other tests need what ready makes,
# and run after it. Exit status: the first failure of ready, the fast tests, the rest; pytest's 5 (no
# test selected, e.g. by a -k in PYTEST_ARGS) is not one for either part alone.
#
# The rest is cut short (pytest-timeout's session_timeout) SUITE_BUDGET_S seconds after this script began,
# default 88 minutes, as CI stops a job at 90: what ready and the fast tests took is counted, not assumed (570
# to 690 s before the slow session in the fresh-clone runs of 2026-12-01). pytest-timeout cuts between tests,
# so the test running at the cut ends first (its own limit still holds): the last module's tests take about 3
# minutes at most, and a cut session prints what failed and what was slow. The fast tests, and pytest run by hand,
# keep pyproject.toml's fixed 75 minutes.
set -uo pipefail
budget_s=${SUITE_BUDGET_S:-5280}
[[ $budget_s =~ ^[1-9][0-9]*$ ]] || { echo "test-suite.sh: SUITE_BUDGET_S='$budget_s'; allowed: whole seconds" >&2; exit 2; }
fast=${1:?FAST_MARKERS}
shift
make=${MAKE:-make}
venv_ready=${VENV:-.venv}/.containerbench-ready
system_deps=${SYSTEM_DEPS:-build/system-deps.done}
python=${VENV:-.venv}/bin/python
log=build/logs/tests/fast-beside-ready.txt
ready_ended=$(mktemp)
trap 'rm -f "$ready_ended"' EXIT
mkdir -p "$(dirname "$log")"

( "$make" --no-print-directory ready READY_ALSO=test-wheelhouses; echo $? > "$ready_ended" ) &
ready=$!

# Lint (seconds), then the fast tests, into one log; a lint finding fails the suite, after the tests ran.
run_fast() {
  "$make" --no-print-directory lint > "$log" 2>&1
  local lint_rc=$?
  "$python" -m pytest -m "$fast" "$@" >> "$log" 2>&1
  local tests_rc=$?
  ((lint_rc == 0)) || return "$lint_rc"
  return "$tests_rc"
}

# `make -q` answers 0 once both are made and up to date (a stale venv is being remade until then).
fast_rc=
until [[ -s $ready_ended ]]; do
  if "$make" --no-print-directory -q "$venv_ready" "$system_deps" 2>/dev/null; then
    run_fast "$@"
    fast_rc=$?
    break
  fi
  sleep 2
done
wait "$ready"
ready_rc=$(cat "$ready_ended")
if [[ -z $fast_rc ]] && ((ready_rc == 0)); then  # ready was faster than the polling: run them now
  run_fast "$@"
  fast_rc=$?
fi
if [[ -n $fast_rc ]]; then
  echo "== lint and the tests that need only the workflow venv, run beside make ready ($log) =="
  cat "$log"
fi
((ready_rc == 0)) || exit "$ready_rc"

session_s=$((budget_s - SECONDS))
((session_s > 60)) || session_s=60
echo "== the tests that need what ready made: cut short after ${session_s} s (SUITE_BUDGET_S=${budget_s}, ${SECONDS} s spent) =="
"$python" -m pytest -m "not gpu_env and not ($fast)" --session-timeout="$session_s" "$@"
rest_rc=$?
for rc in "$fast_rc" "$rest_rc"; do
  ((rc == 0 || rc == 5)) || exit "$rc"
done
((fast_rc == 5 && rest_rc == 5)) && exit 5
exit 0
