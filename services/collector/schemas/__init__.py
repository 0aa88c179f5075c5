"""The API's wire models, one module per part: ingest (events in), runs (list, detail, ledger), views (the run
page), live (hang detection, preemption, checkpoint requests), resume (resume check), advice (the advice
engine's recommendations, stragglers), status (health, whoami), errors (the error envelope every route shares)."""
