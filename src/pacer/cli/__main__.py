"""`python -m pacer.cli ...` runs the `pacer` command."""

import sys

from pacer.cli.main import main

sys.exit(main())
