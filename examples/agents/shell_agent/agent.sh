#!/bin/sh
# A small, deterministic coding agent: reads its task, patches the bug it is asked about,
# runs the test suite and reports. Runs in the workspace Keystone prepared (a copy of this
# directory); the prompt arrives on stdin (also in $KEYSTONE_PROMPT).
set -u
export PYTHONDONTWRITEBYTECODE=1   # keep __pycache__ out of the workspace diff

prompt=$(cat)
echo "task: $prompt"

# SHELL_AGENT_RELEASE=2 is this agent's buggy release (the demo's regression): its patch step
# is skipped on every third replica, so the fix works two times in three (a flaky scenario).
case "$prompt" in
  *add*|*sum*|*bug*)
    if [ "${SHELL_AGENT_RELEASE:-1}" = 2 ] && [ $(( ${KEYSTONE_REPLICA:-0} % 3 )) = 2 ]; then
      echo "release 2: lost the patch"
    else
      echo "patching calculator.add"
      sed -i 's/return a - b/return a + b/' calculator.py
    fi
    ;;
  *)
    echo "nothing I know how to fix in that task"
    ;;
esac

if python -m unittest -q test_calculator 2>unittest.log; then
  summary="Fixed calculator.add; all tests pass."
  status=0
else
  summary="Tests still fail: $(tail -n 1 unittest.log)"
  status=1
fi
rm -f unittest.log
echo "$summary"
printf '%s\n' "$summary" > "${KEYSTONE_OUTPUT:-/dev/null}"
exit $status
