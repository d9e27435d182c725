#!/usr/bin/env bash
# Server designs side by side in one device call: serve_sweep.py's chit-chat part once per variant, each with its
# own `bertserve serve` flags and sweep arguments; each variant's result goes into $OUT/gpu_h200_serving_ab.json
# (name -> serve_sweep's JSON) and its rates onto stdout.
# Usage on the GPU machine (after the rig's install stage):
#   bench/gpu/serve_ab.sh NAME "serve flags" "sweep arguments" [NAME "serve flags" "sweep arguments"]...
# e.g. base "--grpc_front_end_processes=4" "--no_swap --no_replay --rest_qps 0 --profile_s 0 --rates 2500,3000"
set -uo pipefail
source gpu_rig/env.sh
while (($# >= 3)); do
  name=$1; read -r -a flags <<<"$2"; read -r -a sweep <<<"$3"; shift 3
  python3 bench/gpu/serve_sweep.py --part chitchat --out "$OUT/$name" --clients 6 \
    "${flags[@]/#/--serve_flag=}" "${sweep[@]}" >"$OUT/$name.log" 2>&1
  python3 - "$OUT/$name/gpu_h200_serving_chitchat.json" "$name" "$OUT/gpu_h200_serving_ab.json" <<'PY'
import json, os, sys
path, name, combined = sys.argv[1:]
result = json.load(open(path))
variants = json.load(open(combined)) if os.path.exists(combined) else {}
variants[name] = result
json.dump(variants, open(combined, "w"), indent=1)
for row in result["sweep"]:
    print(name, row["offered_qps"], row["achieved_qps"], row["p50_ms"], row["p99_ms"], row["errors"])
PY
done
