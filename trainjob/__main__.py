"""`python -m trainjob` is the `trainjob` command (used by rendered pods: `python -m trainjob train`)."""

import sys

from trainjob import cli

sys.exit(cli.main())
