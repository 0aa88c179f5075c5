"""What runs inside every training process: the tracker and its hot path, the buffer, the spool and the flusher
that sends it, step and collective timing, exit hooks and the interpreter-start bootstrap.

Imports only :mod:`ingest_client.common` and :mod:`ingest_client.transport` of the client (never the launcher or
the tools). The launcher reuses the spool and the flusher for its own records."""
