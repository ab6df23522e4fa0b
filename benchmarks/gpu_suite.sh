#!/bin/bash
# On an H200 reached through the device tool, with one DSL bundle of ../shared/gpu/make-bundles.sh unpacked in .gpu/:
# grade every reference of that DSL under the current grader (also those the ledger already vouches for, so a record
# made under an older grader is renewed), then time the kernels of the problems whose reference passed. One call per
# DSL, so each works on a fresh machine. Records land in $OUT; commit them under validation/ledger/ and
# validation/kernels/, then regenerate validation/awaiting-gpu.json (mkb validate --list-awaiting WHY).
#   usage: bash benchmarks/gpu_suite.sh TAG DSL [SECONDS]   (SECONDS: the whole call's limit, default 560)
set -o pipefail
tag=$1 dsl=$2 limit=${3:-560} started=$SECONDS
. .gpu/activate.sh && export PYTHONPATH=src:$PYTHONPATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout $((limit - 90)) python3 -m metakernelbench validate --dsl "$dsl" --record "$OUT/ledger-$tag-$dsl.jsonl" 2>&1 \
    | tee "$OUT/validate-$tag-$dsl.log"
passing=$(python3 -c "
import json, os
path = '$OUT/ledger-$tag-$dsl.jsonl'
rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
print(','.join(sorted({r['problem'] for r in rows if r['passed']})))")
left=$((limit - (SECONDS - started) - 10))
echo "timing kernels of: $passing (${left} s left)"
[ -n "$passing" ] && [ $left -gt 20 ] && timeout $left python3 benchmarks/reference_roofline.py --dsl "$dsl" \
    --problems "$passing" --out "$OUT/kernels-$tag-$dsl.json" 2>&1 | tail -45
