"""`python -m shardflow.manifests [--check]`: regenerate (or check) the example manifests."""

import sys

from .examples import main

sys.exit(main())
