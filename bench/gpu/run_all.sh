#!/usr/bin/env bash
# The GPU machine's benchmarks, in about 3 minutes (the section caps add up to 5.7 minutes):
#   1. lora_h2d.py      host->GPU copies of LoRA weights by rank, pageable vs pinned; disk->host
#   2. peft_switch.py   PEFT load_adapter / set_adapter / forward costs on a 1B random model
#   3. router_latency.py the router's added latency at 500 req/s, on cores of its own
# Results go to $OUT (h2d.json, peft.json, router.json, env.txt, sections.txt,
# run_all.log, summary.txt); the summary table is printed at the end.
#
# On the machine, after carrying .whl/ (fastapi, uvicorn, pydantic, ... for the router):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && bash bench/gpu/run_all.sh
# Here (CPU smoke test): SMOKE=1 PYTHON=/path/to/python bash bench/gpu/run_all.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
case ":${PYTHONPATH:-}:" in *":$ROOT:"*) ;; *) export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$ROOT" ;; esac
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d /tmp/bench-gpu-XXXX)}
mkdir -p "$OUT"

main() {
: > "$OUT/sections.txt"
echo "== bench/gpu/run_all.sh  out=$OUT  python=$PY  PYTHONPATH=$PYTHONPATH  $(date -u +%FT%TZ)"

{
  echo "== nvidia-smi"
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,clocks.sm,power.limit --format=csv 2>&1
  nvidia-smi topo -m 2>&1 | head -20
  echo "== cpu"; nproc; lscpu 2>/dev/null | grep -E "Model name|Socket|NUMA node|Thread" ; free -g
  echo "== disk"; df -h /dev/shm /tmp "$ROOT" 2>&1
  echo "== python"
  "$PY" - <<'EOF' 2>&1
import importlib, sys
print(sys.version)
for name in ("torch", "transformers", "peft", "safetensors", "aiohttp", "uvloop", "fastapi",
             "starlette", "uvicorn", "pydantic", "httptools", "httpx", "anyio", "pandas",
             "pyarrow", "prometheus_client", "yaml", "placement"):
    try:
        mod = importlib.import_module(name)
        print(f"{name:18} {getattr(mod, '__version__', '?'):12} {getattr(mod, '__file__', '')}")
    except Exception as exc:
        print(f"{name:18} MISSING {type(exc).__name__}: {exc}")
try:
    import torch
    print("cuda", torch.version.cuda, "available", torch.cuda.is_available())
except Exception:
    pass
EOF
} > "$OUT/env.txt" 2>&1
grep -E "MISSING|^cuda |H200|NVIDIA" "$OUT/env.txt"

section() {  # section NAME CAP_SECONDS ARGS...
  local name=$1 cap=$2; shift 2
  local t0; t0=$(date +%s)
  echo; echo "== $name (cap ${cap} s)"
  timeout -k 10 "$cap" "$PY" "$@"
  local rc=$?
  local took=$(( $(date +%s) - t0 ))
  echo "== $name: rc=$rc in ${took} s"
  echo "$name rc=$rc ${took}s" >> "$OUT/sections.txt"
}

if [ "${SMOKE:-0}" = 1 ]; then
  section lora_h2d 120 bench/gpu/lora_h2d.py --device cpu --tiny --out "$OUT/h2d.json"
  section peft_switch 120 bench/gpu/peft_switch.py --device cpu --tiny --reps 5 --switch-reps 3 --out "$OUT/peft.json"
  section router_latency 120 bench/gpu/router_latency.py --rate 50 --seconds 5 --closed-seconds 2 --time-cap 100 --out "$OUT/router.json"
else
  section lora_h2d 90 bench/gpu/lora_h2d.py --time-cap 75 --out "$OUT/h2d.json"
  section peft_switch 130 bench/gpu/peft_switch.py --time-cap 110 --out "$OUT/peft.json"
  section router_latency 120 bench/gpu/router_latency.py --rate 500 --seconds 30 --time-cap 100 --out "$OUT/router.json"
fi

echo; echo "================ summary ================"
"$PY" bench/gpu/summary.py "$OUT" | tee "$OUT/summary.txt"
echo "results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
}

main 2>&1 | tee "$OUT/run_all.log"
