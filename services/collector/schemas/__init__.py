"""The API's wire models, one module per part: ingest (events in), runs (list, detail, ledger), views (the run
page), live (hang detection, preemption, checkpoint requests), resume (resume check), advice (checkpoint
interval, stragglers), status (health, whoami), errors (the error envelope every route shares)."""
