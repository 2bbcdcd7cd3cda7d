"""An entrypoint that reports what its replica process sees, for tests/training/test_fork_server.py:
a replica forked by the fork server must see what `python -m trainjob train` would."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from typing import Any

import numpy

from trainjob import runtime


def probe(ctx: runtime.TrainContext) -> Any:
    """Write what this process sees to the config's `report` file, then end as `then` says:
    `exit` (the config's `code`), or `wait` (until a signal ends it)."""
    config = ctx.config
    seen = {
        "pid": os.getpid(),
        "sid": os.getsid(0),
        "pgid": os.getpgid(0),
        "cwd": os.getcwd(),
        "argv": sys.argv[1:],
        "main": sys.modules["__main__"].__spec__.name if sys.modules["__main__"].__spec__ else None,
        "path_head": sys.path[:3],
        "env": {k: os.environ.get(k) for k in config["env_keys"]},
        "random": float(numpy.random.random()),
        "stdin": os.readlink("/proc/self/fd/0"),
        "sigterm_blocked": signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, []),
        "log_handlers": len(logging.getLogger().handlers),
        "tf_handlers": len(logging.getLogger("tensorflow").handlers),
    }
    print("probe: stdout line", flush=True)
    print("probe: stderr line", file=sys.stderr, flush=True)
    with open(config["report"], "w", encoding="utf-8") as out:
        json.dump(seen, out)
    if config["then"] == "wait":
        while True:
            time.sleep(0.1)
    sys.stdout.flush()
    os._exit(int(config["code"]))
