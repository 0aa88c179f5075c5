"""The simulator: a realistic event stream of a training job and the ledger it must produce (model.py), and
sending such a stream to a collector (send.py)."""

from services.simulate.model import RESUME_FAULTS, START_TIME, SimConfig, SimResult, Truth, simulate

__all__ = ["RESUME_FAULTS", "START_TIME", "SimConfig", "SimResult", "Truth", "simulate"]
