#!/bin/bash
# On an H200 reached through the device tool, with the DSL bundles of ../shared/gpu/make-bundles.sh unpacked in .gpu/
# (the CuTe bundle in a first call, the TIRx one in a second call while the machine is warm): grade the references the
# ledger does not vouch for (one grader for both DSLs, so a problem's baselines are timed once), then the kernel
# times of the problems whose variants all passed. Records land in $OUT; commit them under validation/ledger/ and
# validation/kernels/, and drop the validated entries from validation/awaiting-gpu.json.
#   usage: bash benchmarks/gpu_suite.sh TAG
set -o pipefail
. .gpu/activate.sh && export PYTHONPATH=src:$PYTHONPATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m metakernelbench validate --changed --record $OUT/ledger-$1.jsonl 2>&1 | tee $OUT/validate-$1.log
passing=$(python3 -c "
import json, collections
rows = [json.loads(l) for l in open('$OUT/ledger-$1.jsonl')] if __import__('os').path.exists('$OUT/ledger-$1.jsonl') else []
ok = collections.defaultdict(list)
for r in rows: ok[r['problem']].append(r['passed'])
print(','.join(p for p, v in ok.items() if all(v)))")
echo "timing kernels of: $passing"
[ -n "$passing" ] && timeout 200 python3 benchmarks/reference_roofline.py --problems "$passing" --out $OUT/kernels-$1.json 2>&1 | tail -45
