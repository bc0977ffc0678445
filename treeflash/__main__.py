"""`python -m treeflash ...` runs the command line, like the `treeflash` script."""

import sys

from treeflash.cli import main

sys.exit(main())
