#!/usr/bin/env bash
# Serve a simulator LLM with SGLang behind an OpenAI-compatible API, wait until it is healthy,
# and print the base URL for --config.simulator.base_url.
#
#   bash launch/serve_simulator.sh --model-path Qwen/Qwen2.5-72B-Instruct --tp 4
#   URL=$(bash launch/serve_simulator.sh --model-path /models/sim --port 30001 --detach)
#
# Options:
#   --model-path PATH   Hugging Face id or local directory (required)
#   --port N            default 30000
#   --tp N              tensor-parallel GPUs, default 1
#   --host ADDR         bind address, default 127.0.0.1 (0.0.0.0 to serve other machines)
#   --name NAME         served model name, default "simulator" (= config.simulator.model)
#   --wait-s N          give up if /health does not answer within N seconds, default 1800
#   --log FILE          server log, default logs/simulator_<port>.log in the checkout (git ignores logs/)
#   --detach            return once healthy and leave the server running (pid on stderr)
#   -- ARGS...          passed to sglang.launch_server unchanged
# Needs the serve extra: pip install -e .[serve]. $PYTHON selects the interpreter (default python).
set -euo pipefail

model_path="" port=30000 tp=1 host=127.0.0.1 name=simulator wait_s=1800 log="" detach=0
extra=()
while (($#)); do
  case "$1" in
    --model-path) model_path="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --tp) tp="$2"; shift 2 ;;
    --host) host="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --wait-s) wait_s="$2"; shift 2 ;;
    --log) log="$2"; shift 2 ;;
    --detach) detach=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "serve_simulator.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z "$model_path" ]]; then
  echo "serve_simulator.sh: --model-path is required (see --help)" >&2
  exit 2
fi
if [[ -z "$log" ]]; then
  log_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/logs"
  mkdir -p "$log_dir"
  log="$log_dir/simulator_${port}.log"
fi
python="${PYTHON:-python}"

"$python" -m sglang.launch_server --model-path "$model_path" --port "$port" --tp "$tp" \
  --host "$host" --served-model-name "$name" ${extra[@]+"${extra[@]}"} >"$log" 2>&1 &
pid=$!
stop() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
if ((detach == 0)); then trap 'stop; exit 130' INT TERM; fi

# A wildcard bind address is reached through the loopback interface.
probe_host="$host"
[[ "$host" == "0.0.0.0" || "$host" == "::" ]] && probe_host=127.0.0.1
health="http://${probe_host}:${port}/health"
echo "serve_simulator.sh: started sglang (pid $pid, log $log); waiting for $health" >&2
deadline=$((SECONDS + wait_s))
until curl -sf -o /dev/null --max-time 5 "$health"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "serve_simulator.sh: the server exited before becoming healthy; last log lines:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  if ((SECONDS >= deadline)); then
    echo "serve_simulator.sh: no answer from $health after ${wait_s}s; stopping (log: $log)" >&2
    stop
    exit 1
  fi
  sleep 1
done

echo "serve_simulator.sh: ready; run with --config.simulator.base_url=http://${probe_host}:${port}/v1" \
  "--config.simulator.model=${name}" >&2
echo "http://${probe_host}:${port}/v1"
if ((detach)); then
  echo "serve_simulator.sh: server left running as pid $pid (stop it with: kill $pid)" >&2
  exit 0
fi
wait "$pid"
