"""Commands run by hand or by a job's epilogue, outside training: ``goodput sync``. Never imported by worker
code."""
