#!/usr/bin/env bash
# Run one command on every worker of a Cloud TPU VM pod, the same way on each, so that
# jax.distributed starts one process per worker (rlver_jax.parallel.sharding.maybe_initialize_distributed).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/tpu_pod.sh --name TPU --zone ZONE [options] -- COMMAND [ARGS...]

Runs COMMAND on every worker of the Cloud TPU VM pod TPU (gcloud compute tpus tpu-vm ssh
--worker=all), after `cd REPO`, activating the virtual environment VENV and exporting
RLVER_MULTIHOST=1 (so the program calls jax.distributed.initialize) plus any --env pairs.
The checkout and the venv must already exist at the same path on every worker.
launch/train.py and launch/eval.py watch their run on each worker (rlver_jax/cli/watchdog.py):
when process 0 dies, every other worker ends with one line naming it and exit status 75
(restart the job), not JAX's abort (134 and a C++ stack).

Options:
  --name TPU        TPU VM name (default: $TPU_NAME)
  --zone ZONE       its zone (default: $TPU_ZONE)
  --project ID      Google Cloud project (default: gcloud's configured project)
  --repo DIR        checkout on the workers (default: ~/rlver_jax)
  --venv DIR        virtual environment on the workers (default: REPO/.venv)
  --env NAME=VALUE  export this on every worker (repeatable)
  --dry-run         print the gcloud command instead of running it
  -h, --help        this text

Example:
  launch/tpu_pod.sh --name my-v5e-16 --zone us-west4-a -- \
    python launch/train.py --config=configs/ppo_think.py --config.workdir=gs://bucket/run1
EOF
}

name="${TPU_NAME:-}"
zone="${TPU_ZONE:-}"
project=""
repo="~/rlver_jax"
venv=""
dry_run=0
envs=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) name="$2"; shift 2 ;;
    --zone) zone="$2"; shift 2 ;;
    --project) project="$2"; shift 2 ;;
    --repo) repo="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --env)
      [[ "$2" == *=* ]] || { echo "tpu_pod.sh: --env takes NAME=VALUE, got '$2'" >&2; exit 2; }
      envs+=("$2"); shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "tpu_pod.sh: unknown option '$1' (the command goes after --)" >&2; usage >&2; exit 2 ;;
  esac
done
if [[ -z "$name" || -z "$zone" ]]; then
  echo "tpu_pod.sh: set --name and --zone (or TPU_NAME and TPU_ZONE)" >&2; exit 2
fi
if [[ $# -eq 0 ]]; then
  echo "tpu_pod.sh: no command given after --" >&2; usage >&2; exit 2
fi
venv="${venv:-$repo/.venv}"

# The remote shell re-parses the string: quote every word, but leave a leading ~ of the two
# paths unquoted so it expands to the remote home directory.
tilde_quote() { if [[ "$1" == "~/"* ]]; then printf '~/%q' "${1#\~/}"; else printf '%q' "$1"; fi; }
remote="cd $(tilde_quote "$repo") && source $(tilde_quote "$venv")/bin/activate && export RLVER_MULTIHOST=1"
for kv in "${envs[@]+"${envs[@]}"}"; do
  remote+=" $(printf '%q' "$kv")"
done
remote+=" && exec"
for word in "$@"; do
  remote+=" $(printf '%q' "$word")"
done

cmd=(gcloud compute tpus tpu-vm ssh "$name" --zone "$zone" --worker=all --command "$remote")
if [[ -n "$project" ]]; then
  cmd+=(--project "$project")
fi
if [[ $dry_run -eq 1 ]]; then
  printf '%q ' "${cmd[@]}"; echo
else
  exec "${cmd[@]}"
fi
