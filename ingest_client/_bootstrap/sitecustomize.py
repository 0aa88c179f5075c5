"""goodput's interpreter-start hook, put first on a torchrun worker's PYTHONPATH by ``goodput launch``.

Python imports the first ``sitecustomize`` module on ``sys.path`` as it starts. This one runs any other
``sitecustomize`` further on the path first (the user's or the distribution's; its errors behave as without
goodput), then, in a torchrun worker only, ``ingest_client.worker.bootstrap``: the worker's ``attempt_start`` is
recorded before the script runs, so an attempt that dies in rendezvous, ``init_process_group`` or an import is
still seen. Every other process that inherits the path (the torchrun agent, the launcher, subprocesses of a
worker) returns after a few dictionary lookups. ``GOODPUT_BOOTSTRAP=0`` turns it off.
"""

import os
import sys


def _chain() -> None:
    """Import the next ``sitecustomize`` on ``sys.path``, as Python would have without this directory."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _is_worker(env: "os._Environ[str]") -> bool:
    # A torchrun worker (RANK and TORCHELASTIC_RESTART_COUNT are set for workers only), not a process that
    # inherited a worker's environment (GOODPUT_WORKER_PID names the worker that claimed its generation).
    if env.get("GOODPUT_BOOTSTRAP", "1").strip() == "0":
        return False
    if "RANK" not in env or "TORCHELASTIC_RESTART_COUNT" not in env:
        return False
    owner = env.get("GOODPUT_WORKER_PID")
    return owner is None or owner == str(os.getpid())


def _bootstrap() -> None:
    if not _is_worker(os.environ):
        return
    try:
        from ingest_client.worker.bootstrap import start_worker
    except Exception as exc:  # ingest_client not importable by this interpreter: say so once, never break it
        print(f"goodput: bootstrap skipped, cannot import ingest_client ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return
    start_worker()


try:
    _chain()
finally:
    _bootstrap()
