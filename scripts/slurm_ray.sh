#!/usr/bin/env bash
# rlx on several nodes under Slurm: one Ray node per Slurm node, then `rlx fit` on the first one.
#   sbatch --nodes=2 --gpus-per-node=8 scripts/slurm_ray.sh            (from the project's folder, on a
#                                                                       filesystem every node sees)
# Extra arguments go to `rlx fit` (e.g. --preset configs/gpu/gsm8k_qwen2.5_0.5b.yaml).
#SBATCH --job-name=rlx
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
set -euo pipefail

nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
head=${nodes[0]}
port=6379
gpus_per_node=${SLURM_GPUS_ON_NODE:-8}
workers=$(( ${#nodes[@]} * gpus_per_node ))

srun --nodes=1 --ntasks=1 -w "$head" ray start --head --port=$port --block &
sleep 10
for node in "${nodes[@]:1}"; do
  srun --nodes=1 --ntasks=1 -w "$node" ray start --address="$head:$port" --block &
done
sleep 10

# the cluster stays up for the job; rlx joins it and leaves it running (Slurm ends it with the job)
srun --nodes=1 --ntasks=1 -w "$head" --overlap \
  rlx fit params.yaml -S resources.ray_address="$head:$port" -S resources.accelerator=GPU \
  -S resources.num_workers="$workers" "$@"
