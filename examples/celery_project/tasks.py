"""The project's jobs: a plain task, and one that must run once per scheduled run."""

import os

from app import app
from beat import IdempotentTask


@app.task
def ping(source: str) -> str:
    with open(os.environ.get("PING_LOG", "ping.log"), "a") as log:
        log.write(f"{source} {ping.request.id}\n")
    return source


@app.task(base=IdempotentTask)
def report() -> int:
    return 42
