"""The clock readings' upsert keeps each rank's row as the module's rules say, whatever arrives: random groups of
requests (later minutes, slow requests of earlier minutes, offsets said and not, leads of -0.0 and 0.0) against a
model of the rules in Python, after every group, on both databases; the same with two collector processes that each
leave out what cannot raise what they committed (`WrittenReadings`), which send fewer rows."""

from __future__ import annotations

import random

from sqlalchemy import Engine, text

from services.storage.clock_readings import ClockReadings, WrittenReadings, record_readings

KEYS = [(attempt, rank) for attempt in (0, 1) for rank in (-1, 0, 1, 2)]
# (window, lead, lead_prev, offset, offset_prev, received)
Row = tuple[int, float, float | None, float | None, float | None, float]


def _larger(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _model(row: Row | None, window: int, lead: float, offset: float | None, received: float) -> Row:
    if row is None:
        return window, lead, None, offset, None, received
    w, old_lead, lead_prev, old_offset, offset_prev, old_received = row
    if window > w:
        adjacent = window == w + 1
        return (window, lead, old_lead if adjacent else None, offset, old_offset if adjacent else None,
                max(old_received, received))
    if window == w and (lead > old_lead or (offset is not None and (old_offset is None or offset > old_offset))):
        return w, max(old_lead, lead), lead_prev, _larger(old_offset, offset), offset_prev, max(old_received, received)
    return row


def _request(rng: random.Random, received: float) -> ClockReadings:
    at = received - (65.0 if rng.random() < 0.1 else 0.0)  # one in ten took over a minute to arrive
    keys = rng.sample(KEYS, rng.randint(1, len(KEYS)))
    lead = {("run", a, r): rng.choice([rng.uniform(-5.0, 2.0), -0.0, 0.0]) for a, r in keys}
    offset = {key: rng.uniform(-1.0, 3.0) for key in lead} if rng.random() < 0.5 else {}
    return ClockReadings(window=int(at // 60.0), received_at=at, lead=lead, offset=offset)


def test_every_row_follows_the_rules_after_every_group(engine: Engine) -> None:
    _follow_the_rules(engine, [None])


def test_left_out_readings_leave_every_row_as_the_rules_say_and_fewer_are_sent(engine: Engine) -> None:
    everything = _follow_the_rules(engine, [None])
    left_out = _follow_the_rules(engine, [WrittenReadings(), WrittenReadings()])  # two processes, in turn
    assert left_out < 0.8 * everything


def _follow_the_rules(engine: Engine, processes: list[WrittenReadings | None]) -> int:
    """Random groups written by the processes in turn into a run of its own, the table checked against the model
    after every group; returns the rows sent."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM clock_readings"))
        conn.execute(text("DELETE FROM runs"))
        conn.execute(text("INSERT INTO runs (run_id, project, status, version, ledger_version) "
                          "VALUES ('clocks', 'default', 'running', 0, -1)"))
        pk = conn.execute(text("SELECT id FROM runs")).scalar_one()
    rng = random.Random(33)
    model: dict[tuple[int, int], Row] = {}
    received = 60.0 * 1_000_000
    sent = 0
    for n in range(150):
        group = []
        for _ in range(rng.randint(1, 4)):
            received += rng.uniform(0.0, 3.0)
            group.append(_request(rng, received))
        written = processes[n % len(processes)]
        owners = {(pk, a, rank): ("launch", a) for a, rank in KEYS}  # each attempt one launch attempt's
        with engine.begin() as conn:
            rows = record_readings(conn, [({"run": pk}, r) for r in group], written=written, owners=owners)
        if written is not None:
            written.committed(rows, owners)
        sent += len(rows)
        merged: dict[tuple[int, int], dict[int, tuple[float, float | None, float]]] = {}
        for r in group:  # a group's requests are merged per key and minute first, as record_readings does
            for (_, a, rank), lead in r.lead.items():
                seen = merged.setdefault((a, rank), {}).get(r.window)
                offset = r.offset.get(("run", a, rank))
                merged[(a, rank)][r.window] = (lead, offset, r.received_at) if seen is None else (
                    max(lead, seen[0]), _larger(offset, seen[1]), max(r.received_at, seen[2]))
        for key, windows in merged.items():
            for window in sorted(windows):
                model[key] = _model(model.get(key), window, *windows[window])
        with engine.connect() as conn:
            stored = {(a, rank): tuple(rest) for a, rank, *rest in conn.execute(text(
                "SELECT attempt, rank, window_index, lead_s, lead_prev_s, offset_s, offset_prev_s, received_at "
                "FROM clock_readings WHERE run_pk = :pk"), {"pk": pk})}
        assert stored == model
    assert len(model) == len(KEYS)
    return sent


def test_a_reading_is_sent_when_another_launch_attempt_holds_the_number_or_several_do() -> None:
    written = WrittenReadings()
    row = (1, 0, 3, 100, -0.5, 0.2, 6000.0)
    mine = {(1, 0, 3): ("a", 0)}
    written.committed([row], mine)
    lower = (1, 0, 3, 100, -0.7, 0.1, 6001.0)
    assert written.raising([lower], mine) == []
    assert written.raising([lower], {(1, 0, 3): ("b", 0)}) == [lower]  # numbered again: b's attempt is 0 now
    assert written.raising([lower], {(1, 0, 3): None}) == [lower]
    assert written.raising([(1, 0, 3, 101, -0.7, 0.1, 6060.0)], mine) != []  # a later minute
    written.clear()
    assert written.raising([lower], mine) == [lower]
