"""``python -m trainjob.runtime train|data ...`` (the same as ``trainjob train|data``)."""

import sys

from trainjob.runtime import entry

_COMMANDS = {"train": entry.train_main, "data": entry.data_main}

if len(sys.argv) < 2 or sys.argv[1] not in _COMMANDS:
    print("usage: python -m trainjob.runtime {train,data} ...", file=sys.stderr)
    sys.exit(2)
sys.exit(_COMMANDS[sys.argv[1]](sys.argv[2:]))
