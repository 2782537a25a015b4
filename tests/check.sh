# The checks of the shell test scripts (tests/test_tune.sh, test_recipe.sh,
# test_peers.sh source it from the repository root): pass and fail counters,
# a temporary directory $tmp removed at exit, and the helpers below.
pass=0; fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Record one check: name, then a command that must succeed (on failure the
# last 15 lines of its output are shown, indented).
check() {
  local name=$1; shift
  if "$@" >"$tmp/check.out" 2>&1; then pass=$((pass + 1)); else
    fail=$((fail + 1)); echo "FAIL - $name"; sed 's/^/    /' "$tmp/check.out" | tail -n 15; fi
}

# Whether text $1 matches the grep pattern $2.
has() { grep -q -- "$2" <<<"$1"; }

# Print the totals; succeed only when no check failed.
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; }
