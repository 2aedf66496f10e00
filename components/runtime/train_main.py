"""Launcher entry point for one training rank.

    torchrun --nproc_per_node 2 -m components.runtime.train_main --profile smoke
    deepspeed --num_gpus 8 --hostfile infra/deepspeed/hostfile --module components.runtime.train_main

Equivalent to ``agent-gspo train`` inside one process; the launcher sets RANK / WORLD_SIZE /
LOCAL_RANK / MASTER_ADDR / MASTER_PORT.
"""

import sys

import components  # noqa: F401  (offline defaults first)
from components.runtime.training_run import main

if __name__ == "__main__":
    sys.exit(main())
