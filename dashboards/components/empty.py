"""The first thing a new user sees before any run exists: how to send events."""

from __future__ import annotations

from dash import dcc, html

_INSTRUMENT = '''import ingest_client as goodput

tracker = goodput.init()          # reads torchrun's env and GOODPUT_URL
tracker.resumed(start_step)       # 0 for a fresh start
for step in range(start_step + 1, total_steps + 1):
    with tracker.step(step):
        train_one_step()
tracker.finish("finished")'''


def no_runs_yet(api_url: str) -> html.Div:
    return html.Div(className="empty", children=[
        html.H2("No runs yet"),
        html.P("goodput shows where the GPU-hours of your training runs go. It has not received any event yet. "
               "Send some in one of these ways:"),
        html.Ol([
            html.Li([html.B("Try it with a simulated run"), " (a 16-rank job with failures and a straggler):",
                     html.Pre(f"goodput simulate --url {api_url} --ranks 16 --hours 1 --mtbf 1200 "
                              "--straggler-rank 3", className="code")]),
            html.Li([html.B("Instrument a training script"), (f" and point it at this collector "
                     f"(GOODPUT_URL={api_url}):"), html.Pre(_INSTRUMENT, className="code")]),
            html.Li([html.B("Or wrap your torchrun command"), " so restarts and the allocation are reported too:",
                     html.Pre("goodput launch -- torchrun --nproc-per-node 8 train.py", className="code")]),
        ]),
        html.P(["This page refreshes on its own. The API is documented at ",
                html.A("/docs", href=f"{api_url}/docs", target="_blank"), "."]),
        dcc.Markdown("", style={"display": "none"}),
    ])
