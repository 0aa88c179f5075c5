"""The run page's training curves: the job steps' loss, lr and step time from storage, the marks from the run's
current views (services.derive.views), shaped by services.analysis.curves."""

from __future__ import annotations

from services.analysis.curves import build_training_curves
from services.derive.cache import AnalysisCache
from services.derive.views import current_views
from services.errors import RunDetailPruned
from services.schemas.views import TrainingCurves
from services.storage.curves import load_curve_steps
from services.storage.runs import RunRow


def training_curves(analyses: AnalysisCache, run: RunRow) -> TrainingCurves:
    if run.detail_pruned_at is not None:
        raise RunDetailPruned(run.run_id, run.detail_pruned_at, "the training curves are read from its raw steps")
    views = current_views(analyses, run).views
    with analyses.engine.connect() as conn:
        job_steps = load_curve_steps(conn, run.pk)
    return build_training_curves(job_steps, views)
