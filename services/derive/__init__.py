"""Where storage meets analysis: derived products of a run (ledger, views, live status, resume check,
stragglers) built from stored events, cached per run version, and kept current by the background analyst."""
