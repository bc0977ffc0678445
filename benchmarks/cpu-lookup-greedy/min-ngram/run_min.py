"""`treeflash ...` with lookup's shortest matched suffix set from $NGMIN (lookup.NGRAM_MIN, 1 in the engine):
how min-ngram/*.txt ran, e.g. NGMIN=3 python run_min.py bench --dataset humaneval ... (see ../README.md)."""
import os
import sys

import treeflash.lookup as L

L.NGRAM_MIN = int(os.environ.get("NGMIN", "1"))
from treeflash.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
