"""Where storage meets analysis: the products derived from a run's stored events (ledger, views, live status,
resume check, straggler report), built and kept through one analysis cache (services.derive.cache) per app, and
kept current in the background by the analyst."""
