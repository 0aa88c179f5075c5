"""goodput services: the collector, storage, the waste ledger and the tools around them."""
