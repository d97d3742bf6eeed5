"""The Celery worker process of `keystone worker`, started through Celery's API.

    python -m keystone_web.worker --concurrency 2 [--loglevel INFO] [--hostname NAME@%h]
        [--beat --schedule FILE] [--pool prefork] [--without-gossip] [--without-mingle]
        [--without-heartbeat]

Not `celery -A keystone_web worker`: Celery's command line imports every one of its
subcommands at start, an interactive shell (prompt_toolkit, pygments) among them, ~9 MB in
each worker's process tree that no task uses (issue 18). The options are those of Celery's
`worker` command that Keystone uses, with the same meaning.
"""

from __future__ import annotations

import argparse
import sys

# Celery's log levels (any case), also what `keystone worker` and `keystone beat` accept.
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keystone_web.worker")
    parser.add_argument("--concurrency", type=int, required=True, help="pool processes")
    parser.add_argument("--loglevel", default="info", type=str.lower, choices=LOG_LEVELS)
    parser.add_argument("--hostname", help="node name; %%h expands to the host's name")
    parser.add_argument("--beat", action="store_true", help="also run beat (one per deployment)")
    parser.add_argument("--schedule", help="beat's state file")
    parser.add_argument("--pool", default="prefork", choices=("prefork", "threads", "solo"))
    for step in ("gossip", "mingle", "heartbeat"):
        parser.add_argument(f"--without-{step}", action="store_true")
    args = parser.parse_args(argv)

    from celery.utils.log import mlevel
    from celery.utils.nodenames import default_nodename, host_format

    from keystone_web.celery import app

    worker = app.Worker(
        hostname=host_format(default_nodename(args.hostname)),
        pool_cls=args.pool,
        loglevel=mlevel(args.loglevel),
        concurrency=args.concurrency,
        beat=args.beat,
        schedule_filename=args.schedule,  # None: the app's beat_schedule_filename
        without_gossip=args.without_gossip,
        without_mingle=args.without_mingle,
        without_heartbeat=args.without_heartbeat,
    )
    worker.start()
    return int(worker.exitcode or 0)


if __name__ == "__main__":
    sys.exit(main())
