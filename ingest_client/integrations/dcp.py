"""``torch.distributed.checkpoint`` with only the blocking part timed as checkpoint.

    from ingest_client.integrations.dcp import AsyncCheckpointer

    checkpointer = AsyncCheckpointer(tracker)
    ...
    checkpointer.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, step=step,
                      checkpoint_id=f"ckpt/step-{step}")
    ...
    checkpointer.wait()  # before exiting: the last upload must finish

``save`` runs ``dcp.async_save`` inside ``tracker.checkpoint(step)``: the span is what the training loop waits for,
i.e. staging (the copy of the state to host memory; with a non-blocking stager, until its ``staging_completion``),
plus, if the previous checkpoint's upload is still running, the wait for it (the loop is blocked then too; DCP
allows one save in flight). The upload that runs while training continues is not blocking and not counted.
``checkpoint_id``s of uploads that never finished (the process died) are not loadable: resume from the last one
whose ``wait`` returned (``last_completed``). For a synchronous ``dcp.save``, ``with tracker.checkpoint(step):``
around it is all there is to it.

With ``AsyncCheckpointer(tracker, digests=True)``, ``save`` reports ``tracker.digest(step, state_digest(state_dict))``
before the checkpoint span (its durable start puts the digest on disk), and ``load`` (``dcp.load`` in place) reports
the resume with the digest of the state it loaded, by the same function: the resume check compares the two the
moment the resume happens::

    checkpointer = AsyncCheckpointer(tracker, digests=True)
    checkpointer.load(state, step=step, checkpoint_id=f"ckpt/step-{step}")   # tracker.resumed(step, ..., digest=)
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import torch.distributed.checkpoint as dcp

import ingest_client
from ingest_client.worker.tracker import Tracker


class AsyncCheckpointer:
    def __init__(self, tracker: Tracker, *, digests: bool = False) -> None:
        self._tracker = tracker
        self._digests = digests
        self._upload: Future[Any] | None = None
        self._upload_id: str | None = None
        self.last_completed: str | None = None

    def save(self, state_dict: dict[str, Any], *, step: int, checkpoint_id: str, **kwargs: Any) -> Future[Any]:
        """``dcp.async_save(state_dict, checkpoint_id=..., **kwargs)``, its blocking part timed at ``step``."""
        if self._digests and self._tracker.enabled:
            self._tracker.digest(step, ingest_client.state_digest(state_dict))
        with self._tracker.checkpoint(step):
            self.wait()
            response = dcp.async_save(state_dict, checkpoint_id=checkpoint_id, **kwargs)
            if isinstance(response, Future):
                upload = response
            else:  # a non-blocking stager: the state may change only once it is copied
                response.staging_completion.result()
                upload = response.upload_completion
        self._upload, self._upload_id = upload, str(checkpoint_id)
        return upload

    def load(self, state_dict: dict[str, Any], *, step: int, checkpoint_id: str, **kwargs: Any) -> None:
        """``dcp.load(state_dict, checkpoint_id=..., **kwargs)`` (in place), then ``tracker.resumed(step,
        checkpoint_step=step, checkpoint=checkpoint_id)``, with the loaded state's digest when digests are on."""
        dcp.load(state_dict, checkpoint_id=checkpoint_id, **kwargs)
        digest = ingest_client.state_digest(state_dict) if self._digests and self._tracker.enabled else None
        self._tracker.resumed(step, checkpoint_step=step, checkpoint=str(checkpoint_id), digest=digest)

    def wait(self) -> None:
        """Wait for the upload in flight, if any (raises its error)."""
        upload, self._upload = self._upload, None
        if upload is not None:
            upload.result()
            self.last_completed = self._upload_id
