#!/usr/bin/env bash
# Every capability, [PASS]/[FAIL] per case, then "N passed, N failed, N skipped"; non-zero exit on failure.
# Uses the GPU when there is one (CUDA_VISIBLE_DEVICES is yours to set), else the CPU versions of the cases.
#   A KV cache quantization   B AWQ model        C bf16 vs AWQ vs AWQ without its config   D dtype
#   E tensor parallelism      F bf16 + int8 KV   G AWQ numerics                             H missing shard
# Usage: bash regression_test.sh [CASE ...]      (default: all)
cd "$(dirname "$0")"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(A B C D E F G H)
for case in "${cases[@]}"; do
  if [[ ! "$case" =~ ^[A-H]$ ]]; then
    sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'      # the header above: what each case is, and the usage
    [ "$case" = "--help" ] || [ "$case" = "-h" ] && exit 0
    echo "unknown case '$case': choose among A B C D E F G H" >&2
    exit 2
  fi
done
passed=0; failed=0; skipped=0
for case in "${cases[@]}"; do
  log=$(mktemp)
  python3 -m nanovllm.tools.regression "$case" >"$log" 2>&1
  status=$?
  line=$(grep -E '^\[(PASS|FAIL|SKIP)\]' "$log" | tail -1)
  case $status in
    0) passed=$((passed + 1)); echo "$line" ;;
    2) skipped=$((skipped + 1)); echo "${line:-[SKIP] $case}" ;;
    *) failed=$((failed + 1)); echo "${line:-[FAIL] $case: crashed}"; tail -5 "$log" | sed 's/^/    /' ;;
  esac
  rm -f "$log"
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
