"""What runs in ``goodput launch``, one process per node: the launch itself, the node relay and Slurm's view of
the job. Never imported by worker code."""
