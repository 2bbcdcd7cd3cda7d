"""`python -m trainjob` is the `trainjob` command; rendered pods run `python -m trainjob train`."""

import sys

from trainjob import cli

sys.exit(cli.main())
