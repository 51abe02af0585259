"""`python -m simserve ...` runs the command line (the same as the `simserve` script)."""
import sys

from simserve.cli import main

sys.exit(main())
