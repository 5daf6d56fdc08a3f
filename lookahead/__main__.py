"""`python -m lookahead` runs the `lookahead` console script."""
import sys

from .cli import main

sys.exit(main())
