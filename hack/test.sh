#!/usr/bin/env bash
# `make test`'s tiers, in the order that keeps both CPUs busy:
#
#   1. tests/unit, while `hack/cluster.py preload` loads the built images into the node's image store
#      (a containerd of its own; after a runtime image rebuild, as on CI, its export and import take
#      minutes that the e2e session's start would otherwise wait for). Not niced: the e2e tier starts
#      when it is done, so it is on the suite's longest path (niced beside the integration tier's three
#      workers it took 364 s, 1,445 s beside a CPU hog, against 154 s alone);
#   2. tests/integration in the background, its output in $INTEGRATION_LOG (printed when it ends),
#      holding $TIER_LOCK for as long as it runs;
#   3. tests/e2e as soon as the preload is done: its modules wait on pods of a few hundred millicores
#      and on the autoscaler's windows more than they compute (the CPU was busy under half of that
#      tier's time alone), so the integration tier's compute fills that wait. The e2e modules marked
#      `quiet_node` (the autoscaler's closed loop, a burst learned and met, wall-clock bounds on the
#      node) run last and wait for $TIER_LOCK first: they time the node's CPU.
#
# Every tier runs even if one before it failed; the exit status is the first failure's. A tier that
# collects no test fails (pytest's 5). Arguments: the pytest options of each tier, from the Makefile.
#
# Usage: hack/test.sh PY "UNIT_OPTS" "INTEGRATION_OPTS" "E2E_OPTS"
set -u
PY=$1
UNIT_OPTS=$2
INTEGRATION_OPTS=$3
E2E_OPTS=$4
PRELOAD_LOG=.cache/logs/preload.log
INTEGRATION_LOG=.cache/logs/test-integration.log
TIER_LOCK=.cache/locks/integration-tier.lock
mkdir -p .cache/logs .cache/locks

rc=0
# The status of one tier: pytest's, with "no tests collected" (5) counted as a failure.
record() {
    local r=$1 tier=$2
    if [ "$r" -eq 5 ]; then
        echo "pytest collected no tests ($tier): failing" >&2
        r=1
    fi
    if [ "$rc" -eq 0 ]; then rc=$r; fi
}

"$PY" hack/cluster.py preload >"$PRELOAD_LOG" 2>&1 &
preload=$!
integration=
trap 'kill $preload $integration 2>/dev/null' EXIT

# shellcheck disable=SC2086  # the options are words
"$PY" -m pytest $UNIT_OPTS tests/unit
record $? tests/unit

# The lock is taken here and held by the integration pytest alone (fd 9 is inherited by it; its own
# children are started with close_fds), so it is free from the moment that pytest ends, however it ends.
exec 9>"$TIER_LOCK"
flock 9
echo "tests/integration runs beside tests/e2e; its output: $INTEGRATION_LOG (printed when it ends)"
# shellcheck disable=SC2086
"$PY" -m pytest $INTEGRATION_OPTS tests/integration >"$INTEGRATION_LOG" 2>&1 &
integration=$!
exec 9>&-

wait $preload || echo "image preload failed (the e2e session loads the images itself):" >&2
tail -n 4 "$PRELOAD_LOG" >&2
# shellcheck disable=SC2086
KUBEINFER_QUIET_NODE_LOCK=$TIER_LOCK "$PY" -m pytest $E2E_OPTS tests/e2e
e2e=$?

wait $integration
record $? tests/integration
integration=
echo
echo "===== tests/integration (ran beside tests/e2e; $INTEGRATION_LOG) ====="
cat "$INTEGRATION_LOG"
record $e2e tests/e2e
exit $rc
