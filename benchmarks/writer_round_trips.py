"""The group-commit writer's round trips to PostgreSQL per group, and what they cost with the database a network hop
away, in one run.

    python -m benchmarks.writer_round_trips [--groups 50] [--delay-ms 1]

Every group is what the writer commits under `benchmarks.requests`' load (benchmarks/writer_gil.py: 32 requests of
one 2-step `steps` record from one of 1,024 ranks), written by `write_batches` through one held connection, alone.
Counted: the driver's waits for the server's answer per group (psycopg's read waits: one per round trip, more when an
answer arrives in pieces or while a pipeline is read). Timed: each group's wall on a direct loopback connection (the
baseline) and through a proxy process that holds every chunk `--delay-ms` in each direction, as a database in another
rack or zone does; the difference divided by the proxy's round-trip delay is the round trips that waited on the
network. In production PostgreSQL is another machine, so each round trip of the writer costs its group that much.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import make_url

from benchmarks._common import free_port, machine, postgres_database
from benchmarks.writer_gil import RANKS, request_bodies, write_groups
from services.settings import ServiceSettings
from services.storage.db import make_engine, psycopg_connection
from services.storage.migrate import upgrade


class ReadWaits:
    """Counts the read waits of every psycopg connection (its `wait` patched for the duration)."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> ReadWaits:
        import psycopg
        from psycopg.waiting import Wait

        self._patched = psycopg.Connection
        self._original = original = psycopg.Connection.wait
        counter = self

        def counting(gen: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
            try:
                state = next(gen)
                while True:
                    if state in (Wait.R, Wait.RW):
                        counter.count += 1
                    state = gen.send((yield state))
            except StopIteration as done:
                return done.value

        def wait(conn: Any, gen: Generator[Any, Any, Any], *args: Any, **kwargs: Any) -> Any:
            return original(conn, counting(gen), *args, **kwargs)

        psycopg.Connection.wait = wait  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        self._patched.wait = self._original  # type: ignore[method-assign]


def _proxy(listen_port: int, target_port: int, delay_s: float, ready: Any) -> None:
    """Forward 127.0.0.1:listen_port to 127.0.0.1:target_port, each chunk `delay_s` late, in order."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    writer.close()
                    return
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(send())
        while data := await reader.read(65536):
            queue.put_nowait((time.monotonic() + delay_s, data))
        queue.put_nowait((0.0, b""))
        await sender

    async def connection(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer),
                             return_exceptions=True)

    async def main() -> None:
        server = await asyncio.start_server(connection, "127.0.0.1", listen_port)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


@contextmanager
def delaying_proxy(url: str, delay_s: float) -> Iterator[str]:
    """The database URL through a proxy process that holds every chunk `delay_s` in each direction."""
    parsed = make_url(url)
    port = free_port()
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    proxy = context.Process(target=_proxy, args=(port, parsed.port or 5432, delay_s, ready), daemon=True)
    proxy.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the delaying proxy did not start within 30 s")
        yield parsed.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    finally:
        proxy.kill()
        proxy.join(10)


def write_timed(url: str, groups: int, bodies: Iterator[bytes]) -> tuple[float, float]:
    """(wall s per group, read waits per group) over `groups` groups, after 10 that create the run and prepare."""
    engine = make_engine(url)
    try:
        settings = ServiceSettings()
        known_runs: dict[tuple[str, str], int] = {}
        with engine.connect() as conn:
            write_groups(conn, bodies, 10, settings, known_runs)
            with ReadWaits() as waits:
                wall, _ = write_groups(conn, bodies, groups, settings, known_runs)
        return wall, waits.count / groups
    finally:
        engine.dispose()


def round_trip_s(url: str, trips: int = 200) -> float:
    """Seconds of one `SELECT 1` on a held connection (the run's yardstick of a round trip)."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            raw = psycopg_connection(conn)
            raw.execute("SELECT 1")
            started = time.perf_counter()
            for _ in range(trips):
                raw.execute("SELECT 1")
            return (time.perf_counter() - started) / trips
    finally:
        engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=50, help="groups timed per condition")
    ap.add_argument("--delay-ms", type=float, default=1.0, help="the proxy's delay in each direction")
    ap.add_argument("--rounds", type=int, default=2, help="direct and delayed measured alternately, this many times")
    ap.add_argument("--ranks", type=int, default=RANKS,
                    help="ranks the requests come from in turn (32: every rank leaves its block of steps every 64 "
                         "groups, all in the same group, so the groups' moves are counted too)")
    args = ap.parse_args()
    bodies = request_bodies(time.time() - 3600, args.ranks)
    print(f"# the writer's round trips  ({machine()})")
    print(f"groups of 32 requests (one 2-step record each, from {args.ranks} ranks in turn), {args.groups} groups per "
          f"condition, PostgreSQL direct and through a proxy {args.delay_ms:g} ms each way")
    with postgres_database() as url:
        upgrade_engine = make_engine(url)
        upgrade(upgrade_engine)
        upgrade_engine.dispose()
        with delaying_proxy(url, args.delay_ms / 1000) as delayed_url:
            for round_ in range(1, args.rounds + 1):
                direct, waits = write_timed(url, args.groups, bodies)
                delayed, _ = write_timed(delayed_url, args.groups, bodies)
                hop = round_trip_s(delayed_url) - round_trip_s(url)  # what the proxy adds to a round trip
                print(f"round {round_}: {waits:.2f} read waits a group; wall direct {direct * 1e3:.1f} ms, "
                      f"delayed {delayed * 1e3:.1f} ms (x{delayed / direct:.2f}): "
                      f"{(delayed - direct) / hop:.1f} round trips of the proxy's {hop * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
