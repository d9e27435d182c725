#!/usr/bin/env bash
# Server designs side by side in one device call: serve_sweep.py's chit-chat part once per variant and round, the
# variants alternating within each round so that all see the same host (the GPU machine's host is shared). A
# variant is NAME "serve flags" "sweep arguments"; NAME@FOLDER serves with the code of another checkout, FOLDER
# holding it as `bertserve` with its front end built (an older design's server and front ends; the clients and the
# harness are this checkout's, serve_sweep.py --server_pythonpath). Each run's
# result goes into $OUT/gpu_h200_serving_ab.json (name -> list of serve_sweep's JSON, one per round) and its rates
# onto stdout.
# Usage on the GPU machine (after the rig's install stage):
#   ROUNDS=2 bench/gpu/serve_ab.sh NAME[@FOLDER] "serve flags" "sweep arguments" [NAME[@FOLDER] ...]...
# e.g. base@ab_base "--grpc_front_end_processes=4" "--no_swap --no_replay --rest_qps 0 --rates 4000,5000"
#      new "--grpc_front_end_processes=4" "--no_swap --no_replay --rest_qps 0 --rates 4000,5000"
set -uo pipefail
source gpu_rig/env.sh
variants=("$@")
for ((round = 1; round <= ${ROUNDS:-1}; round++)); do
  for ((i = 0; i + 2 < ${#variants[@]}; i += 3)); do
    spec=${variants[i]}; name=${spec%%@*}; folder=${spec#*@}
    read -r -a flags <<<"${variants[i + 1]}"; read -r -a sweep <<<"${variants[i + 2]}"
    server=()
    [[ $folder != "$spec" ]] && server=(--server_pythonpath "$folder")
    python3 bench/gpu/serve_sweep.py --part chitchat --out "$OUT/$name$round" --clients 6 "${server[@]}" \
      "${flags[@]/#/--serve_flag=}" "${sweep[@]}" >"$OUT/$name$round.log" 2>&1
    python3 - "$OUT/$name$round" "$name" "$OUT/gpu_h200_serving_ab.json" "$spec" <<'PY'
import glob, json, os, sys
folder, name, combined, spec = sys.argv[1:]
try:  # gpu_h200_serving_chitchat.json (cpu_... on a CPU dry run)
    result = json.load(open(min(glob.glob(os.path.join(folder, "*_serving_chitchat.json")), default=folder)))
except (OSError, ValueError) as exc:
    print(name, "no result:", exc)
    sys.exit()
result["variant"] = spec  # NAME@FOLDER: the code was FOLDER's ("commit" is this checkout's)
variants = json.load(open(combined)) if os.path.exists(combined) else {}
variants.setdefault(name, []).append(result)
json.dump(variants, open(combined, "w"), indent=1)
for row in result["sweep"]:
    print(name, row["offered_qps"], row["achieved_qps"], row["p50_ms"], row["p99_ms"], row["errors"],
          row.get("send_lag_p50_ms"), row.get("gpu", {}).get("util_mean_pct"))
print(name, "recovered", result.get("targets", {}).get("past_saturation", {}).get("recovered"))
PY
    rm -f "$OUT/$name$round"/*.png  # the JSON holds the rows; a device call returns a limited number of files
  done
done
